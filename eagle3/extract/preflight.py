"""Disk preflight: will the store fit, decided before a multi-hour model load, not after.

At Kimi scale the store is the dominant cost (~56 KiB per token in bf16: ~92 GB per 1K
samples, ~9.2 TB for the 100K plan), and the original effort learnt its size from a full disk.
So the stage estimates bytes = sum of tokens to extract x bytes per token (+ a per-sample
overhead for shard headers and index lines), compares them with the free space on the store's
filesystem minus `extract.disk_margin_gb`, and refuses with one line carrying both numbers.
`extract.assume_free_bytes` replaces the measured free space (planning for another machine,
and tests). `extract.dry_run=true` prints the plan's estimate without data or a model.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from eagle3.artifacts import format_bytes
from eagle3.errors import NoSpaceLeft
from eagle3.states import formats

GB = 1_000_000_000


class DiskSpaceError(NoSpaceLeft):
    """The store would not fit; the message is one line with the need and the space."""


@dataclass(frozen=True)
class Estimate:
    """Bytes a set of samples takes in one format."""

    fmt: str
    samples: int
    tokens: int
    bytes_per_token: int

    @property
    def total(self) -> int:
        return self.tokens * self.bytes_per_token + self.samples * formats.SAMPLE_OVERHEAD_BYTES


def estimate(fmt: str, samples: int, tokens: int, hidden: int, n_capture: int) -> Estimate:
    return Estimate(fmt, samples, tokens, formats.bytes_per_token(fmt, hidden, n_capture))


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: Path, assume_free_bytes: Optional[int]) -> tuple[int, str]:
    """(free bytes, where they were measured) for the filesystem that will hold `path`."""
    if assume_free_bytes is not None:
        return int(assume_free_bytes), "extract.assume_free_bytes"
    where = _existing(Path(path))
    return shutil.disk_usage(where).free, str(where)


def check_disk(need: Estimate, store_dir: Path, margin_gb: float, assume_free_bytes: Optional[int]) -> str:
    """Refuse (DiskSpaceError) unless `need` fits in free space minus the margin.

    Returns:
        A one-line summary of the check, for the log.
    """
    free, where = free_space(store_dir, assume_free_bytes)
    margin = int(margin_gb * GB)
    available = max(free - margin, 0)
    numbers = (f"need {format_bytes(need.total)} ({need.total:,} B) for {need.samples:,} samples / "
               f"{need.tokens:,} tokens in {need.fmt} ({need.bytes_per_token:,} B/token), available "
               f"{format_bytes(available)} ({available:,} B = {free:,} B free on {where} minus "
               f"extract.disk_margin_gb={margin_gb:g})")
    if need.total > available:
        raise DiskSpaceError(f"extract: not enough disk for the hidden-state store: {numbers}; free space, "
                             "use extract.storage_format=fp8, a smaller data.scale, or split the work "
                             "across machines with extract.shard/num_shards")
    return f"disk preflight ok: {numbers}"


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def plan_report(*, model: str, hidden: int, capture_layers: list[int], scale: Optional[int], eval_size: int,
                tokens_per_sample: int, store_dir: Path, margin_gb: float,
                assume_free_bytes: Optional[int], num_shards: int = 1) -> str:
    """The dry run's text: bytes/token and totals per format for the configured plan."""
    n_capture = len(capture_layers)
    lines = [f"extract dry run: {model} (hidden {hidden:,}; capture {list(capture_layers)} = {n_capture} "
             f"aux layers + final state per token)"]
    if scale is None:
        lines.append("  data.scale is null (all samples): sizes below are per 1,000 samples")
        samples, detail = 1000, "1,000 samples"
    else:
        samples = scale + eval_size
        detail = f"{samples:,} samples (data.scale {scale:,} train + {eval_size:,} eval)"
    tokens = samples * tokens_per_sample
    lines.append(f"  {detail} x {tokens_per_sample:,} tokens/sample = {tokens:,} tokens "
                 f"(ASSUMED mean length, extract.assumed_tokens_per_sample; the default 1,600 "
                 f"reproduces ~92 GB per 1K samples in bf16 at H=7168, as measured for Kimi-K2.5)")
    free, where = free_space(store_dir, assume_free_bytes)
    available = max(free - int(margin_gb * GB), 0)
    for fmt in formats.FORMATS:
        est = estimate(fmt, samples, tokens, hidden, n_capture)
        per_1k = estimate(fmt, 1000, 1000 * tokens_per_sample, hidden, n_capture).total
        train = "" if scale is None else (
            f"; {format_bytes(estimate(fmt, scale, scale * tokens_per_sample, hidden, n_capture).total)} "
            f"for the {scale:,} train samples alone")
        fits = "fits" if est.total <= available else "does NOT fit"
        lines.append(f"  {fmt}: {est.bytes_per_token:,} B/token ({_kib(est.bytes_per_token)}) -> "
                     f"{format_bytes(est.total)} ({est.total:,} B){train}; {format_bytes(per_1k)} per 1K "
                     f"samples; {fits} in {format_bytes(available)} available")
    lines.append(f"  compact stores the captures in int8 (one scale per {formats.COMPACT_GROUP} values) and the "
                 f"teacher as its top {formats.COMPACT_TOPK} log-probabilities instead of the final state")
    if num_shards > 1:
        lines.append(f"  split over {num_shards} extract.shard jobs: ~1/{num_shards} of the tokens each")
    lines.append(f"  store filesystem: {format_bytes(free)} free at {where}, margin "
                 f"extract.disk_margin_gb={margin_gb:g}; store directory {store_dir}")
    return "\n".join(lines)
