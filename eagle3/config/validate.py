"""Cross-field rules checked before any stage does work.

Each rule appends one line `key: bad value -- why; valid: ...` (`eagle3.config.checks`) so a
user sees every mistake in one run. The rules encode the failures that cost real projects weeks
(docs/design.md, 'Facts the code relies on'): an EAGLE server flag with an EAGLE-3 draft, capture
ids off by one or out of range, an fc layer whose input width does not match the captured states,
kernels that do not exist on sm120. The server rules live with the servers (`eagle3.serving.rules`),
a stage's own rules are registered with it (`eagle3.stages`), and every list of valid choices is
imported from the torch-free module that acts on it, so a new choice is added in one place.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

# Each list of valid choices is imported from the module that acts on it (all torch-free).
from eagle3.config.checks import ConfigErrors
from eagle3.config.secrets import SECRET_KEY_RE, find_secrets  # noqa: F401  (SECRET_KEY_RE: re-exported)
from eagle3.config.store import DerivedValueError, resolution_cause
from eagle3.config_dict import config_dict
from eagle3.data.adapters import ADAPTERS
from eagle3.data.conversation import TRACKS
from eagle3.data.detect import files_sources
from eagle3.data.loading import SUPPORTED_SUFFIXES, file_kind
from eagle3.data.render import OVERLENGTH_POLICIES
from eagle3.demo.datasets import GENERATORS
from eagle3.draft.geometry import config_refusals
from eagle3.draft.options import (
    HIDDEN_STATE_MODES,
    LOSSES,
    LR_SCHEDULES,
    OUT_OF_VOCAB_POLICIES,
    PRECISIONS,
    STRATEGIES,
    TEACHERS,
)
from eagle3.dtypes import DTYPES
from eagle3.extract import BACKENDS as EXTRACT_BACKENDS
from eagle3.extract.formats import FORMATS as STORAGE_FORMATS
from eagle3.generation.http_settings import ENDPOINT_STRATEGIES
from eagle3.generation.openai_chat import RESERVED_BODY_FIELDS
from eagle3.generation.regenerate import LENGTH_POLICIES
from eagle3.serving.engines import ENGINES, SERVER_BACKENDS, VLLM
from eagle3.serving.rules import check_server
from eagle3.target_info import HF_CONFIG_KEYS, TargetConfigError, target_config

#: A stage's own rules, run when that stage is the one asked for (`eagle3.stages` registers them).
StageRules = Callable[[DictConfig, ConfigErrors], None]


def _check_model(model: DictConfig, err: ConfigErrors, hf_cache: Optional[str] = None) -> None:
    err.choice("model.dtype", model.dtype, DTYPES)
    err.positive("model.num_layers", model.num_layers)
    err.positive("model.hidden_size", model.hidden_size)
    err.positive("model.vocab_size", model.vocab_size)
    _check_draft_geometry(model, err)
    draft = model.draft
    err.positive("model.draft.vocab_size", draft.vocab_size)
    if draft.num_layers != 1:
        err.add("model.draft.num_layers", draft.num_layers,
                "EAGLE-3 drafts served by SGLang/vLLM have one decoder layer", "1")

    template = model.training_chat_template
    if template is not None and not Path(template).is_file():
        err.add("model.training_chat_template", template, "file not found", "a path to a .jinja file or null")

    # Offline: a local checkpoint, or the json files of a hub id the hub cache holds (model=auto fetched them).
    try:
        hf_config = target_config(model.path, model.revision, model.text_config_key, hf_cache,
                                  local_files_only=True).values
    except TargetConfigError:
        hf_config = None
    if hf_config is not None:
        for key, hf_key in HF_CONFIG_KEYS.items():
            actual = hf_config.get(hf_key)
            if actual is not None and actual != model[key]:
                err.add(f"model.{key}", model[key], f"{model.path}/config.json says {hf_key}={actual}", str(actual))
        if hf_config.get("auto_map") and not model.trust_remote_code:
            err.add("model.trust_remote_code", False,
                    f"{model.path}/config.json needs custom code (auto_map)",
                    "true, if you trust that code")


def _check_derived(model: DictConfig, err: ConfigErrors) -> bool:
    """One line per model key `model=auto` cannot derive from the checkpoint; True when there is one.

    OmegaConf raises where a value is first read; here every interpolated value of the model is
    read once, and each failure is reported under the key whose own derivation failed (a value
    derived from another, fc_in_features from hidden_size, fails with it and is not repeated).
    """
    found: dict[str, DerivedValueError] = {}

    def visit(node: DictConfig) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if OmegaConf.is_interpolation(node, key):  # type: ignore[arg-type]  # omegaconf types key as int | str
                try:
                    node[key]
                except Exception as exc:  # whatever the resolver raised, wrapped by OmegaConf
                    cause = resolution_cause(exc)
                    if isinstance(cause, DerivedValueError):
                        found.setdefault(cause.key, cause)
            elif isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                visit(child)

    visit(model)
    for cause in found.values():
        err.add(cause.key, cause.value, cause.why, cause.valid)
    return bool(found)


def _missing_keys(cfg: DictConfig) -> list[str]:
    """`OmegaConf.missing_keys` without resolving anything (it raises on an interpolation that fails)."""
    out: list[str] = []

    def gather(node: DictConfig | ListConfig) -> None:
        for key in cast(Iterable[Any], range(len(node)) if isinstance(node, ListConfig) else node.keys()):
            child = node._get_node(key)
            if OmegaConf.is_missing(node, key):
                out.append(node._get_full_key(key))
            elif isinstance(child, (DictConfig, ListConfig)) and not child._is_interpolation() and not child._is_none():
                gather(child)

    gather(cfg)
    return sorted(out)


def _check_draft_geometry(model: DictConfig, err: ConfigErrors) -> None:
    """The draft stage train would build must be one the export writes for some engine.

    The geometry rules are the export's own (`eagle3.draft.geometry.geometry_refusals`), run on
    the geometry train builds from this config; a draft that only some engines refuse is trained
    and exported for the others, and refused where a stage serves it on one of those
    (`eagle3.serving.rules.check_chain_draft_engine`).
    """
    layers, fc_in = list(model.capture_layers), model.draft.fc_in_features
    if fc_in is not None and layers and fc_in != len(layers) * model.hidden_size:
        # The engines feed fc one TARGET hidden state per captured layer, whatever the draft's width.
        expected = len(layers) * model.hidden_size
        err.add("model.draft.fc_in_features", fc_in, f"the draft's fc reads len(capture_layers) x hidden = "
                f"{len(layers)} x {model.hidden_size} = {expected} features", str(expected))
    refused = config_refusals(model)
    if len(refused) < len(ENGINES):
        return
    shared = [r for r in refused[ENGINES[0]] if all(r in why for why in refused.values())]
    lines = [("", r) for r in shared] or [(f"{engine}: ", r) for engine, why in refused.items() for r in why]
    for prefix, r in lines:
        why = r.why if r.config_key != "model.path" else f"its config.json says {r.field}={r.found}: {r.why}"
        err.add(r.config_key, OmegaConf.select(model, r.config_key.removeprefix("model.")), prefix + why, r.expected)


def _check_dataset(dataset: DictConfig, err: ConfigErrors) -> None:
    if dataset.files:
        # Still listed: `expand_dataset_files` could not turn them into sources; say why, one line each.
        before = len(err.lines)
        files_sources(dataset, err)
        if len(err.lines) == before:
            err.add("dataset.files", dataset.files, "never turned into sources (a config composed without "
                    "eagle3.data.detect.expand_dataset_files)", "call expand_dataset_files(cfg) after composing")
    elif not dataset.sources and dataset.files is not None:
        err.add("dataset.files", [], "names no file", "dataset.files=[a.jsonl,b.parquet] (local "
                + ", ".join(SUPPORTED_SUFFIXES) + " files)")
    elif not dataset.sources:
        err.add("dataset.sources", {}, "a dataset needs at least one source",
                "e.g. dataset=demo or dataset=kimi_native")
    for name, src in dataset.sources.items():
        key = f"dataset.sources.{name}"
        err.choice(f"{key}.track", src.track, TRACKS)
        err.choice(f"{key}.schema", src.schema, ADAPTERS)
        origins = [k for k in ("hub_id", "data_files", "generator") if src[k]]
        if len(origins) != 1:
            err.add(key, origins, "needs exactly one origin",
                    "one of hub_id, data_files, generator")
        if src.generator is not None:
            err.choice(f"{key}.generator", src.generator, GENERATORS)
        for path in src.data_files or []:
            if not Path(path).exists():
                err.add(f"{key}.data_files", path, "file not found", "local json/jsonl/parquet files")
            elif file_kind(path) is None:
                err.add(f"{key}.data_files", path, "unsupported file type", ", ".join(SUPPORTED_SUFFIXES))
        if src.schema in ADAPTERS:
            # Each adapter declares the column keys it reads; a misspelt key would otherwise
            # be ignored and every record would miss its column.
            valid_keys = ADAPTERS[src.schema].keys
            for col_key in src.columns or {}:
                if col_key not in valid_keys:
                    err.add(f"{key}.columns.{col_key}", src.columns[col_key],
                            f"not a column key of schema {src.schema}", ", ".join(valid_keys))
        err.positive(f"{key}.num_samples", src.num_samples, allow_none=not src.generator)  # a generator has no end
        err.not_negative(f"{key}.weight", src.weight)


def _check_stages(cfg: DictConfig, err: ConfigErrors) -> None:
    ex = cfg.extract
    err.choice("extract.backend", ex.backend, EXTRACT_BACKENDS)
    err.choice("extract.storage_format", ex.storage_format, STORAGE_FORMATS)
    err.positive("extract.batch_tokens", ex.batch_tokens)
    err.positive("extract.num_shards", ex.num_shards)
    if not 0 <= ex.shard < max(ex.num_shards, 1):
        err.add("extract.shard", ex.shard, f"out of range for num_shards={ex.num_shards}",
                f"0..{ex.num_shards - 1}")
    err.not_negative("extract.disk_margin_gb", ex.disk_margin_gb)
    err.positive("extract.assumed_tokens_per_sample", ex.assumed_tokens_per_sample)
    err.not_negative("extract.assume_free_bytes", ex.assume_free_bytes, ">= 0 or null")
    if ex.backend == VLLM:
        _check_extract_server(cfg, err)

    tr = cfg.train
    err.choice("train.hidden_states", tr.hidden_states, HIDDEN_STATE_MODES)
    err.positive("train.ttt_steps", tr.ttt_steps)
    if not 0 < tr.ttt_decay <= 1:
        err.add("train.ttt_decay", tr.ttt_decay, "weights decay^k must shrink or stay", "(0, 1]")
    err.choice("train.out_of_vocab", tr.out_of_vocab, OUT_OF_VOCAB_POLICIES)
    err.choice("train.teacher", tr.teacher, TEACHERS)
    err.choice("train.loss", tr.loss, LOSSES)
    if not 0 <= tr.state_noise < 10:
        err.add("train.state_noise", tr.state_noise, "noise std as a multiple of the states' RMS", "[0, 10)")
    err.choice("train.lr_schedule", tr.lr_schedule, LR_SCHEDULES)
    if not 0 <= tr.min_lr_ratio <= 1:
        err.add("train.min_lr_ratio", tr.min_lr_ratio, "the final LR as a fraction of train.optimizer.lr", "[0, 1]")
    err.choice("train.strategy", tr.strategy, STRATEGIES)
    err.choice("train.precision", tr.precision, PRECISIONS)
    err.positive("train.batch_tokens", tr.batch_tokens)
    if not 0 <= tr.warmup_ratio < 1:
        err.add("train.warmup_ratio", tr.warmup_ratio, "a fraction of the steps", "[0, 1)")
    err.not_negative("train.grad_clip", tr.grad_clip, ">= 0 (0 = off)")
    err.not_negative("train.checkpoint_every_n_steps", tr.checkpoint_every_n_steps, ">= 0 (0 = at epoch ends only)")
    err.positive("train.attention_block", tr.attention_block)
    err.not_negative("train.logits_memory_gb", tr.logits_memory_gb, ">= 0 (0 = recompute every TTT step's logits)")
    err.positive("train.log_every_n_steps", tr.log_every_n_steps)
    err.not_negative("train.progress_every_s", tr.progress_every_s, ">= 0 (0 = one line per epoch)")
    err.positive("train.eval_every_n_epochs", tr.eval_every_n_epochs)
    err.choice("train.export_dtype", tr.export_dtype, DTYPES)
    err.not_negative("train.num_workers", tr.num_workers, ">= 0 (0 = load in the training process)")
    _check_optimizer(tr.optimizer, err)
    if tr.max_epochs < 1 and tr.max_steps < 1:
        err.add("train.max_epochs", tr.max_epochs, "with max_steps <= 0 training would never stop",
                ">= 1, or set train.max_steps")

    ev = cfg.eval
    if not ev.ks or any(int(k) < 1 for k in ev.ks):
        err.add("eval.ks", list(ev.ks), "draft lengths to evaluate must be positive", "e.g. [3, 5]")
    err.positive("eval.max_new_tokens", ev.max_new_tokens)
    err.not_negative("eval.num_prompts", ev.num_prompts, ">= 0 (0 = skip real decoding)")

    prep = cfg.prep
    err.positive("prep.min_user_turns", prep.min_user_turns)
    if prep.max_user_turns < prep.min_user_turns:
        err.add("prep.max_user_turns", prep.max_user_turns, "below prep.min_user_turns",
                f">= {prep.min_user_turns}")
    err.positive("prep.max_chars", prep.max_chars)

    gen = cfg.generate
    err.positive("generate.max_new_tokens", gen.max_new_tokens)
    err.positive("generate.batch_size", gen.batch_size)
    err.positive("generate.max_user_turns", gen.max_user_turns)
    err.not_negative("generate.temperature", gen.temperature, ">= 0 (0 = greedy)")
    if not 0 < gen.top_p <= 1:
        err.add("generate.top_p", gen.top_p, "a probability mass", "(0, 1]")
    err.choice("generate.length_policy", gen.length_policy, LENGTH_POLICIES)
    _check_generate_http(gen.http, err)

    tok = cfg.tokenize
    err.choice("tokenize.overlength", tok.overlength, OVERLENGTH_POLICIES)
    err.not_negative("tokenize.num_workers", tok.num_workers, ">= 0 (0 = all cores)")
    err.positive("tokenize.chunk_size", tok.chunk_size)

    data = cfg.data
    err.positive("data.scale", data.scale, allow_none=True)
    err.positive("data.max_len", data.max_len)
    if not 0 <= data.warn_reject_fraction <= 1:
        err.add("data.warn_reject_fraction", data.warn_reject_fraction, "a share of a source's records",
                "[0, 1] (0 = warn on any loss, 1 = never)")
    if data.eval_size < 1:
        # Validation during training, vocab coverage_eval, eval's simulated and real acceptance all read the
        # eval split: over 0 samples they would report 1.0 made of nothing.
        err.add("data.eval_size", data.eval_size, "the eval split feeds every accept-length and coverage figure; "
                "with no samples they would be numbers made of nothing", ">= 1 (e.g. 16)")


def _check_optimizer(opt: DictConfig, err: ConfigErrors) -> None:
    """The schema's optimizer arguments in their ranges (a negative LR trains away from the target)."""
    err.positive("train.optimizer.lr", opt.lr)
    betas = list(opt.betas or [])
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        err.add("train.optimizer.betas", betas, "Adam's two moment decays", "two numbers in [0, 1), e.g. [0.9, 0.95]")
    err.not_negative("train.optimizer.weight_decay", opt.weight_decay)


