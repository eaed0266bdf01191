"""Target generation behind one interface (DESIGN.md §5): in-process `hf`, or `vllm` / `sglang`
servers through an async OpenAI-compatible client (`http_backend`).

Importing this package is cheap (no torch, no aiohttp): a backend's heavy imports happen when
`make_backend` builds it.
"""

from eagle3.generation.backend import (
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
    make_backend,
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
