"""The choices and partition order of the HTTP generation client, next to `generate.http`'s schema.

The client reads `eagle3.config.schema.GenerateHTTPConfig` itself; this module holds what is
derived from it (no default of its own) and is torch- and aiohttp-free, so the config rules can
import the strategy names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from eagle3.config.client_schema import GeneratePartitionConfig

__all__ = ["LEAST_BUSY", "ROUND_ROBIN", "partition_name", "sorted_partitions"]

#: `generate.http.endpoint_strategy`: fewest requests in flight (ties in turn), or strictly in turn.
LEAST_BUSY, ROUND_ROBIN = "least_busy", "round_robin"


def partition_name(max_context: Optional[int]) -> str:
    """How the client's counters name the partition of prompts up to `max_context` tokens (None: any)."""
    return f"<={max_context}" if max_context is not None else "any"


def sorted_partitions(partitions: Sequence[GeneratePartitionConfig]) -> tuple[GeneratePartitionConfig, ...]:
    """Smallest limit first, the unlimited one last: a request takes the first it fits."""
    return tuple(sorted(partitions, key=lambda p: (p.max_context is None, p.max_context or 0)))