def _check_extract_server(cfg: DictConfig, err: ConfigErrors) -> None:
    """extract.backend=vllm: a vLLM server node, its rules, and a client that can wait for it."""
    server = cfg.extract.server
    if server.backend != VLLM:
        err.add("extract.server.backend", server.backend, "extract.backend=vllm takes hidden states from a vLLM "
                "server", f"{VLLM} (conf/config.yaml composes server/vllm.yaml into extract.server)")
    check_server(server, cfg.model, err, key="extract.server")
    http = cfg.extract.http
    for name in ("concurrency", "request_timeout_s", "max_attempts", "connect_wait_s", "file_wait_s"):
        err.positive(f"extract.http.{name}", http[name])
    for name in ("backoff_s", "max_backoff_s", "max_consecutive_failures"):
        err.not_negative(f"extract.http.{name}", http[name])


def _check_generate_http(http: DictConfig, err: ConfigErrors) -> None:
    key = "generate.http"
    parts = list(http.partitions)
    if not parts:
        err.add(f"{key}.partitions", [], "needs at least one partition",
                "e.g. [{max_context: 10240, concurrency: 192}, {max_context: null, concurrency: 16}]")
    limits = []
    for i, part in enumerate(parts):
        err.positive(f"{key}.partitions[{i}].concurrency", part.concurrency)
        err.positive(f"{key}.partitions[{i}].max_context", part.max_context, allow_none=True)
        limits.append(part.max_context)
    finite = [m for m in limits if m is not None]
    if len(finite) != len(set(finite)) or limits.count(None) > 1:
        err.add(f"{key}.partitions", OmegaConf.to_container(http.partitions),
                "two partitions have the same max_context", "distinct max_context values, at most one null")
    err.choice(f"{key}.endpoint_strategy", http.endpoint_strategy, ENDPOINT_STRATEGIES)
    for name in ("chars_per_token", "request_timeout_s", "connect_timeout_s", "max_attempts", "connect_wait_s",
                 "log_every_s"):
        err.positive(f"{key}.{name}", http[name])
    for name in ("backoff_s", "max_backoff_s", "max_consecutive_failures"):
        err.not_negative(f"{key}.{name}", http[name])
    err.positive(f"{key}.inflight_batches", http.inflight_batches, allow_none=True)
    if not http.thinking_keys:
        err.add(f"{key}.thinking_keys", [], "the thinking mode must reach the chat template under some name",
                "e.g. [thinking] (Kimi) or [enable_thinking] (Qwen3)")
    for name in http.extra_body or {}:
        if name in RESERVED_BODY_FIELDS:
            err.add(f"{key}.extra_body.{name}", http.extra_body[name], "set by the client from generate.* and "
                    "the request", "fields other than " + ", ".join(sorted(RESERVED_BODY_FIELDS)))


