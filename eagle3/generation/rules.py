"""The config rules of generation (`generate.*`: its HTTP client, and its server when `generate.backend` is one).

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`.
"""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.client_schema import GenerateHTTPConfig
from eagle3.config.schema import Eagle3Config
from eagle3.engines import ENGINES
from eagle3.generation.openai_chat import RESERVED_BODY_FIELDS
from eagle3.serving.rules import check_server


def check_generate(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`generate.*` across fields: the backend's server, and the HTTP client's partitions and request body."""
    gen = cfg.generate
    if gen.backend in ENGINES:
        _check_generate_server(cfg, err)
    _check_generate_http(gen.http, err)


def _check_generate_server(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """generate.backend=vllm|sglang: `generate.server` is that engine, and passes every server rule."""
    backend, server = cfg.generate.backend, cfg.generate.server
    if server.backend != backend:
        err.add("generate.backend", backend, f"generate.server.backend is {server.backend!r}: generate would "
                f"launch (or talk to) a {server.backend} server", f"{server.backend}, or keep {backend} with "
                f"server@generate.server={backend} (or server/cpu.yaml, whose backend follows generate.backend)")
    check_server(server, cfg.model, err, key="generate.server")


def _check_generate_http(http: GenerateHTTPConfig, err: ConfigErrors) -> None:
    key = "generate.http"
    parts = list(http.partitions)
    if not parts:
        err.add(f"{key}.partitions", [], "needs at least one partition",
                "e.g. [{max_context: 10240, concurrency: 192}, {max_context: null, concurrency: 16}]")
    limits = [part.max_context for part in parts]
    finite = [m for m in limits if m is not None]
    if len(finite) != len(set(finite)) or limits.count(None) > 1:
        err.add(f"{key}.partitions", list(http.partitions),
                "two partitions have the same max_context", "distinct max_context values, at most one null")
    if not http.thinking_keys:
        err.add(f"{key}.thinking_keys", [], "the thinking mode must reach the chat template under some name",
                "e.g. [thinking] (Kimi) or [enable_thinking] (Qwen3)")
    for name in http.extra_body or {}:
        if name in RESERVED_BODY_FIELDS:
            err.add(f"{key}.extra_body.{name}", http.extra_body[name], "set by the client from generate.* and "
                    "the request", "fields other than " + ", ".join(sorted(RESERVED_BODY_FIELDS)))
