"""`generate.backend` -> generation backend class, resolved lazily by name.

The interface (`eagle3.generation.types`) knows no implementation; this table is the one place
that does, and imports a backend only when it is built, so choosing `hf` never imports aiohttp
and choosing `vllm` never imports torch. Each backend builds itself from the config
(`from_config(cfg, urls)`), so adding one is a class and a row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from eagle3.engines import ENGINES, IN_PROCESS
from eagle3.generation.types import GenerationBackend

if TYPE_CHECKING:
    from eagle3.config.schema import Eagle3Config

__all__ = ["BACKENDS", "backend_class", "make_backend"]

_HF = "eagle3.generation.hf_backend:HFBackend"
_HTTP = "eagle3.generation.http_backend:HTTPBackend"
#: Every `generate.backend` and the class that generates through it.
BACKENDS: dict[str, str] = {IN_PROCESS: _HF, **{engine: _HTTP for engine in ENGINES}}


def backend_class(name: str) -> type[GenerationBackend]:
    """The class behind `generate.backend=name` (imported now)."""
    if name not in BACKENDS:
        raise ValueError(f"generate.backend={name!r} is not a generation backend; valid: {', '.join(BACKENDS)}")
    module, attr = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def make_backend(cfg: Eagle3Config, urls: Optional[Sequence[str]] = None) -> GenerationBackend:
    """The generation backend `cfg.generate.backend` names (nothing loaded or connected yet).

    Args:
        cfg: The config (`generate.backend`, `generate.server`, `generate.http`, `model`).
        urls: For `vllm` / `sglang`: base URLs of running OpenAI-compatible servers (a launcher
            that started them passes them); None means `cfg.generate.server.urls`.

    Raises:
        BackendUnavailable: For `vllm` / `sglang` without any URL to talk to.
        ValueError: For an unknown backend name (validation normally catches it first).
    """
    return backend_class(str(cfg.generate.backend)).from_config(cfg, urls)