def _check_known_keys(node: DictConfig, key: str, err: ConfigErrors) -> None:
    """Every key under a schema node is one the schema declares: `+train.max_epoch=1` is refused, not ignored.

    Hydra's `+key=value` adds a key to a typed node without complaint, and nothing would ever read it
    (the run would train `train.max_epochs` epochs while the user believes they set one). Nodes the
    schema types as dicts (`dataset.sources.<name>.columns`, `server.env`, `generate.http.extra_body`) take
    any key. A node with a `_target_` (the optimizer, the logger) is built from its keys, so an extra key
    is a constructor argument: accepted when the class takes it, refused when it does not.
    """
    schema = OmegaConf.get_type(node)
    if schema is not None and dataclasses.is_dataclass(schema):
        declared = {f.name for f in dataclasses.fields(schema)}
        extra = [str(k) for k in node.keys() if str(k) not in declared]
        if extra and "_target_" in node:
            _check_target_arguments(node, key, extra, err)
            extra = []
        for name in extra:
            where = f"{key}.{name}" if key else name
            close = difflib.get_close_matches(name, sorted(declared), n=3)
            err.add(where, config_dict(node, resolve=False)[name],
                    f"not a key of {key or 'the config'} (the schema has no such key, so nothing would read it)",
                    ("did you mean " + " or ".join(close) + "?") if close else ", ".join(sorted(declared)))
    for child_key in node.keys():
        child = node._get_node(child_key)
        if child is None or child._is_missing() or child._is_none() or child._is_interpolation():
            continue
        where = f"{key}.{child_key!s}" if key else str(child_key)
        if isinstance(child, DictConfig):
            _check_known_keys(child, where, err)
        elif isinstance(child, ListConfig):
            for i, item in enumerate(child):
                if isinstance(item, DictConfig):
                    _check_known_keys(item, f"{where}[{i}]", err)


