"""Which config fields a stage output is keyed by, declared once on the schema's fields.

A unit's output directory is named by the fingerprint of its config slice
(`eagle3.artifacts.StageOutput`): two runs with equal slices share it, so a slice must hold every
field that changes what the unit holds and no field that does not (a new port or progress interval
must resume the old output, not start a new one). The schema says which is which, per field:

- unmarked: what the field's node produces (most fields);
- `speed_field`: how fast, not what -- a server's parallelism, kernels, speculation. Keyed only
  where speed is what is measured (stage bench: `fingerprinted(node, speed=True)`);
- `run_field`: where a job runs and how it is watched (ports, timeouts, intervals, workers, notes);
  never keyed;
- `use_field`: how the mixture uses a source's records (its weight, its thinking mode): keyed by
  the stage that acts on it (merge; generate and tokenize), not by the source's identity (prep).

The marks are set by the fields' constructors (`eagle3.config.fields`); `fingerprinted` reads them;
a stage composes its slice from typed sections with it and never removes keys by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eagle3.config.fields import RUN, SLICE_MARK, SPEED, USE

__all__ = ["fingerprinted"]


def fingerprinted(node: Any, *, speed: bool = False) -> Any:
    """`node` as plain data, without the fields its schema marks as not shaping an output.

    Args:
        node: A schema dataclass (or a list / dict / scalar of them).
        speed: Keep the `speed_field`s too (stage bench, which measures speed).
    """
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        kept = {}
        for f in dataclasses.fields(node):
            mark = f.metadata.get(SLICE_MARK)
            if mark in (RUN, USE) or (mark == SPEED and not speed):
                continue
            kept[f.name] = fingerprinted(getattr(node, f.name), speed=speed)
        return kept
    if isinstance(node, dict):
        return {str(k): fingerprinted(v, speed=speed) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [fingerprinted(v, speed=speed) for v in node]
    return node
