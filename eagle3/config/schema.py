"""Typed schema behind every YAML under conf/, and the one home of every default.

The rule: **a key's default lives here (and in `server_schema`, the engines' nodes, and `client_schema`,
generate's and extract's), next to its type, constraint and comment; a YAML file under conf/ sets only
what its option changes** (`model/kimi_k25.yaml` the facts of Kimi-K2.5, `train/demo.yaml` the demo's
batch sizes). A YAML value equal to the default here is a copy that would drift, and
`tests/unit/config/test_compose_and_validate.py` refuses one. Keys without a sensible default (a model's
path, its layer count) are MISSING: the chosen option must set them. Code reads the composed config
and never carries a fallback value of its own.

Each field is declared by the constructor that says which outputs it keys (`setting`, or
`run_field`/`speed_field`/`use_field`, which do not key them: `eagle3.config.slices`) and what is
valid: a choice (a `Literal` of `eagle3.config.choices`) or a range (`gt=0`, `ge=0, le=1`). Those
single-field checks are derived from the fields (`eagle3.config.fields.check_fields`), every bad
value reported at once; the `rules` modules of the domain keep only the rules across fields. The
dataclasses are registered in Hydra's ConfigStore (`registration.py`), so a misspelt key or a value
of the wrong type fails at composition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import II, MISSING

from eagle3.config.choices import (
    AnswerIds,
    Attention,
    DatasetSchema,
    Generator,
    HiddenStates,
    Loss,
    LrSchedule,
    OutOfVocab,
    Overlength,
    Precision,
    StepWeights,
    Strategy,
    Teacher,
    Track,
    TttChains,
)
from eagle3.config.client_schema import ExtractConfig, GenerateConfig
from eagle3.config.fields import run_field, setting, speed_field, use_field
from eagle3.config.server_schema import BenchConfig, ServeConfig, ServerConfig
from eagle3.dtypes import DTYPES


@dataclass
class PathsConfig:
    """Artifact locations. Relative paths are taken relative to the directory you run from."""

    # Every stage writes under ${paths.root}/<stage>/<name>-<fingerprint>/ (default: the checkout's outputs/).
    root: str = "${eagle3_project_root:}/outputs"
    hf_cache: Optional[str] = None


@dataclass
class DraftGeometryConfig:
    """Shape of the EAGLE-3 draft; unset fields follow the target.

    `fc_in_features` is written out explicitly in model configs because it is the number a
    serving engine checks against the captured states: it must be len(capture_layers) * hidden
    (`model=auto` derives it so). `vocab_size` is the default `model=auto` caps at the target's.
    """

    vocab_size: int = setting(32000, gt=0)
    hidden_size: Optional[int] = None
    fc_in_features: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    # Decoder layers; vLLM serves any number, SGLang one (eagle3.engines.ENGINE_MAX_DRAFT_LAYERS).
    num_layers: int = setting(1, gt=0)
    # Layer variants (eagle3.engines.LAYER_VARIANTS says what each does; vLLM serves all, SGLang all but
    # norm_before_residual: VARIANT_ENGINES; a draft is exported for those that serve it).
    # norm_before_residual and fc_norm follow the serving engine (eagle3.engines.SERVING_LAYER):
    # norm_before_residual on for vLLM (and hf), off for SGLang; fc_norm on for all, off when
    # norm_before_fc is set (the two exclude each other).
    norm_before_residual: bool = II("eagle3_serving_layer:norm_before_residual,${server.backend}")
    norm_before_fc: bool = False
    fc_norm: bool = II("eagle3_serving_layer:fc_norm,${server.backend},${.norm_before_fc}")
    norm_output: bool = False
    # The layer's attention (eagle3.draft.options says what each is); mla's fields below: null = the target's.
    attention: str = setting("llama", Attention)
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None


@dataclass
class ModelConfig:
    """The target model and the draft geometry derived from it.

    `model=auto` (conf/model/auto.yaml) needs only `path`: name, layer count, widths, capture
    layers and the draft's fc and vocab are derived from the checkpoint's config.json
    (`eagle3.config.registration.checkpoint_value`); the other options spell them out.
    """

    name: str = MISSING
    path: str = MISSING  # hub id or local directory
    revision: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = setting("bfloat16", DTYPES)
    # Multimodal wrappers (Kimi-K2.5) nest the language model's config under this key.
    text_config_key: Optional[str] = None
    num_layers: int = setting(MISSING, gt=0)
    hidden_size: int = setting(MISSING, gt=0)
    vocab_size: int = setting(MISSING, gt=0)
    # Capture index i = residual stream entering decoder layer i = HF hidden_states[i].
    capture_layers: list[int] = MISSING
    # Template used for training renders (keeps reasoning on every assistant turn); None = the
    # tokenizer's own.
    training_chat_template: Optional[str] = None
    reasoning_parser: Optional[str] = None
    tool_call_parser: Optional[str] = None
    thinking: bool = True
    geometry_from_checkpoint: bool = run_field(False)  # model=auto: the geometry above is read from config.json
    draft: DraftGeometryConfig = field(default_factory=DraftGeometryConfig)


@dataclass
class DatasetSourceConfig:
    """One raw dataset: where it comes from, its schema, and which track it belongs to."""

    track: str = setting(MISSING, Track)
    schema: str = setting(MISSING, DatasetSchema)  # eagle3.data.adapters reads each
    hub_id: Optional[str] = None
    # Hub datasets: the commit (or tag) to read. None = the latest, pinned to the commit the first
    # run of a unit resolved (prep's `hub_revision.json`), so a resumed prep never mixes versions.
    revision: Optional[str] = None
    subset: Optional[str] = None
    split: str = "train"
    data_files: Optional[list[str]] = None  # local json / jsonl / parquet
    generator: Optional[str] = setting(None, Generator)  # built in the package (eagle3.demo.datasets)
    # generator demo_native: the target whose sampled answers it holds (conf/dataset/demo_native.yaml).
    # Stage demo_data keys its output by that target's identity (its bytes, not its path), and prep by
    # demo_data's output: a checkout elsewhere, whose demo target lies at another path, reuses the chain.
    answered_by: Optional[str] = use_field(None)
    num_samples: Optional[int] = setting(None, gt=0)  # None = all
    weight: float = use_field(1.0, ge=0)  # mixture weight (merge stage)
    streaming: bool = False
    # Adapter column names, for schemas whose columns vary between releases.
    columns: dict[str, str] = field(default_factory=dict)
    # Thinking mode used when regenerating this source's responses (prompt_only track).
    thinking: bool = use_field(True)
    description: str = run_field("")


@dataclass
class DatasetConfig:
    """A named mixture of sources (a single dataset is a mixture of one).

    `files` (dataset=files, or added to any dataset) lists local files that become one source
    each, named after the file, with the settings below; `eagle3.data.detect.with_file_sources`
    does it when the config is validated, so every rule and stage sees ordinary sources.
    """

    name: str = MISSING
    sources: dict[str, DatasetSourceConfig] = field(default_factory=dict)
    # Local .jsonl/.json/.parquet files; relative paths are taken from where you run the job.
    files: Optional[list[str]] = None
    track: Optional[str] = None  # every file's track: target_native | prompt_only (required with files)
    schema: Optional[str] = None  # every file's schema; None = each file's is detected from its first records
    columns: dict[str, str] = field(default_factory=dict)  # with `schema`: adapter column renames
    num_samples: Optional[int] = None  # per file; None = the source's default
    thinking: Optional[bool] = None  # None = the source's default


@dataclass
class DataConfig:
    """Knobs shared by the data stages."""

    scale: Optional[int] = setting(None, gt=0)  # total training samples after merge; None = everything
    # Held-out samples, the same at every data scale. Validation, coverage_eval and eval's acceptance all read
    # the eval split: over 0 samples they would report 1.0 made of nothing.
    eval_size: int = setting(16, ge=1, why="the eval split feeds every accept-length and coverage figure; with no "
                             "samples they would be numbers made of nothing", valid=">= 1 (e.g. 16)")
    max_len: int = setting(2048, gt=0)
    seed: int = II("seed")
    # A source (or mixture) that loses more than this share of its records at one stage (prep's
    # filters, generate, tokenize, ...) gets a WARNING line in that stage's summary; sampling
    # (num_samples, data.scale) is no loss. A stage that keeps none of a unit's records stops the job.
    warn_reject_fraction: float = setting(0.5, ge=0, le=1, why="a share of a source's records",
                                          valid="[0, 1] (0 = warn on any loss, 1 = never)")


@dataclass
class PrepConfig:
    """Filters applied while mapping raw records to canonical conversations (stage prep)."""

    min_user_turns: int = setting(1, gt=0)
    max_user_turns: int = 64
    max_chars: int = setting(200_000, gt=0)  # whole conversation, all message text
    dedupe: bool = True  # by normalized prompt (all user turns)


@dataclass
class TokenizeConfig:
    """Rendering with the (training) chat template and exact loss masks (stage tokenize)."""

    overlength: str = setting("truncate", Overlength)  # limit: data.max_len
    # A regenerated answer trains on the ids the target emitted (emitted), or on its text
    # re-encoded (reencoded: the pre-format-4 behaviour, to measure what the emitted ids change).
    answer_ids: str = setting("emitted", AnswerIds)
    num_workers: int = setting(0, ge=0, valid=">= 0 (0 = all cores)")
    chunk_size: int = setting(64, gt=0)  # conversations per worker task


@dataclass
class OptimizerConfig:
    """Instantiated with hydra.utils.instantiate (swap the class via _target_) on the draft's
    named parameters. The default, eagle3.draft.optim.MuonAdamW (Muon on the weight matrices,
    AdamW on norms and lm_head), beat AdamW by 4.5% in simulated accept length at K=3 on the demo
    (2 seeds, docs/benchmarks-log.md "Draft quality against speculators"; today's recipe on two targets:
    BENCHMARKS.md "Draft recipe ablations"); torch.optim.AdamW is the other."""

    _target_: str = "eagle3.draft.optim.MuonAdamW"
    lr: float = setting(3e-4, gt=0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = setting(0.0, ge=0)


@dataclass
class TrainConfig:
    """Draft training (Lightning) with the training-time test."""

    # store = read the hidden states stage extract stored (every epoch reuses one extraction);
    # online = compute each batch's states from the target while training (extract.backend: hf in
    # this process, or a vllm/sglang server), nothing stored: no disk, but the target runs every epoch.
    # hybrid = online the first time a sample is fetched, written to the store extract would fill
    # (extract.storage_format), read from it afterwards (eagle3.states.hybrid).
    hidden_states: str = setting("store", HiddenStates)
    # hybrid: the store's size cap in GB (decimal); samples past it are computed every epoch. null = no cap.
    hybrid_store_gb: Optional[float] = speed_field(None, gt=0)
    ttt_steps: int = setting(7, gt=0)
    ttt_decay: float = setting(0.8, gt=0, le=1, why="weights decay^k must shrink or stay")
    # What to do with positions whose target argmax is outside the draft vocab.
    out_of_vocab: str = setting("mask", OutOfVocab)
    # Teacher distribution: draft_vocab (renormalised) | full_vocab (eagle3.draft.options says what each is).
    teacher: str = setting("draft_vocab", Teacher)
    loss: str = setting("kl", Loss)
    # decay = ttt_decay^k per step | dpace = per prediction, from its chain's acceptance (eagle3.draft.options)
    step_weights: str = setting("decay", StepWeights)
    # dpace: each step's acceptance a enters as (1 - s) a + s, so a chain the draft still misses keeps
    # weight on its later steps (speculators' --dpace-alpha, default 0.5; 0 = the raw derivative)
    dpace_smoothing: float = setting(0.5, ge=0, le=1, why="a step's acceptance a enters D-PACE as (1 - s) a + s")
    # all = every TTT step trains every chain | on_policy = a step trains only the chains whose drafted
    # tokens so far were the data's (the draft's own inputs) | rescored = every step reads the draft's own
    # tokens, scored by the target loaded beside the draft (eagle3.draft.options)
    ttt_chains: str = setting("all", TttChains)
    # Gaussian noise on the captured states while training, std = this x each captured layer's
    # per-token RMS (0 = none): the draft reads its own drifting features at serving time.
    state_noise: float = setting(0.0, ge=0, lt=10, why="noise std as a multiple of the states' RMS")
    max_epochs: int = 1
    max_steps: int = -1
    batch_tokens: int = setting(8192, gt=0)
    # true = each step is one row of whole samples packed up to batch_tokens tokens (a longer sample is
    # a row of its own), no padding; TTT keeps attention and predictions within each sample
    # (eagle3.draft.packing). false = right-padded samples of similar length, batch_tokens padded tokens.
    packing: bool = False
    warmup_ratio: float = setting(0.03, ge=0, lt=1, why="a fraction of the steps")
    # After the warmup, down to min_lr_ratio x lr.
    lr_schedule: str = setting("cosine", LrSchedule)
    min_lr_ratio: float = setting(0.1, ge=0, le=1, why="the final LR as a fraction of train.optimizer.lr")
    grad_clip: float = setting(1.0, ge=0, valid=">= 0 (0 = off)")
    # auto = bf16-mixed on GPUs and on CPUs with bf16 units (eagle3.draft.fit.resolve_precision), else 32-true
    precision: str = setting("auto", Precision)
    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = setting("auto", Strategy)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # last.ckpt every N optimizer steps (0: at each epoch end instead; Lightning takes one or the
    # other); a rerun resumes from it, redoing at most the steps since.
    checkpoint_every_n_steps: int = setting(50, ge=0, valid=">= 0 (0 = at epoch ends only)")
    # Query rows per block of the TTT attention: peak score memory ~ block x seq_len per head.
    attention_block: int = setting(256, gt=0)
    # Draft-vocab logits kept for backward across a batch's TTT steps (GiB); the steps past it
    # recompute theirs in backward (one more head product each) instead of holding them.
    logits_memory_gb: float = speed_field(4.0, ge=0, valid=">= 0 (0 = recompute every TTT step's logits)")
    log_every_n_steps: int = run_field(10, gt=0)
    # With no terminal on stderr: a progress line (step, loss, tok/s, time left) this often; 0 = per epoch.
    progress_every_s: float = run_field(30.0, ge=0, valid=">= 0 (0 = one line per epoch)")
    eval_every_n_epochs: int = setting(1, gt=0)
    num_workers: int = run_field(0, ge=0, valid=">= 0 (0 = load in the training process)")
    export_dtype: str = setting("bfloat16", DTYPES)


@dataclass
class EvalConfig:
    """Draft evaluation: simulated acceptance on the eval split, real speculative decoding."""

    ks: list[int] = field(default_factory=lambda: [3, 5])  # draft tokens per verify step
    max_new_tokens: int = setting(128, gt=0)
    # Held-out prompts (first assistant turn of eval samples); 0 = skip.
    num_prompts: int = setting(16, ge=0, valid=">= 0 (0 = skip real decoding)")
    check_lossless: bool = True


@dataclass
class ReportConfig:
    """Stage report: the table and plots of a sweep, from its jobs' job.json files and manifests."""

    # A sweep directory, or its name under ${paths.root}/multirun; null = the newest sweep there.
    sweep_dir: Optional[str] = None
    # x axis of the accept-length plot: null = data.scale (else the first varying override), an
    # override key that varies across the sweep's jobs, or "job" (job numbers).
    x: Optional[str] = None
    # The accept length to reach: the data-scale curve (fitted over the sweep's jobs) says how many
    # training samples reach it and what they cost; null = no target. At `target_k` draft tokens
    # (null = the largest K the jobs evaluated).
    target_tau: Optional[float] = setting(None, gt=1, why="an accept length is more than 1 (the target's own token "
                                          "counts)", valid="a number > 1, e.g. 3.5, or null")
    target_k: Optional[int] = setting(None, ge=1, why="K counts draft tokens",
                                      valid="an evaluated K >= 1, or null (the largest)")
    # The recipe the seed-pooled rows are compared with, as the report labels it (the varying overrides
    # other than the seed, e.g. "variant=baseline"); null = the sweep's first recipe.
    baseline: Optional[str] = None


@dataclass
class Eagle3Config:
    """The whole composed config; `stage` picks what `scripts/run.py` runs."""

    stage: str = "all"
    force: bool = False  # redo stages whose outputs are already complete
    seed: int = 0
    # Intra-op threads of this job's torch ops (and OMP_NUM_THREADS for what it starts); null =
    # the cores divided by the jobs the launcher runs at once (joblib's n_jobs; eagle3.threads).
    cpu_threads: Optional[int] = setting(None, gt=0)
    # Longest wait for a unit or store lock another job holds (eagle3.artifacts.locks), then exit 3
    # naming the holder. Generous: a sweep job may rightly wait for another job's long extract.
    lock_timeout_s: float = setting(6 * 3600.0, gt=0)
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prep: PrepConfig = field(default_factory=PrepConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    # Lightning logger, instantiated from its _target_; typed by the per-option schemas in
    # logger_schema.py (None = no logger).
    logger: Any = None