def _check_target_arguments(node: DictConfig, key: str, extra: list[str], err: ConfigErrors) -> None:
    """Extra keys of a `_target_` node must be arguments its class takes (the class is imported only here)."""
    from hydra.utils import get_object

    target_node = node._get_node("_target_")
    assert target_node is not None  # the caller found `_target_` in the node
    target = target_node._value()
    try:
        params = inspect.signature(get_object(str(target))).parameters.values()
    except Exception as exc:  # noqa: BLE001 - an import error, a name that is not there: say which
        err.add(f"{key}._target_", target, f"cannot be imported ({type(exc).__name__}: {exc})".splitlines()[0],
                "an importable class, e.g. torch.optim.AdamW")
        return
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind != inspect.Parameter.VAR_POSITIONAL]
    for name in extra:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=3)
            err.add(f"{key}.{name}", config_dict(node, resolve=False)[name],
                    f"not an argument of {target}", ("did you mean " + " or ".join(close) + "?") if close
                    else ", ".join(accepted))


def _check_secrets(node: Any, key: str, err: ConfigErrors) -> None:
    """Secrets belong in the environment (WANDB_API_KEY, HF_TOKEN, VLLM_API_KEY), never in configs or logs.

    The entrypoint refuses them before Hydra writes a file (`eagle3.config.callbacks`); this catches
    a config composed elsewhere (a notebook, a test) before a stage records it.
    """
    for found in find_secrets(node, key):
        err.add(found.key, found.shown, found.why, found.valid)


