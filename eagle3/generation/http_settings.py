"""What the HTTP generation client needs, as plain data built from `generate.http` (no I/O).

The values come from the composed config (or, with `HTTPSettings.defaults`, from the schema's
defaults in `eagle3.config.schema.GenerateHTTPConfig`): this module holds no default of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ENDPOINT_STRATEGIES", "HTTPSettings", "LEAST_BUSY", "Partition", "ROUND_ROBIN"]

#: `generate.http.endpoint_strategy`: fewest requests in flight (ties in turn), or strictly in turn.
LEAST_BUSY, ROUND_ROBIN = "least_busy", "round_robin"
ENDPOINT_STRATEGIES = (LEAST_BUSY, ROUND_ROBIN)


@dataclass(frozen=True)
class Partition:
    """Requests with estimated prompt tokens <= `max_context` (None: any) share `concurrency` slots."""

    max_context: Optional[int]
    concurrency: int

    @property
    def name(self) -> str:
        return f"<={self.max_context}" if self.max_context is not None else "any"


@dataclass(frozen=True)
class HTTPSettings:
    """Endpoints, partitions, retry policy and request knobs of one client (see GenerateHTTPConfig).

    Attributes:
        urls: Base URLs of the endpoints.
        backend: `generate.backend` (vllm | sglang), for messages and the manifest.
        model: Served model name; None = ask /v1/models.
        fallback_model: The name used when the server cannot say (no /v1/models): model.path.
    """

    urls: tuple[str, ...]
    backend: str
    model: Optional[str]
    fallback_model: str
    partitions: tuple[Partition, ...]
    concurrency_per_endpoint: bool
    endpoint_strategy: str
    chars_per_token: float
    request_timeout_s: float
    connect_timeout_s: float
    max_attempts: int
    backoff_s: float
    max_backoff_s: float
    max_consecutive_failures: int
    connect_wait_s: float
    thinking_keys: tuple[str, ...]
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)

    def sorted_partitions(self) -> tuple[Partition, ...]:
        """Smallest limit first, the unlimited one last."""
        return tuple(sorted(self.partitions, key=lambda p: (p.max_context is None, p.max_context or 0)))

    @classmethod
    def from_config(cls, http: Any, *, urls: Sequence[str], backend: str, fallback_model: str) -> HTTPSettings:
        """Settings from a `generate.http` node (composed config or schema defaults)."""
        from omegaconf import OmegaConf

        from eagle3.config_dict import config_dict

        plain = config_dict(http, resolve=True) if OmegaConf.is_config(http) else dict(http)
        return cls(
            urls=tuple(str(u) for u in urls), backend=str(backend), model=plain["model"],
            fallback_model=str(fallback_model),
            partitions=tuple(Partition(p["max_context"], int(p["concurrency"])) for p in plain["partitions"]),
            concurrency_per_endpoint=bool(plain["concurrency_per_endpoint"]),
            endpoint_strategy=str(plain["endpoint_strategy"]), chars_per_token=float(plain["chars_per_token"]),
            request_timeout_s=float(plain["request_timeout_s"]), connect_timeout_s=float(plain["connect_timeout_s"]),
            max_attempts=int(plain["max_attempts"]), backoff_s=float(plain["backoff_s"]),
            max_backoff_s=float(plain["max_backoff_s"]),
            max_consecutive_failures=int(plain["max_consecutive_failures"]),
            connect_wait_s=float(plain["connect_wait_s"]), thinking_keys=tuple(plain["thinking_keys"]),
            chat_template_kwargs=dict(plain["chat_template_kwargs"] or {}),
            extra_body=dict(plain["extra_body"] or {}))

    @classmethod
    def defaults(cls, urls: Sequence[str], backend: str = "vllm", fallback_model: str = "default") -> HTTPSettings:
        """The schema's defaults for `urls` (scripts and tests that compose no config)."""
        from omegaconf import OmegaConf

        from eagle3.config.schema import GenerateHTTPConfig

        return cls.from_config(OmegaConf.structured(GenerateHTTPConfig), urls=urls, backend=backend,
                               fallback_model=fallback_model)
