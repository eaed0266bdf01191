"""The config rules of generation (`generate.*`: its HTTP client, and its server when `generate.backend` is one).

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`.
"""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import Eagle3Config, GenerateHTTPConfig
from eagle3.engines import ENGINES, SERVER_BACKENDS
from eagle3.generation.http_settings import ENDPOINT_STRATEGIES
from eagle3.generation.openai_chat import RESERVED_BODY_FIELDS
from eagle3.generation.regenerate import LENGTH_POLICIES
from eagle3.serving.rules import check_server


def check_generate(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`generate.*`: the backend (and its server), sampling settings, the length policy and the HTTP
    client's partitions and limits."""
    gen = cfg.generate
    err.choice("generate.backend", gen.backend, SERVER_BACKENDS)
    if gen.backend in ENGINES:
        _check_generate_server(cfg, err)
    err.positive("generate.max_new_tokens", gen.max_new_tokens)
    err.positive("generate.batch_size", gen.batch_size)
    err.positive("generate.max_user_turns", gen.max_user_turns)
    err.not_negative("generate.temperature", gen.temperature, ">= 0 (0 = greedy)")
    if not 0 < gen.top_p <= 1:
        err.add("generate.top_p", gen.top_p, "a probability mass", "(0, 1]")
    err.choice("generate.length_policy", gen.length_policy, LENGTH_POLICIES)
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
    limits = []
    for i, part in enumerate(parts):
        err.positive(f"{key}.partitions[{i}].concurrency", part.concurrency)
        err.positive(f"{key}.partitions[{i}].max_context", part.max_context, allow_none=True)
        limits.append(part.max_context)
    finite = [m for m in limits if m is not None]
    if len(finite) != len(set(finite)) or limits.count(None) > 1:
        err.add(f"{key}.partitions", list(http.partitions),
                "two partitions have the same max_context", "distinct max_context values, at most one null")
    err.choice(f"{key}.endpoint_strategy", http.endpoint_strategy, ENDPOINT_STRATEGIES)
    for name in ("chars_per_token", "request_timeout_s", "connect_timeout_s", "max_attempts", "connect_wait_s",
                 "log_every_s"):
        err.positive(f"{key}.{name}", getattr(http, name))
    for name in ("backoff_s", "max_backoff_s", "max_consecutive_failures"):
        err.not_negative(f"{key}.{name}", getattr(http, name))
    err.positive(f"{key}.inflight_batches", http.inflight_batches, allow_none=True)
    if not http.thinking_keys:
        err.add(f"{key}.thinking_keys", [], "the thinking mode must reach the chat template under some name",
                "e.g. [thinking] (Kimi) or [enable_thinking] (Qwen3)")
    for name in http.extra_body or {}:
        if name in RESERVED_BODY_FIELDS:
            err.add(f"{key}.extra_body.{name}", http.extra_body[name], "set by the client from generate.* and "
                    "the request", "fields other than " + ", ".join(sorted(RESERVED_BODY_FIELDS)))
