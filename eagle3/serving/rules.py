"""The server rules: what `server.*` (and `bench.*`) must satisfy before anything is launched.

Checked twice: by `eagle3.config.validate` before any stage runs (`check_servers` for `server`,
listed in `eagle3.stages`; `check_server` for `generate.server` and `extract.server`, run by the
rules of generation and extraction), and again by the launcher (`eagle3.serving.commands`) with the actual draft
directory, so a config that bypassed the entrypoint still cannot bind a public address or serve an
EAGLE-3 draft with EAGLE. They encode the failures that cost real projects weeks (docs/design.md,
'Facts: SGLang', 'Facts: sm120'): the EAGLE-vs-EAGLE3 flag, kernels that do not exist on sm120,
flags in `extra_args` that would bypass these rules (the launcher's own flags are refused there;
those of a ruled setting, `RULED_FLAGS`, are checked like the typed key).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from eagle3.config.checks import ConfigErrors, field_values, value_at
from eagle3.config.fields import check_fields
from eagle3.config.schema import Eagle3Config, ModelConfig
from eagle3.config.server_schema import ServerConfig
from eagle3.draft.geometry import config_refusals
from eagle3.draft.options import ATTENTION_LLAMA, ATTENTION_MLA, LAYER_VARIANTS, MLA_ARCHITECTURE
from eagle3.engines import (
    CPU_PROFILE,
    EAGLE,
    EAGLE3,
    ENGINES,
    LAUNCHER_FLAG_PREFIX,
    LAUNCHER_FLAGS,
    SGLANG,
    SGLANG_NO_CPU_EAGLE,
    SM120_KERNELS_VALID,
    SM120_MAX_MEM_FRACTION,
    SM120_PROFILE,
    SM120_UNSUPPORTED,
    VLLM,
)
from eagle3.layer_ids import sglang_capture_problem
from eagle3.serving.http import is_loopback_host
from eagle3.target_info import read_config, target_has_mla

__all__ = ["RULED_FLAGS", "check_bench", "check_chain_draft_engine", "check_serve", "check_server", "check_servers",
           "draft_kind", "extra_arg_flags", "server_errors", "speculative_algorithm_error"]


def _draft_architectures(draft_path: str) -> Optional[list[str]]:
    """The `architectures` of a draft checkpoint's config.json; None when it has none."""
    config_file = Path(draft_path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []


def draft_kind(draft_path: Optional[str]) -> Optional[str]:
    """'eagle3', 'eagle' or None (unknown) for a draft checkpoint.

    None as a path means the draft this pipeline exports, which is always EAGLE-3.
    """
    if draft_path is None:
        return "eagle3"
    archs = _draft_architectures(draft_path)
    if archs is not None:
        if any("eagle3" in a.lower() for a in archs):
            return "eagle3"
        if any("eagle" in a.lower() for a in archs):
            return "eagle"
        return None
    return "eagle3" if "eagle3" in str(draft_path).lower().replace("-", "") else None


def speculative_algorithm_error(algorithm: Optional[str], draft_path: Optional[str],
                                key: str = "server") -> Optional[str]:
    """The one-line error for a speculative algorithm that does not fit the draft, or None.

    `draft_path` None means the draft this pipeline exports (EAGLE-3). Shared by config
    validation and the launcher, which checks again once it knows the actual draft directory.
    `key` is the server node's place in the config, named in the line.
    """
    err = ConfigErrors()
    kind = draft_kind(None if draft_path is None else str(draft_path))
    if algorithm == EAGLE and kind == "eagle3":
        err.add(f"{key}.speculative.algorithm", EAGLE,
                "the draft is EAGLE-3: with EAGLE the server feeds it the final hidden state "
                "instead of the 3 captured layers, the fc fusion layer is bypassed and accept "
                "length collapses to ~1.0", EAGLE3)
    elif algorithm == EAGLE3 and kind == "eagle":
        err.add(f"{key}.speculative.algorithm", EAGLE3,
                f"the draft at {draft_path} is EAGLE(-1/2): EAGLE3 feeds it 3 captured layers "
                "it was not trained on", "EAGLE, or an EAGLE-3 draft")
    return err.lines[0] if err.lines else None


KERNELS, MEM_FRACTION = "kernels.", "mem_fraction_static"
#: The flag each engine's launcher writes for a typed `server.*` key that a rule checks; the
#: launcher (`eagle3.serving.commands`) builds those flags from here. The same flags in
#: `server.extra_args` (`--flag value` or `--flag=value`) are read back and checked by the same
#: rules; they are what the server uses (the launcher then leaves out its own).
RULED_FLAGS = {
    SGLANG: {"kernels.attention_backend": "--attention-backend",
             "kernels.prefill_attention_backend": "--prefill-attention-backend",
             "kernels.decode_attention_backend": "--decode-attention-backend",
             "kernels.moe_runner_backend": "--moe-runner-backend",
             "kernels.draft_attention_backend": "--speculative-draft-attention-backend",
             MEM_FRACTION: "--mem-fraction-static"},
    VLLM: {MEM_FRACTION: "--gpu-memory-utilization"},
}


def extra_arg_flags(extra_args: Any) -> dict[str, tuple[str, Optional[str]]]:
    """`{flag: (as written, value)}` of the `--flag value` / `--flag=value` arguments in `extra_args`.

    A flag followed by another flag (or by nothing) has the value None; a repeated flag keeps its
    last occurrence, as the engines' argument parsers do.
    """
    args = [str(a) for a in (extra_args or [])]
    flags: dict[str, tuple[str, Optional[str]]] = {}
    value: Optional[str]
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            flag, value = arg.split("=", 1)
            flags[flag] = (arg, value)
            continue
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        flags[arg] = (arg if value is None else f"{arg} {value}", value)
    return flags


def _ruled_settings(server: ServerConfig, key: str, err: ConfigErrors) -> list[tuple[str, str, Any, Any]]:
    """`(typed key, config key to name, value as shown, value)` of each setting a rule checks: the typed
    keys, then the flags in `extra_args` that set the same thing (which the launcher lets win)."""
    kernels = field_values(server.kernels)
    settings = [(f"{KERNELS}{name}", f"{key}.kernels.{name}", value, value) for name, value in kernels.items()]
    settings.append((MEM_FRACTION, f"{key}.{MEM_FRACTION}", server.mem_fraction_static, server.mem_fraction_static))
    given = extra_arg_flags(server.extra_args)
    for typed, flag in RULED_FLAGS.get(server.backend, {}).items():
        if flag not in given:
            continue
        written, flag_value = given[flag]
        value: Any = flag_value
        if typed == MEM_FRACTION and flag_value is not None:
            try:
                value = float(flag_value)
            except ValueError:
                err.add(f"{key}.extra_args", written, "not a number", "a fraction in (0, 1]")
                continue
        settings.append((typed, f"{key}.extra_args", written, value))
    return settings


_FROM_CONFIG = object()


def server_errors(server: ServerConfig, model: ModelConfig, draft_path: Any = _FROM_CONFIG) -> list[str]:
    """The server rules alone (its fields' constraints too), one line each; the launcher runs them again
    before a launch.

    Args:
        draft_path: The draft directory about to be served; by default
            `server.speculative.draft_path` (None = this pipeline's export, EAGLE-3).
    """
    err = ConfigErrors()
    check_fields(server, err, "server")
    check_server(server, model, err, draft_path)
    return err.lines


def check_server(server: ServerConfig, model: ModelConfig, err: ConfigErrors,
                 draft_path: Any = _FROM_CONFIG, key: str = "server") -> None:
    """Every rule of a server node into `err` (`draft_path`: as in `server_errors`).

    Args:
        key: Where the node sits in the config (`server`, `generate.server` or `extract.server`), named in
            errors.
    """
    if not is_loopback_host(str(server.host)):
        err.add(f"{key}.host", server.host, "servers this project launches bind loopback only",
                "127.0.0.1, ::1 or localhost")
    for url in server.urls:
        if not str(url).startswith(("http://", "https://")):
            err.add(f"{key}.urls", url, "not an HTTP endpoint", "http://HOST:PORT")

    spec = server.speculative
    mismatch = speculative_algorithm_error(spec.algorithm,
                                           spec.draft_path if draft_path is _FROM_CONFIG else draft_path, key)
    if mismatch:
        err.lines.append(mismatch)
    if spec.algorithm is not None:
        err.positive(f"{key}.speculative.num_steps", spec.num_steps)
        err.positive(f"{key}.speculative.eagle_topk", spec.eagle_topk)
        if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
            err.add(f"{key}.speculative.num_draft_tokens", spec.num_draft_tokens,
                    f"a chain draft (eagle_topk=1) of {spec.num_steps} steps verifies "
                    f"num_steps+1 tokens", str(spec.num_steps + 1))
    if spec.capture_layers is not None and list(spec.capture_layers) != list(model.capture_layers):
        err.add(f"{key}.speculative.capture_layers", list(spec.capture_layers),
                f"differs from model.capture_layers {list(model.capture_layers)}, "
                "which the draft was trained on", str(list(model.capture_layers)))

    ruled = _ruled_settings(server, key, err)
    if server.profile == SM120_PROFILE:
        for typed, where, shown, value in ruled:
            if typed.startswith(KERNELS) and value is not None and str(value).lower() in SM120_UNSUPPORTED:
                err.add(where, shown, "does not run on sm120 (Unsupported architecture)", SM120_KERNELS_VALID)
        deepgemm = server.env.get("SGL_ENABLE_JIT_DEEPGEMM")
        if deepgemm is not None and str(deepgemm) != "0":  # unset: the launcher sets "0"
            err.add(f"{key}.env.SGL_ENABLE_JIT_DEEPGEMM", deepgemm,
                    "DeepGEMM does not run on sm120; the JIT must be switched off", "'0' or unset")
        for typed, where, shown, value in ruled:
            if typed == MEM_FRACTION and value is not None and value > SM120_MAX_MEM_FRACTION:
                err.add(where, shown, "too high for sm120 (OOM at startup)", f"<= {SM120_MAX_MEM_FRACTION}")

    for typed, where, shown, value in ruled:
        if typed == MEM_FRACTION and value is not None and not 0 < value <= 1:
            err.add(where, shown, "a fraction of the accelerator memory", "(0, 1] or null")
    if server.profile == CPU_PROFILE:  # the engine's CPU path (hf: nothing is launched, the profile is unused)
        err.positive(f"{key}.vllm_cpu_kvcache_gb", server.vllm_cpu_kvcache_gb)
    if server.backend == VLLM:
        for field_name, value in field_values(server.kernels).items():
            if value is not None:
                err.add(f"{key}.kernels.{field_name}", value,
                        "an SGLang kernel flag; the vLLM launcher would ignore it",
                        "null with server.backend=vllm (vLLM flags go in server.extra_args)")
        if spec.algorithm is not None and spec.eagle_topk != 1:
            err.add(f"{key}.speculative.eagle_topk", spec.eagle_topk,
                    "vLLM drafts a chain of num_steps tokens", "1")
    for arg in server.extra_args:
        flag = str(arg).split("=", 1)[0]
        owner = LAUNCHER_FLAGS.get(flag)
        if owner is None and flag.startswith(LAUNCHER_FLAG_PREFIX[0]):
            owner = LAUNCHER_FLAG_PREFIX[1]
        if owner is not None:
            owner = owner.replace("server.", f"{key}.", 1)  # the node this server's keys live in
            err.add(f"{key}.extra_args", str(arg), f"the launcher sets this flag from {owner} (and checks it there)",
                    f"set {owner} instead")


def check_servers(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """Every config's `server.*` (the engine that serves the draft); run for every config by
    `eagle3.config.validate.validate_config`. `generate.server` and `extract.server` are checked by
    the rules of generation and extraction when their backend uses them."""
    check_server(cfg.server, cfg.model, err)


def check_chain_draft_engine(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """The chain's own draft (no `server.speculative.draft_path`) must be one the engine serves: a
    geometry the engine's export refuses (`eagle3.draft.geometry.geometry_refusals`: a layer variant
    or a capture SGLang lacks) is exported for the other engines only, so there is none to serve."""
    server = cfg.server
    if server.speculative.algorithm is None or server.backend not in ENGINES:
        return
    _check_cpu_attention_pairing(cfg, err)
    if server.speculative.draft_path is not None:
        return  # the launcher checks that export's ids against the target (eagle3.serving.launch_checks)
    if server.backend == SGLANG:
        target = read_config(str(cfg.model.path), cfg.model.text_config_key) or {}
        problem = sglang_capture_problem(cfg.model.capture_layers, [str(a) for a in target.get("architectures") or ()])
        if problem:
            err.add("model.capture_layers", list(cfg.model.capture_layers), problem,
                    "capture layers starting at 2 (e.g. [2, L//2, L-3]), or server=vllm")
    refused = config_refusals(cfg.model)
    serving = [engine for engine in ENGINES if engine not in refused]
    if server.backend in serving or not serving:
        return  # served; or exported for no engine at all, which config validation reports
    for r in refused[server.backend]:
        what = "layer variant" if r.field in LAYER_VARIANTS else "geometry"
        err.add(r.config_key, value_at(cfg, r.config_key), f"{server.backend} cannot serve this draft "
                f"{what} ({r.why}), so the chain exports none for it",
                f"{r.expected}, or server.backend={'/'.join(serving)}")


def _draft_is_mla(cfg: Eagle3Config) -> Optional[bool]:
    """Whether the draft to serve is an MLA draft: the chain's (`model.draft.attention`), or the
    export at `server.speculative.draft_path` by its architecture (None: unreadable there)."""
    path = cfg.server.speculative.draft_path
    if path is None:
        return cfg.model.draft.attention == ATTENTION_MLA
    try:
        archs = _draft_architectures(str(path))
    except (OSError, ValueError, AttributeError):
        return None
    return None if archs is None else MLA_ARCHITECTURE in archs


def _check_cpu_attention_pairing(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """vLLM's CPU build serves a draft only with the target's kind of attention (llama with llama,
    MLA with MLA): a Llama-style draft beside an MLA target dies at start ('No common block size for
    16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])', measured); an MLA draft beside a Llama target
    pairs the same two block sizes and is refused by the same rule (not measured). GPUs serve both."""
    server = cfg.server
    if server.backend != VLLM or server.profile != CPU_PROFILE:
        return
    target = read_config(str(cfg.model.path), cfg.model.text_config_key)
    draft_mla = _draft_is_mla(cfg)
    if target is None or draft_mla is None or target_has_mla(target) == draft_mla:
        return
    kinds = {True: "an MLA", False: "a llama-attention"}
    key = "model.draft.attention" if server.speculative.draft_path is None else "server.speculative.draft_path"
    err.add(key, value_at(cfg, key), f"vLLM's CPU build cannot serve {kinds[draft_mla]} draft beside "
            f"{kinds[target_has_mla(target)]} target {cfg.model.path} (the KV caches share no block size; "
            "GPUs serve it); in-process eval measures this draft on any machine",
            f"model.draft.attention={ATTENTION_MLA if target_has_mla(target) else ATTENTION_LLAMA}, "
            "or server=vllm_gpu on a GPU")


def check_engine_speculates(server: ServerConfig, err: ConfigErrors, key: str = "server") -> None:
    """A server that is to speculate must be able to: SGLang's CPU engine has no EAGLE path."""
    if server.backend == SGLANG and server.profile == CPU_PROFILE and server.speculative.algorithm is not None:
        err.add(f"{key}.speculative.algorithm", server.speculative.algorithm, SGLANG_NO_CPU_EAGLE,
                "null (the target alone), server=vllm on a CPU, or server=sglang on a GPU")


def check_serve(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """stage=serve launches (or checks) an HTTP server: the in-process backend has none (with
    serve.hidden_states it serves extract.server, whose rules extract.backend=vllm|sglang runs)."""
    if cfg.serve.hidden_states and cfg.extract.backend not in ENGINES:
        err.add("serve.hidden_states", True, "serves the server of extract.backend=vllm|sglang",
                "extract.backend=vllm or extract.backend=sglang")
    if cfg.server.backend not in ENGINES and not cfg.serve.hidden_states:
        err.add("server.backend", cfg.server.backend, "stage=serve launches an HTTP server",
                f"{', '.join(ENGINES)} (e.g. server=sglang)")
    if not cfg.serve.hidden_states:
        check_engine_speculates(cfg.server, err)
        check_chain_draft_engine(cfg, err)


def check_bench(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """stage=bench: an HTTP server, with speculation on (the baseline is derived from it)."""
    server, bench = cfg.server, cfg.bench
    if server.backend not in ENGINES:
        err.add("server.backend", server.backend, "stage=bench measures an HTTP server",
                f"{', '.join(ENGINES)} (e.g. server=vllm)")
    if server.speculative.algorithm is None:
        err.add("server.speculative.algorithm", None, "stage=bench compares the target with and without "
                "the draft; the baseline turns speculation off by itself", EAGLE3)
    check_engine_speculates(cfg.server, err)
    check_chain_draft_engine(cfg, err)
    err.positive("bench.num_prompts", bench.num_prompts)
    err.positive("bench.max_new_tokens", bench.max_new_tokens)
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


