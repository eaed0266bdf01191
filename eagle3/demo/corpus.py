"""Load the committed demo corpus and split it into train and held-out modules.

Everything in :mod:`eagle3.demo` reads the committed ``demo_corpus.jsonl.gz`` (built by
``scripts/build_demo_corpus.py``) instead of the running interpreter's stdlib, so the demo target,
its evaluation and the demo datasets do not change with the Python version.

The split is by *module*, not by function: methods of one class share vocabulary and code, so a
per-function split would leak near-duplicates into the held-out set and flatter the target.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"
CORPUS_PATH = ASSETS / "demo_corpus.jsonl.gz"
DEMO_TARGET_PATH = ASSETS / "demo_target"

# Fraction of the hash space held out. The hash is uneven over only ~100 modules: in practice
# 22 of 99 modules and ~18% of functions land in the held-out split.
HELD_OUT_PERCENT = 15
_SPLIT_SALT = "eagle3-demo:"


@dataclass(frozen=True)
class Corpus:
    """The corpus header (provenance) and its records, in file order."""

    header: dict
    records: tuple[dict, ...]


def is_held_out(module: str) -> bool:
    """Whether a module belongs to the held-out split (stable: a salted SHA-256, not ``hash``)."""
    digest = hashlib.sha256((_SPLIT_SALT + module).encode("utf-8")).hexdigest()
    return int(digest, 16) % 100 < HELD_OUT_PERCENT


@functools.lru_cache(maxsize=4)
def load_corpus(path: str | Path = CORPUS_PATH) -> Corpus:
    """Read the corpus once per process; records are treated as read-only."""
    header, records = {}, []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("__header__"):
                header = rec
            else:
                records.append(rec)
    return Corpus(header=header, records=tuple(records))


def split_records(split: str, path: str | Path = CORPUS_PATH) -> tuple[dict, ...]:
    """Records of ``"train"`` or ``"held_out"`` modules, in the corpus's sorted order."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    want = split == "held_out"
    return tuple(r for r in load_corpus(path).records if is_held_out(r["module"]) == want)


def record_key(record: dict) -> str:
    """The dotted name users see (``json.dumps``, ``queue.Queue.put``)."""
    return f"{record['module']}.{record['qualname']}"


def find_source(path: str, symbol: str, split: str = "held_out") -> str | None:
    """Back the demo ``read_file`` tool: the snippet of ``symbol`` in ``path``, if the split has it.

    Falls back to a symbol match in any file of the split, because a small model often gets the
    file right but the package layout (``json/__init__.py`` vs ``json.py``) wrong.
    """
    records = split_records(split)
    for rec in records:
        if rec["path"] == path and symbol in (rec["qualname"], record_key(rec)):
            return rec["source"]
    for rec in records:
        if symbol in (rec["qualname"], record_key(rec)):
            return rec["source"]
    return None
