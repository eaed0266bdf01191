"""Reuse of batches an earlier `generate` output already answered, under the same settings.

Why: prep's sample of N prompts is a prefix of its sample of any larger N (key order), but a
larger `num_samples` is another prep output and so another generate output. Without this, going
from a 10K to a 100K regeneration would pay again for the first 10K conversations.

When it is exact: batches are consecutive chunks of prep's order and each call is seeded from
the batch's ids (`eagle3.generation.regenerate.batch_seed`), so a batch with the same ids, in
the same order, with the same prompt records, under the same generate config (the output's
fingerprinted config: target weights, sampling, thinking, seed, batch size) is exactly what a
fresh run would produce -- the same assumption resume after a kill rests on. A batch that
differs in anything (the last, partial batch of the smaller sample, say) is generated anew.

Only complete earlier outputs are read (a running one is locked by its writer). Their output
records are indexed by byte offset, not held in memory: a 100K-conversation file with long
reasoning is gigabytes. A reject an earlier version wrote for a server failure
(`RETRYABLE_REJECT_REASONS`) is not an answer: it is never copied, so its batch is not held and
is generated anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import (
    MANIFEST_NAME,
    REJECTS_NAME,
    STATUS_COMPLETE,
    Manifest,
    read_jsonl,
)
from eagle3.generation.regenerate import Outcome
from eagle3.generation.types import RETRYABLE_REJECT_REASONS

log = logging.getLogger("eagle3")


def record_digest(record: dict[str, Any]) -> str:
    """Content hash of a prompt record (the same id with other content is another prompt)."""
    text = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def batch_key(batch: Sequence[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """What makes two batches generate the same: their records' ids and contents, in order."""
    return tuple((str(r["id"]), record_digest(r)) for r in batch)


def chunks(records: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    """Consecutive chunks of `size` (the last may be shorter): the stage's batches."""
    batch: list[dict[str, Any]] = []
    for record in records:
        batch.append(record)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass
class _Earlier:
    """One complete earlier output: its batches and where each id's outcome lies."""

    dir: Path
    output_file: Path
    offsets: dict[str, int] = field(default_factory=dict)  # id -> byte offset in output_file
    rejects: dict[str, dict[str, Any]] = field(default_factory=dict)
    batches: set[tuple[tuple[str, str], ...]] = field(default_factory=set)

    def outcomes(self, ids: Sequence[str]) -> Optional[list[Outcome]]:
        """Each id's written record or reject (no tokens generated now), or None if one is missing."""
        if not all(i in self.offsets or i in self.rejects for i in ids):
            return None
        found = []
        with self.output_file.open("rb") as handle:
            for rid in ids:
                if rid in self.offsets:
                    handle.seek(self.offsets[rid])
                    found.append(Outcome(id=rid, record=json.loads(handle.readline())))
                else:
                    line = self.rejects[rid]
                    found.append(Outcome(id=rid, reason=line["reason"], detail=line.get("detail"),
                                         generation=line.get("generation") or {}))
        return found


def _index_lines(path: Path) -> dict[str, int]:
    offsets: dict[str, int] = {}
    with path.open("rb") as handle:
        position = 0
        for line in handle:
            if line.strip():
                offsets[str(json.loads(line)["id"])] = position
            position += len(line)
    return offsets


class EarlierGenerations:
    """Batches that complete earlier outputs of one generate unit answered under this config.

    Args:
        stage_dir: The stage's directory under the artifact root (`<root>/generate`).
        unit: The unit (dataset source) name.
        config: This output's fingerprinted config; only outputs with an equal one are used.
        exclude: This output's own directory.
        input_name: Input key of the prompt file in the manifests (`conversations`).
        file_name: The name of the prompt file and of the output file.
        batch_size: The stage's batch size (part of `config`, so equal in every candidate).
    """

    def __init__(self, stage_dir: Path, unit: str, config: dict[str, Any], exclude: Path,
                 input_name: str, file_name: str, batch_size: int) -> None:
        self._earlier: list[_Earlier] = []
        candidates = sorted(stage_dir.glob(f"{unit}-*/{MANIFEST_NAME}"), key=lambda p: p.stat().st_mtime,
                            reverse=True)  # newest first
        for manifest_path in candidates:
            directory = manifest_path.parent
            if directory.resolve() == exclude.resolve():
                continue
            try:
                manifest = Manifest.load(directory)
            except Exception as exc:  # noqa: BLE001 - a damaged neighbour must not stop this unit
                log.warning("generate %s: not reusing %s: %s", unit, directory, exc)
                continue
            if manifest.status != STATUS_COMPLETE or manifest.config != config or manifest.name != unit:
                continue
            prompts = Path(manifest.inputs.get(input_name, {}).get("path", "")) / file_name
            output = directory / file_name
            if not prompts.is_file() or not output.is_file():
                continue
            earlier = _Earlier(dir=directory, output_file=output, offsets=_index_lines(output))
            rejects = directory / REJECTS_NAME
            if rejects.is_file():
                earlier.rejects = {str(r["id"]): r for r in read_jsonl(rejects)
                                   if r.get("reason") not in RETRYABLE_REJECT_REASONS}
            earlier.batches = {batch_key(b) for b in chunks(read_jsonl(prompts), batch_size)}
            self._earlier.append(earlier)
        self.used: dict[str, int] = {}  # earlier output dir -> conversations taken from it

    def __bool__(self) -> bool:
        return bool(self._earlier)

    @property
    def dirs(self) -> list[Path]:
        return [e.dir for e in self._earlier]

    def _held(self, batch: Sequence[dict[str, Any]]) -> bool:
        ids = [str(r["id"]) for r in batch]
        if len(set(ids)) != len(ids):
            return False
        key = batch_key(batch)
        return any(key in e.batches and all(i in e.offsets or i in e.rejects for i in ids) for e in self._earlier)

    def covers(self, source: Path, batch_size: int, done: Callable[[str], bool] = lambda rid: False) -> bool:
        """Whether every batch of `source` is done already or held by an earlier output.

        Then the stage needs no model at all (no server launch, no weights loaded).
        """
        return all(all(done(str(r["id"])) for r in batch) or self._held(batch)
                   for batch in chunks(read_jsonl(source), batch_size))

    def copyable(self, source: Path, batch_size: int) -> int:
        """How many conversations of `source` a run would copy rather than generate."""
        return sum(len(batch) for batch in chunks(read_jsonl(source), batch_size) if self._held(batch))

    def lookup(self, batch: Sequence[dict[str, Any]]) -> Optional[list[Outcome]]:
        """The outcomes of `batch` in an earlier output that ran this very batch, else None."""
        key = batch_key(batch)
        for earlier in self._earlier:
            if key in earlier.batches:
                found = earlier.outcomes([rid for rid, _ in key])
                if found is not None:
                    self.used[str(earlier.dir)] = self.used.get(str(earlier.dir), 0) + len(found)
                    return found
        return None
