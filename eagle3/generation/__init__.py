"""Target generation behind one interface (DESIGN.md §5): in-process `hf`, or `vllm` / `sglang`
servers through an async OpenAI-compatible client (`http_backend`).

`types` is the interface, `factory` maps `server.backend` to a backend class, `regenerate` is the
turn-by-turn loop, `pipeline` the resumable file-to-file run the `generate` stage calls, `reuse`
the copying of batches earlier outputs ran. Importing this package is cheap (no torch, no
aiohttp): a backend's heavy imports happen when `make_backend` builds it.
"""

from eagle3.generation.factory import make_backend
from eagle3.generation.types import (
    ERROR_PROMPT_TOO_LONG,
    ERROR_REQUEST_FAILED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    BackendUnavailable,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

__all__ = [
    "ERROR_PROMPT_TOO_LONG",
    "ERROR_REQUEST_FAILED",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "FINISH_TOOL_CALLS",
    "BackendUnavailable",
    "GenerationBackend",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "make_backend",
]
