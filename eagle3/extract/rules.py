"""The config rules of hidden-state extraction (`extract.*`, and its server when `extract.backend=vllm|sglang`).

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`.
"""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import Eagle3Config
from eagle3.engines import ENGINES
from eagle3.extract import BACKENDS as EXTRACT_BACKENDS
from eagle3.serving.rules import check_server
from eagle3.states.formats import FORMATS as STORAGE_FORMATS


def check_extract(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`extract.*`: the backend, the store's format and sharding, the disk and token budgets."""
    ex = cfg.extract
    err.choice("extract.backend", ex.backend, EXTRACT_BACKENDS)
    err.choice("extract.storage_format", ex.storage_format, STORAGE_FORMATS)
    err.positive("extract.batch_tokens", ex.batch_tokens)
    err.positive("extract.num_shards", ex.num_shards)
    if not 0 <= ex.shard < max(ex.num_shards, 1):
        err.add("extract.shard", ex.shard, f"out of range for num_shards={ex.num_shards}",
                f"0..{ex.num_shards - 1}")
    err.not_negative("extract.disk_margin_gb", ex.disk_margin_gb)
    err.positive("extract.assumed_tokens_per_sample", ex.assumed_tokens_per_sample)
    err.not_negative("extract.assume_free_bytes", ex.assume_free_bytes, ">= 0 or null")
    if ex.backend in ENGINES:
        _check_extract_server(cfg, err)


def _check_extract_server(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """extract.backend=vllm|sglang: that engine's server node, its rules, and a client that can wait for it."""
    server, backend = cfg.extract.server, cfg.extract.backend
    if server.backend != backend:
        err.add("extract.server.backend", server.backend, f"extract.backend={backend} takes hidden states from "
                f"a {backend} server", f"{backend} (conf/config.yaml composes server/cpu.yaml into extract.server, "
                "whose backend follows extract.backend)")
    check_server(server, cfg.model, err, key="extract.server")
    http = cfg.extract.http
    for name in ("concurrency", "request_timeout_s", "max_attempts", "connect_wait_s", "file_wait_s"):
        err.positive(f"extract.http.{name}", getattr(http, name))
    for name in ("backoff_s", "max_backoff_s", "max_consecutive_failures"):
        err.not_negative(f"extract.http.{name}", getattr(http, name))
