"""Finding the chain a server-side stage (serve, bench) works on.

The `generate` fingerprint holds the backend that regenerated the prompt-only data, so every
artifact downstream of it (merge, vocab, extract, train, eval) is keyed by that backend too.
The backend a user *serves* with (`server=vllm`) is often not the one that *generated* the data
(the demo chain runs in-process, `server=hf`), so looking the chain up under the served backend
would miss it. This module looks under the served backend first, then under every other one, and
uses the chain that exists; an explicit backend (`bench.data_backend`) skips the search.
"""

from __future__ import annotations

import copy
import logging
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from eagle3.serving.engines import SERVER_BACKENDS
from eagle3.stages.base import MissingInput, StageContext, UnitStage, require

log = logging.getLogger("eagle3")
_ANNOUNCED: set = set()  # (stage, unit, served, found): said once per process, not per lookup


def with_data_backend(cfg: DictConfig, backend: str) -> DictConfig:
    """`cfg` with `server.backend` replaced: the config under which that backend's chain is found."""
    if backend == cfg.server.backend:
        return cfg
    chain = copy.deepcopy(cfg)
    OmegaConf.update(chain, "server.backend", str(backend), merge=False)
    return chain


def chain_config(cfg: DictConfig, ctx: StageContext, stage: UnitStage, unit: str,
                 data_backend: Optional[str] = None, key: str = "bench.data_backend") -> DictConfig:
    """The config under which `stage`'s complete output for `unit` is found.

    Args:
        data_backend: The backend that generated the chain's data; None = search (the served
            backend first, then the others).
        key: The config key that sets `data_backend`, named in errors.

    Raises:
        MissingInput: no backend has a complete output, or several do and none is the served one
            (ambiguous: the message lists them and names `key`).
    """
    if data_backend is not None:
        return with_data_backend(cfg, data_backend)
    served = str(cfg.server.backend)
    try:
        require(stage, cfg, ctx, unit)
        return cfg
    except MissingInput as exc:
        missing = exc
    found = []
    for backend in SERVER_BACKENDS:
        if backend == served:
            continue
        candidate = with_data_backend(cfg, backend)
        try:
            require(stage, candidate, ctx, unit)  # its inputs, and theirs, are looked up too
        except MissingInput:
            continue
        found.append((backend, candidate))
    if len(found) == 1:
        backend, candidate = found[0]
        if (stage.name, unit, served, backend) in _ANNOUNCED:
            return candidate
        _ANNOUNCED.add((stage.name, unit, served, backend))
        log.info("%s: using the chain whose data was generated with server.backend=%s (none under %s; "
                 "%s=... chooses)", stage.name, backend, served, key)
        return candidate
    if not found:
        raise MissingInput(f"{missing} (looked under every generate backend: {', '.join(SERVER_BACKENDS)})")
    names = ", ".join(b for b, _ in found)
    raise MissingInput(f"no complete {stage.name} output for {unit!r} generated with server.backend={served}, "
                       f"but there are chains generated with {names}: "
                       f"choose one with {key}=<{names.replace(', ', '|')}>")
