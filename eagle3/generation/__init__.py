"""Target generation behind one interface (DESIGN.md §5): in-process `hf` now, HTTP servers later.

Importing this package is cheap (no torch): the `hf` backend loads transformers only when
`make_backend` builds it.
"""

from eagle3.generation.backend import (
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
