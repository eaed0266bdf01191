"""The schema of the serving engines' config nodes: `server` (also `generate.server`, `extract.server`), `serve`,
`bench`.

Part of the schema (`eagle3.config.schema`, whose docstring states the rule: every default lives
here, next to its type, and a YAML file sets only what its option changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import II

from eagle3.config.fields import run_field, setting, speed_field
from eagle3.engines import PROFILES, SERVER_BACKENDS, SPEC_ALGORITHMS


@dataclass
class SpeculativeConfig:
    """Speculative-decoding settings of a serving engine (SGLang spelling of the algorithm)."""

    algorithm: Optional[str] = setting(None, SPEC_ALGORITHMS)  # None = speculation off
    # An export directory (eagle3.draft.export) for this engine; None = the export of this
    # config's complete train output (stage=serve finds it). Where it lies keys nothing: stage bench
    # keys the draft it names by its bytes (`eagle3.target_info.target_identity`).
    draft_path: Optional[str] = run_field(None)
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    # Capture layers of the draft in HF numbering; None = model.capture_layers. The launcher
    # writes them per engine (SGLang: capture-1; vLLM: as is).
    capture_layers: Optional[list[int]] = None
    draft_quantization: Optional[str] = None  # SGLang: unquant keeps the draft in bf16
    attention_mode: Optional[str] = None  # SGLang: prefill | decode


@dataclass
class KernelBackendsConfig:
    """SGLang kernel choices; on sm120 several of these do not run (validate.SM120_UNSUPPORTED)."""

    attention_backend: Optional[str] = None
    prefill_attention_backend: Optional[str] = None
    decode_attention_backend: Optional[str] = None
    draft_attention_backend: Optional[str] = None
    moe_runner_backend: Optional[str] = None


@dataclass
class ServerConfig:
    """The engine that serves the target (and draft): in-process HF or an HTTP server.

    `server` serves the draft (stages serve, bench); `generate.server` and `extract.server` are the
    servers stage generate and extract launch or connect to.
    """

    backend: str = setting("hf", SERVER_BACKENDS)
    # cpu: vLLM's CPU build (VLLM_CPU_* env, libiomp5 preloaded for EAGLE-3); sm120, h200: those GPUs' facts
    profile: str = speed_field("generic", PROFILES)
    python: str = run_field("python")  # interpreter of the server's own environment (e.g. .venv-sglang/bin/python)
    host: str = run_field("127.0.0.1")  # loopback only
    port: int = run_field(30000, ge=1, le=65535, why="not a TCP port", valid="1-65535")
    urls: list[str] = run_field(default_factory=list)  # connect to running servers instead (base URLs)
    tp: int = speed_field(1, gt=0)
    dp: int = speed_field(1, gt=0)
    dtype: str = "auto"
    context_length: Optional[int] = setting(None, gt=0)
    mem_fraction_static: Optional[float] = speed_field(None)
    # The model's parsers (Kimi: kimi_k2), so served answers split reasoning and tool calls.
    reasoning_parser: Optional[str] = II("model.reasoning_parser")
    tool_call_parser: Optional[str] = II("model.tool_call_parser")
    trust_remote_code: bool = II("model.trust_remote_code")
    startup_timeout_s: float = run_field(1800.0, gt=0)  # until the health endpoint answers 200
    vllm_cpu_kvcache_gb: int = speed_field(1)  # profile=cpu: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)
    kernels: KernelBackendsConfig = speed_field(default_factory=KernelBackendsConfig)
    speculative: SpeculativeConfig = speed_field(default_factory=SpeculativeConfig)
    # Set on top of what the launcher derives (SGLANG_ENABLE_SPEC_V2, SGL_ENABLE_JIT_DEEPGEMM,
    # VLLM_CPU_*, LD_PRELOAD); a key here wins.
    env: dict[str, str] = speed_field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)  # appended verbatim (not --host/--port/--speculative-*)


@dataclass
class ServeConfig:
    """Stage serve: launch the configured server and hold it until Ctrl-C."""

    dry_run: bool = False  # print the command line and environment, launch nothing
    # Serve extract.server as extract.backend=vllm|sglang launches it (vLLM's extract_hidden_states method
    # with eagle3's connector; SGLang with eagle3's capture plugin) for jobs elsewhere to use through
    # extract.server.urls, instead of `server`.
    hidden_states: bool = False


@dataclass
class BenchConfig:
    """Stage bench: the served target without and with the draft (tok/s, engine accept length)."""

    # The in-process eval's prompts and lengths, so the engine's accept length compares with eval's.
    num_prompts: int = II("eval.num_prompts")  # held-out prompts (first assistant turns of the eval split)
    max_new_tokens: int = II("eval.max_new_tokens")  # per prompt, greedy
    concurrency: int = setting(1, gt=0)  # requests in flight (1 = batch-1 decoding, what speculation speeds up)
    warmup_requests: int = setting(1, ge=0)  # sent before the timed part, not counted
    repeats: int = setting(3, gt=0)  # timed passes over all prompts; tok/s is the median pass (shared cores are noisy)
    baseline: bool = True  # also measure the target alone (speedup); false = speculative only
    # With server.urls (connect mode: nothing launched) the baseline server's URLs.
    baseline_urls: list[str] = run_field(default_factory=list)
    # At or below this accept length under speculation the draft is unused: FAILED, not a number.
    min_accept_length: float = setting(1.05, ge=1, why="an accept length is at least 1 (the target's own token)")
    request_timeout_s: float = run_field(600.0, gt=0)
