"""What an extracted unit says about itself: counts, reuse, cost per token, stored error, engine ids.

Checked before it is written: every sample the unit recorded must be in the store, so a manifest
never claims states that are gone. `counts` describe the unit, whatever runs it took: `extracted`
is what this unit put in the store (an earlier, killed run of it included), `reused` what another
unit had stored; figures of the last run alone end in `_this_run` in `extra`. Checked again when
a complete unit would be reused (`lost_samples`): states deleted since are extracted again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from eagle3.artifacts import StageOutput, read_jsonl
from eagle3.errors import Eagle3Error
from eagle3.extract.runner import KEYS_FILE, UnitJob
from eagle3.layer_ids import ENGINES, engine_aux_layer_ids
from eagle3.states import formats
from eagle3.states.store import STORE_FILE, HiddenStateStore, job_name

__all__ = ["lost_samples", "unit_summary"]

log = logging.getLogger("eagle3")


def _error_stats(store: HiddenStateStore, rows: list[dict]) -> dict[str, float]:
    """Worst and mean per-token relative error of the stored values over the unit's samples (compact:
    for the teacher, the probability mass its top k leaves out, `teacher_tail_*`)."""
    seen: set[str] = set()
    worst, total, tokens = [0.0, 0.0], [0.0, 0.0], 0
    for row in rows:
        if row["key"] in seen or row["key"] not in store:
            continue
        seen.add(row["key"])
        entry = store.entries[row["key"]]
        tokens += entry.seq_len
        for j in (0, 1):
            worst[j] = max(worst[j], entry.err_max[j])
            total[j] += entry.err_sum[j]
    mean = [t / tokens if tokens else 0.0 for t in total]
    teacher = "teacher_tail" if formats.needs_teacher_head(store.storage_format) else "final"
    return {"aux_max": worst[0], "aux_mean": mean[0], f"{teacher}_max": worst[1], f"{teacher}_mean": mean[1]}


class StatesLost(Eagle3Error):
    """States an extract unit recorded are gone from the store before the unit could be finalized."""


def lost_samples(unit_dir: Path, store_dir: Path) -> list[str]:
    """Ids a complete extract unit recorded whose states its store no longer holds (all of them when
    the store is gone: deleted to free disk, or a root copied without it)."""
    rows = list(read_jsonl(Path(unit_dir) / KEYS_FILE))
    if not (Path(store_dir) / STORE_FILE).is_file():
        return [r["id"] for r in rows]
    store = HiddenStateStore(store_dir)
    return [r["id"] for r in rows if r["key"] not in store]


def unit_summary(job: UnitJob, out: StageOutput, stats: dict[str, Any]) -> dict[str, Any]:
    """The manifest `extra` of an extracted unit, after checking that every sample it recorded is stored.

    Raises:
        StatesLost: A recorded sample is no longer in the store (a shard deleted between a
            killed run and this one): the unit is never finalized over it.
    """
    spec, where = job.spec, job.store_dir
    keys = out.records(KEYS_FILE)
    keys.flush()
    rows = list(read_jsonl(keys.partial_path))
    store = HiddenStateStore(where)
    lost = [r["id"] for r in rows if r["key"] not in store]
    if lost:  # e.g. a shard deleted between a killed run and this one: never finalize a lie
        raise StatesLost(f"{len(lost)} samples this unit recorded are no longer in the store {where} "
                         f"(e.g. {lost[:3]}); rerun with stage=extract force=true to extract them again")
    extracted = [r for r in rows if not r["reused"]]
    tokens = sum(r["seq_len"] for r in rows)
    tokens_extracted = sum(r["seq_len"] for r in extracted)
    bpt = {f: formats.bytes_per_token(f, spec.hidden_size, len(spec.capture_layers)) for f in formats.FORMATS}
    out.count("tokens", tokens)
    out.count("extracted", len(extracted))
    out.count("reused", len(rows) - len(extracted))
    errors = _error_stats(store, rows)
    if stats["orphan_shards"]:
        log.warning("store %s: %d shard files of job %s are not indexed (a killed run); they are ignored",
                    where, stats["orphan_shards"], job_name(job.shard, job.num_shards))
    return {
        "store_dir": str(where),
        "store_fingerprint": spec.fingerprint,
        "store_identity": spec.identity(),
        "job": job_name(job.shard, job.num_shards),
        "storage_format": spec.storage_format,
        "capture_layers": list(spec.capture_layers),
        **{f"{engine}_aux_layer_ids": engine_aux_layer_ids(spec.capture_layers, engine) for engine in ENGINES},
        "bytes_per_token": bpt[spec.storage_format],
        "bytes_per_token_by_format": bpt,
        "samples": len(rows),
        "samples_by_split": {s: sum(r["split"] == s for r in rows) for s in ("train", "eval")},
        "samples_extracted": len(extracted),
        "samples_reused": len(rows) - len(extracted),
        "samples_from_earlier_runs": stats["done_earlier"],  # resumed after a kill / full disk
        "tokens": tokens,
        "tokens_extracted": tokens_extracted,
        "tokens_reused": tokens - tokens_extracted,
        # This run's own work: less than tokens_extracted after a kill (the stored part is kept).
        "tokens_extracted_this_run": stats["tokens_this_run"],
        "unit_store_bytes_estimate": tokens * bpt[spec.storage_format] + len(rows) * formats.SAMPLE_OVERHEAD_BYTES,
        "store_samples_total": len(store),
        # Per-token relative L2 error of what is stored vs what the target computed.
        "reconstruction_error": errors,
        "other_shards": stats["other_shards"],
        "orphan_shards": stats["orphan_shards"],
        # This run's tokens over its wall time from opening the source (loading the target, starting
        # a server) to the last shard; `states_source` has the seconds spent waiting for states alone.
        "extract_tokens_per_s": round(stats["tokens_this_run"] / stats["seconds_this_run"], 1)
        if stats["seconds_this_run"] else None,
        "states_source": stats.get("source"),
        "files": {"keys": KEYS_FILE},
    }