def validate_config(cfg: DictConfig, stages: Iterable[str], stage_rules: Iterable[StageRules] = ()) -> list[str]:
    """All rule violations of a composed config, one line each (empty = valid).

    Args:
        cfg: The composed config.
        stages: Valid values of `stage`.
        stage_rules: The rules of the stages `cfg.stage` runs (`eagle3.stages.stage_rules`).
    """
    err = ConfigErrors()
    stages = tuple(stages)
    if cfg.stage not in stages:
        err.add("stage", cfg.stage, "not a registered stage", ", ".join(stages))
    underived = _check_derived(cfg.model, err)
    missing = _missing_keys(cfg)
    for key in missing:
        err.add(key, "???", "has no value (the schema has no default for it)", "set it in the option's YAML "
                "or on the command line")
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot resolve: report, keep checking
        # A missing or underivable value is reported above, under its own key.
        if resolution_cause(exc, (MissingMandatoryValue, InterpolationToMissingValueError, DerivedValueError)) is None:
            err.add("config", "<interpolation>", f"cannot be resolved: {exc}".splitlines()[0])
        plain = OmegaConf.to_container(cfg, resolve=False)
    if missing or underived:
        return err.lines  # the rules below read those keys
    _check_secrets(plain, "", err)
    _check_known_keys(cfg, "", err)
    err.positive("cpu_threads", cfg.cpu_threads, allow_none=True)
    err.positive("lock_timeout_s", cfg.lock_timeout_s)
    _check_model(cfg.model, err, cfg.paths.hf_cache)
    _check_dataset(cfg.dataset, err)
    check_server(cfg.server, cfg.model, err)
    for key in ("bench.data_backend", "serve.data_backend"):
        err.choice(key, OmegaConf.select(cfg, key), SERVER_BACKENDS, allow_none=True)
    for rules in stage_rules:
        rules(cfg, err)
    _check_stages(cfg, err)
    return err.lines
