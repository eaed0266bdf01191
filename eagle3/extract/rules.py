"""The config rules of hidden-state extraction (`extract.*`, and its server when `extract.backend=vllm|sglang`).

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`.
"""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import Eagle3Config
from eagle3.engines import ENGINES
from eagle3.serving.rules import check_server


def check_extract(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`extract.*` across fields: the shard within the shards, and the backend's server."""
    ex = cfg.extract
    if not 0 <= ex.shard < max(ex.num_shards, 1):
        err.add("extract.shard", ex.shard, f"out of range for num_shards={ex.num_shards}",
                f"0..{ex.num_shards - 1}")
    if ex.backend in ENGINES:
        _check_extract_server(cfg, err)


def _check_extract_server(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """extract.backend=vllm|sglang: that engine's server node, and its rules."""
    server, backend = cfg.extract.server, cfg.extract.backend
    if server.backend != backend:
        err.add("extract.server.backend", server.backend, f"extract.backend={backend} takes hidden states from "
                f"a {backend} server", f"{backend} (conf/config.yaml composes server/cpu.yaml into extract.server, "
                "whose backend follows extract.backend)")
    check_server(server, cfg.model, err, key="extract.server")
