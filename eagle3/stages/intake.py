"""Where the data dies: a unit that kept none of its input stops the job, one that lost most of it warns.

A stage that rejects every record of a source (or has none to read) used to pass the emptiness on:
a prompt-only source whose every record prep refused went through generate (a server launched for
no prompts) and tokenize, and the job ended at merge advising a smaller eval split. Each stage that
consumes records now says so where it happens, in one line (`eagle3.errors.NothingKept`, exit 3):
the counts, the top reject reasons, one reject's `file:line` (or id) and detail, and where every
reject is. A unit that lost more than `data.warn_reject_fraction` of its records but kept some
gets a WARNING line beside its summary instead.

What a stage consumes (`Intake`) is declared with it (`eagle3.stages.base.UnitStage.intake`);
stages whose units may rightly end empty (eval with no prompts, demo_data) declare none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import REJECTS_NAME, JsonlError, Manifest, read_jsonl
from eagle3.artifacts.records import PARTIAL_SUFFIX

__all__ = ["Intake", "empty_inputs", "loss_warning", "nothing_kept", "stop_line", "unit_part"]

_TOP_REASONS = 3
_DETAIL_CHARS = 200
_SCAN_LINES = 100_000  # how far into rejects.jsonl an example of the top reason is looked for


@dataclass(frozen=True)
class Intake:
    """What a stage's units consume, for the line that stops it when a unit keeps none of it.

    Attributes:
        noun: What is counted (`records`, `conversations`, `samples`).
        unit_kind: What a unit is (`source`, `mixture`), as the line names it (`source=my_prompts`).
        fix: The advice that ends the line (where the user looks to fix it).
        chosen: Reject reasons that are the config's choice, not lost data (prep's `not_sampled`):
            they never count towards the loss warning.
    """

    noun: str
    unit_kind: str
    fix: str
    chosen: tuple[str, ...] = ()


def nothing_kept(counts: Mapping[str, Any]) -> bool:
    """Whether a unit's counts say it kept none of its input (nothing read counts too)."""
    return not counts.get("out", 0)


def _one_line(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= _DETAIL_CHARS else flat[:_DETAIL_CHARS - 3] + "..."


def _rejects_path(manifest: Manifest) -> Optional[Path]:
    if manifest.dir is None:
        return None
    final = Path(manifest.dir) / REJECTS_NAME
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    return final if final.is_file() else partial if partial.is_file() else None


def _example(manifest: Manifest, reason: str) -> Optional[str]:
    """One reject of `reason`, as `file:line: detail` (the raw record's place) or `id <id>: detail`."""
    path = _rejects_path(manifest)
    if path is None:
        return None
    try:
        for lineno, record in enumerate(read_jsonl(path), 1):
            if record.get("reason") == reason:
                detail = _one_line(record.get("detail") or reason)
                where = record.get("where")
                if where:  # prep's readers already start some details with the place
                    return detail if detail.startswith(str(where)) else f"{where}: {detail}"
                return f"id {record.get('id')!r} ({path.name}:{lineno}): {detail}"
            if lineno >= _SCAN_LINES:
                break
    except (OSError, JsonlError):
        pass  # the example is a courtesy: the line that stops or warns must not fail over it
    return None  # counted in bulk (count_reject): no record to show


def _losses(counts: Mapping[str, Any], chosen: tuple[str, ...]) -> dict[str, int]:
    """Rejects by reason, largest first, without the config's own choices (sampling)."""
    rejected = {k: int(v) for k, v in (counts.get("rejected") or {}).items() if k not in chosen and v}
    return dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))


def _reasons_text(manifest: Manifest, reasons: dict[str, int]) -> str:
    """`rejected 800: assistant_first 790, too_long 10 (e.g. /data/q.jsonl:1: ...)`."""
    if not reasons:
        return "rejected 0"
    top = list(reasons.items())[:_TOP_REASONS]
    text = f"rejected {sum(reasons.values()):,}: " + ", ".join(f"{reason} {n:,}" for reason, n in top)
    if len(reasons) > _TOP_REASONS:
        text += f" and {len(reasons) - _TOP_REASONS} more reason(s)"
    example = _example(manifest, top[0][0])
    return text + (f" (e.g. {example})" if example else "")


def _where_rejects(manifest: Manifest) -> str:
    path = _rejects_path(manifest)
    return f"; every reject with its reason: {path}" if path is not None else ""


def unit_part(manifest: Manifest, intake: Intake) -> str:
    """What a unit that kept nothing says in the stop line: counts, top reasons, an example, the rejects file."""
    counts = manifest.counts
    n_in = int(counts.get("in", 0))
    if not n_in:
        return f"read 0 {intake.noun}: there was nothing to keep"
    reasons = _losses(counts, ())
    return (f"0 of {n_in:,} {intake.noun} kept; {_reasons_text(manifest, reasons)}"
            f"{_where_rejects(manifest)}")


def stop_line(stage: str, intake: Intake, parts: dict[str, str], n_units: int) -> str:
    """The one line that stops `stage`: one part per unit that kept nothing (`unit -> part`)."""
    kind = intake.unit_kind
    if len(parts) == 1:
        [(unit, part)] = parts.items()
        return f"stage={stage} {kind}={unit}: {part}. {intake.fix}, then rerun."
    each = "; ".join(f"{kind}={unit}: {part}" for unit, part in parts.items())
    return f"stage={stage}: {len(parts)} of {n_units} {kind}s kept nothing -- {each}. {intake.fix}, then rerun."


def _emptied_at(manifest: Manifest, depth: int = 0) -> Manifest:
    """The stage upstream of an empty output where the records died (the first one that read some)."""
    if manifest.counts.get("in", 0) or not manifest.inputs or depth > 16:
        return manifest
    for name in manifest.inputs:
        try:
            upstream = Manifest.load(manifest.input_dir(name))
        except (OSError, ValueError):
            continue
        if nothing_kept(upstream.counts):
            return _emptied_at(upstream, depth + 1)
    return manifest


def empty_inputs(inputs: Mapping[str, Manifest]) -> Optional[str]:
    """The stop part for a unit whose every input is empty, naming the stage that emptied each; else None.

    A stage that stops on an empty unit never hands one on, so this meets only outputs written before
    it did; it keeps such a unit from running on nothing (a merge would advise a smaller data.scale).
    """
    if not inputs or not all(nothing_kept(m.counts) for m in inputs.values()):
        return None
    said = []
    for manifest in inputs.values():
        died = _emptied_at(manifest)
        reasons = _losses(died.counts, ())
        said.append(f"stage {died.stage} kept 0 of {int(died.counts.get('in', 0)):,} for {died.name} "
                    f"({_reasons_text(died, reasons)}{_where_rejects(died)})")
    return "nothing to read: " + "; ".join(said)


def loss_warning(stage: str, manifest: Manifest, intake: Intake, fraction: float) -> Optional[str]:
    """The WARNING line of a unit that lost more than `fraction` of its input but kept some, else None."""
    counts = manifest.counts
    n_in = int(counts.get("in", 0))
    reasons = _losses(counts, intake.chosen)
    lost = sum(reasons.values())
    if not n_in or not lost or lost / n_in <= fraction:
        return None
    return (f"[{stage}] {intake.unit_kind}={manifest.name} lost {lost / n_in:.0%} of its {intake.noun} "
            f"({lost:,} of {n_in:,}; data.warn_reject_fraction={fraction:g}): {_reasons_text(manifest, reasons)}"
            f"{_where_rejects(manifest)}")
