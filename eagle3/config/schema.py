"""Typed schema behind every YAML under conf/, and the one home of every default.

The rule: **a key's default lives here (and in `server_schema`, the engines' nodes), next to its
type and comment; a YAML file under conf/ sets only what its option changes** (`model/kimi_k25.yaml`
the facts of Kimi-K2.5, `train/demo.yaml` the demo's batch sizes). A YAML value equal to the default here is a copy
that would drift, and `tests/unit/config/test_compose_and_validate.py` refuses one. Keys without a sensible default (a
model's path, its layer count) are MISSING: the chosen option must set them. Code reads the
composed config and never carries a fallback value of its own.

A field marked `run_field`/`speed_field`/`use_field` does not key the outputs its stages write
(`eagle3.config.slices`). The dataclasses are registered in Hydra's ConfigStore
(`registration.py`), so a misspelt key or a value of the wrong type fails at composition. Choices
are plain strings checked by the owning package's rules (all bad values reported at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import II, MISSING

from eagle3.config.server_schema import BenchConfig, ServeConfig, ServerConfig
from eagle3.config.slices import run_field, speed_field, use_field


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

    vocab_size: int = 32000
    hidden_size: Optional[int] = None
    fc_in_features: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    # Decoder layers; vLLM serves any number, SGLang one (eagle3.engines.ENGINE_MAX_DRAFT_LAYERS).
    num_layers: int = 1
    # Layer variants (eagle3.engines.LAYER_VARIANTS says what each does; vLLM serves all, SGLang all but
    # norm_before_residual: VARIANT_ENGINES; a draft is exported for those that serve it).
    # norm_before_residual follows the serving engine (eagle3.engines.SERVING_LAYER): on for vLLM (and
    # hf), off for SGLang.
    norm_before_residual: bool = II("eagle3_serving_layer:norm_before_residual,${server.backend}")
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    # The layer's attention (eagle3.draft.options.ATTENTIONS); mla's fields below: null = the target's.
    attention: str = "llama"
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
    dtype: str = "bfloat16"
    # Multimodal wrappers (Kimi-K2.5) nest the language model's config under this key.
    text_config_key: Optional[str] = None
    num_layers: int = MISSING
    hidden_size: int = MISSING
    vocab_size: int = MISSING
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

    track: str = MISSING  # target_native | prompt_only
    schema: str = MISSING  # see validate.DATASET_SCHEMAS
    hub_id: Optional[str] = None
    # Hub datasets: the commit (or tag) to read. None = the latest, pinned to the commit the first
    # run of a unit resolved (prep's `hub_revision.json`), so a resumed prep never mixes versions.
    revision: Optional[str] = None
    subset: Optional[str] = None
    split: str = "train"
    data_files: Optional[list[str]] = None  # local json / jsonl / parquet
    generator: Optional[str] = None  # demo_native | demo_prompts (built in the package)
    # generator demo_native: the target whose sampled answers it holds (conf/dataset/demo_native.yaml).
    answered_by: Optional[str] = None
    num_samples: Optional[int] = None  # None = all
    weight: float = use_field(1.0)  # mixture weight (merge stage)
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

    scale: Optional[int] = None  # total training samples after merge; None = everything
    eval_size: int = 16  # held-out samples, the same at every data scale
    max_len: int = 2048
    seed: int = II("seed")
    # A source (or mixture) that loses more than this share of its records at one stage (prep's
    # filters, generate, tokenize, ...) gets a WARNING line in that stage's summary; sampling
    # (num_samples, data.scale) is no loss. A stage that keeps none of a unit's records stops the job.
    warn_reject_fraction: float = 0.5


@dataclass
class PrepConfig:
    """Filters applied while mapping raw records to canonical conversations (stage prep)."""

    min_user_turns: int = 1
    max_user_turns: int = 64
    max_chars: int = 200_000  # whole conversation, all message text
    dedupe: bool = True  # by normalized prompt (all user turns)


@dataclass
class GeneratePartitionConfig:
    """Requests whose estimated prompt fits `max_context` tokens share `concurrency` slots.

    A request goes to the first partition (smallest `max_context`) it fits; null = no limit.
    Long prompts hold more KV cache, so they run at a lower concurrency (docs/design.md, 'Facts:
    published numbers': the plan regenerated <= 10K-token prompts at concurrency 150-200, longer
    ones in their own partition).
    """

    max_context: Optional[int] = None
    concurrency: int = 16


def _default_partitions() -> list[GeneratePartitionConfig]:
    return [GeneratePartitionConfig(max_context=10240, concurrency=192),
            GeneratePartitionConfig(max_context=None, concurrency=16)]


@dataclass
class GenerateHTTPConfig:
    """The client of OpenAI-compatible servers (generate.backend vllm | sglang) in stage generate.

    Only `chat_template_kwargs`, `thinking_keys` and `extra_body` change what is generated, so
    only they enter the output fingerprint; the rest says how fast and how stubbornly the client
    asks, and a resumed run may change it (more endpoints, another concurrency or timeout).
    """

    partitions: list[GeneratePartitionConfig] = speed_field(default_factory=_default_partitions)
    # false: a partition's concurrency is the total over all endpoints; true: per endpoint.
    concurrency_per_endpoint: bool = speed_field(False)
    endpoint_strategy: str = speed_field("least_busy")  # least_busy | round_robin
    # Prompt tokens are estimated as characters / chars_per_token (low = conservative).
    chars_per_token: float = speed_field(3.0)
    request_timeout_s: float = run_field(1800.0)  # whole request (non-streaming), attempts separately
    connect_timeout_s: float = run_field(30.0)
    max_attempts: int = run_field(6)  # per request; timeouts, connection loss, HTTP 429/5xx are retried
    backoff_s: float = run_field(1.0)  # exponential backoff base (with jitter), capped at max_backoff_s
    max_backoff_s: float = run_field(60.0)
    # Stop the run after this many requests in a row failed for good (the endpoints are down)
    # instead of sending the rest into a dead server. Failed conversations are never rejected:
    # they stay undone and the next run of the same command retries them. 0 = never stop.
    max_consecutive_failures: int = run_field(64)
    connect_wait_s: float = run_field(60.0)  # how long to wait at start for a first endpoint to answer
    # Batches regenerated at once (each advances turn by turn); null = enough to fill the
    # largest partition twice over.
    inflight_batches: Optional[int] = speed_field(None)
    model: Optional[str] = run_field(None)  # served model name; null = the first of the server's /v1/models
    # Sent as chat_template_kwargs; the source's thinking mode is added under each thinking key
    # (Kimi-K2.5 reads `thinking`, Qwen3-style templates `enable_thinking`).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking_keys: list[str] = field(default_factory=lambda: ["thinking", "enable_thinking"])
    extra_body: dict[str, Any] = field(default_factory=dict)  # more request fields, engine-specific
    # Seconds between stage generate's progress lines when no terminal watches (any backend; batch jobs)
    log_every_s: float = run_field(30.0)


@dataclass
class GenerateConfig:
    """Regeneration of prompt-only conversations through the target (stage generate)."""

    # hf = transformers in this process; vllm | sglang = an OpenAI-compatible server, `server` below.
    backend: str = "hf"
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    batch_size: int = 16
    max_user_turns: int = 8  # user turns answered per conversation
    # A response cut at max_new_tokens: keep it flagged (truncated=true) or drop the sample.
    length_policy: str = "keep_flagged"  # keep_flagged | drop
    # Copy batches that an earlier generate output of the same source ran under the same config
    # (a smaller num_samples: its sample is a prefix) instead of generating them again.
    reuse_earlier: bool = speed_field(True)
    # Client of the vLLM/SGLang server (generate.backend=vllm|sglang), launched or at generate.server.urls.
    http: GenerateHTTPConfig = field(default_factory=GenerateHTTPConfig)
    # The server of generate.backend=vllm|sglang: launched for the stage, or running at its `urls`
    # (conf/config.yaml composes server/cpu.yaml here: the engine generate.backend names, on this CPU;
    # on GPUs e.g. server@generate.server=sglang_h200). Apart from `server`, the engine that serves the
    # draft: data generated in one place is served in another.
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class TokenizeConfig:
    """Rendering with the (training) chat template and exact loss masks (stage tokenize)."""

    overlength: str = "truncate"  # truncate | drop   (limit: data.max_len)
    # A regenerated answer trains on the ids the target emitted (emitted), or on its text
    # re-encoded (reencoded: the pre-format-4 behaviour, to measure what the emitted ids change).
    answer_ids: str = "emitted"  # emitted | reencoded
    num_workers: int = 0  # 0 = one per CPU core
    chunk_size: int = 64  # conversations per worker task


@dataclass
class ExtractHTTPConfig:
    """The client of vLLM/SGLang servers that extract hidden states (extract.backend=vllm|sglang).

    Like generate's: requests concurrent, retried with exponential backoff on timeouts, lost
    connections and 429/5xx, a run stopped (resumable) once the server looks down.
    """

    concurrency: int = 8  # prompts in flight (the engine batches them itself)
    request_timeout_s: float = 600.0  # one prompt's prefill, per attempt
    max_attempts: int = 6
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    # Stop the run after this many prompts in a row failed for good: the server is down (rerun resumes).
    max_consecutive_failures: int = 16
    connect_wait_s: float = 60.0  # how long to wait at start for the server to answer
    # vLLM: the server writes a prompt's states to a file right after answering: how long to wait for it.
    file_wait_s: float = 120.0
    # Where the server writes those files; null = `<store>/.incoming` (same filesystem as the store).
    # With extract.server.urls it must be a directory the server and this job both see.
    exchange_dir: Optional[str] = None


@dataclass
class ExtractConfig:
    """Hidden states of the target: where they come from, and the store they go to."""

    # hf = transformers in this process (hooks on the capture layers); vllm = a vLLM server's
    # extract_hidden_states method; sglang = an SGLang server with eagle3's capture plugin
    # (extract.server: launched for the job, or running at its urls).
    backend: str = "hf"
    storage_format: str = "bf16"  # eagle3.states.formats.FORMATS (compact: int8 captures, the teacher's top k)
    batch_tokens: int = 8192
    shard: int = 0
    num_shards: int = 1
    disk_margin_gb: float = 5.0
    device_map: Optional[str] = None  # e.g. "auto" for multi-GPU
    # Shared by every mix and data scale (content-keyed), so it lives outside the stage units.
    store_root: str = "${paths.root}/hidden_states"
    # Print the disk estimate of the plan (no data, no model) and stop.
    dry_run: bool = False
    # Mean sample length the dry run and stage=plan assume until tokenize has measured it: with bf16
    # at Kimi's H=7168 (57,348 B/token) 1,600 tokens give 91.8 GB per 1K samples, the ~92 GB per 1K
    # the original effort measured.
    assumed_tokens_per_sample: int = 1600
    # Free bytes to assume instead of measuring the store's filesystem (planning, tests).
    assume_free_bytes: Optional[int] = None
    http: ExtractHTTPConfig = field(default_factory=ExtractHTTPConfig)
    # The server of extract.backend=vllm|sglang (conf/config.yaml composes server/cpu.yaml here, whose
    # engine follows extract.backend; it can differ from generate.server and from `server`, the engine
    # that serves). It runs the target in model.dtype.
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class OptimizerConfig:
    """Instantiated with hydra.utils.instantiate (swap the class via _target_) on the draft's
    named parameters. The default, eagle3.draft.optim.MuonAdamW (Muon on the weight matrices,
    AdamW on norms and lm_head), beat AdamW by 4.5% in simulated accept length at K=3 on the demo
    (2 seeds, docs/benchmarks-log.md "Draft quality against speculators"; today's recipe on two targets:
    BENCHMARKS.md "Draft recipe ablations"); torch.optim.AdamW is the other."""

    _target_: str = "eagle3.draft.optim.MuonAdamW"
    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.0


@dataclass
class TrainConfig:
    """Draft training (Lightning) with the training-time test."""

    # store = read the hidden states stage extract stored (every epoch reuses one extraction);
    # online = compute each batch's states from the target while training (extract.backend: hf in
    # this process, or a vllm/sglang server), nothing stored: no disk, but the target runs every epoch.
    # hybrid = online the first time a sample is fetched, written to the store extract would fill
    # (extract.storage_format), read from it afterwards (eagle3.states.hybrid).
    hidden_states: str = "store"
    # hybrid: the store's size cap in GB (decimal); samples past it are computed every epoch. null = no cap.
    hybrid_store_gb: Optional[float] = speed_field(None)
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    # What to do with positions whose target argmax is outside the draft vocab.
    out_of_vocab: str = "mask"  # mask | keep
    # Teacher distribution: draft_vocab (renormalised) | full_vocab (eagle3.draft.options.TEACHERS).
    teacher: str = "draft_vocab"
    loss: str = "kl"  # kl | tv | jsd | nla | lk (eagle3.draft.options.LOSSES)
    # decay = ttt_decay^k per step | dpace = per prediction, from its chain's acceptance (options.STEP_WEIGHTS)
    step_weights: str = "decay"
    # dpace: each step's acceptance a enters as (1 - s) a + s, so a chain the draft still misses keeps
    # weight on its later steps (speculators' --dpace-alpha, default 0.5; 0 = the raw derivative)
    dpace_smoothing: float = 0.5
    # Gaussian noise on the captured states while training, std = this x each captured layer's
    # per-token RMS (0 = none): the draft reads its own drifting features at serving time.
    state_noise: float = 0.0
    max_epochs: int = 1
    max_steps: int = -1
    batch_tokens: int = 8192
    # true = each step is one row of whole samples packed up to batch_tokens tokens (a longer sample is
    # a row of its own), no padding; TTT keeps attention and predictions within each sample
    # (eagle3.draft.packing). false = right-padded samples of similar length, batch_tokens padded tokens.
    packing: bool = False
    warmup_ratio: float = 0.03
    lr_schedule: str = "cosine"  # cosine | linear, after the warmup, down to min_lr_ratio x lr
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    # auto = bf16-mixed on GPUs and on CPUs with bf16 units (eagle3.draft.fit.resolve_precision), else 32-true
    precision: str = "auto"
    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # last.ckpt every N optimizer steps (and at each epoch end); a rerun resumes from it.
    checkpoint_every_n_steps: int = 50
    # Query rows per block of the TTT attention: peak score memory ~ block x seq_len per head.
    attention_block: int = 256
    # Draft-vocab logits kept for backward across a batch's TTT steps (GiB); the steps past it
    # recompute theirs in backward (one more head product each) instead of holding them.
    logits_memory_gb: float = speed_field(4.0)
    log_every_n_steps: int = run_field(10)
    # With no terminal on stderr: a progress line (step, loss, tok/s, time left) this often; 0 = per epoch.
    progress_every_s: float = run_field(30.0)
    eval_every_n_epochs: int = 1
    num_workers: int = run_field(0)
    export_dtype: str = "bfloat16"


@dataclass
class EvalConfig:
    """Draft evaluation: simulated acceptance on the eval split, real speculative decoding."""

    ks: list[int] = field(default_factory=lambda: [3, 5])  # draft tokens per verify step
    max_new_tokens: int = 128
    num_prompts: int = 16  # held-out prompts (first assistant turn of eval samples); 0 = skip
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
    target_tau: Optional[float] = None
    target_k: Optional[int] = None
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
    cpu_threads: Optional[int] = None
    # Longest wait for a unit or store lock another job holds (eagle3.artifacts.locks), then exit 3
    # naming the holder. Generous: a sweep job may rightly wait for another job's long extract.
    lock_timeout_s: float = 6 * 3600.0
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
