"""The extraction loop of one merge unit: plan the missing samples, preflight, capture, store.

Order of work, chosen so every failure happens as early and as cheaply as possible:
1. read the merged records of both splits; keep this job's slot (`shard_of(key) == shard`);
   samples already in the store are reused after checking their stored ids (no model needed);
2. disk preflight over the tokens still to extract (before the model loads);
3. open the state source (`eagle3.extract.sources`: the target in process, or vLLM servers) only
   if something is left; run length-sorted token-budget batches, reject samples the source has no
   states for and non-finite ones, write one shard per batch and index it.

Per batch the order is: shard (atomic) + index line, then the unit's `keys.jsonl` lines and
rejects. A kill between the two leaves stored samples that the rerun finds and does not extract
again; the index line names the unit they were extracted for, so the rerun still counts them as
extracted by this unit (not reused), and a killed-and-resumed unit's manifest counts equal an
uninterrupted run's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from eagle3.artifacts import StageOutput, read_jsonl
from eagle3.data.mixture import SPLIT_FILES
from eagle3.extract.capture import plan_batches
from eagle3.extract.preflight import check_disk, estimate
from eagle3.states import codec, formats
from eagle3.states.store import HiddenStateStore, StoreSpec, job_name, shard_of
from eagle3.states.writer import StoreWriter

log = logging.getLogger("eagle3")
KEYS_FILE = "keys.jsonl"


@dataclass
class Work:
    """One distinct token sequence to extract, and the sample ids that share it."""

    key: str
    input_ids: np.ndarray  # [T] int32: 4 B/token instead of ~36 for a list of Python ints
    samples: list[tuple[Any, str]] = field(default_factory=list)  # (id, split)


@dataclass
class UnitJob:
    """Everything the loop needs, resolved from the config by the stage.

    Attributes:
        open_source: Opens the state source for the block (called only when something must be
            extracted; `eagle3.extract.sources.open_states`).
        save_file: Shard writer override (fault injection in tests); None = safetensors.
        teacher_head: Loads the target lm_head `[V, H]`, which formats that store the teacher's
            top k (`formats.needs_teacher_head`) apply to the final states; read from the
            checkpoint's safetensors, not from the loaded target, so every source gets it alike.
    """

    merged_dir: Path
    store_dir: Path
    spec: StoreSpec
    shard: int
    num_shards: int
    batch_tokens: int
    vocab_size: int
    disk_margin_gb: float
    assume_free_bytes: Optional[int]
    open_source: Callable[[], AbstractContextManager[Any]]
    save_file: Optional[Callable[..., None]] = None
    teacher_head: Optional[Callable[[], torch.Tensor]] = None


def _records(merged_dir: Path) -> Iterator[tuple[str, dict]]:
    for split, name in SPLIT_FILES.items():
        for record in read_jsonl(merged_dir / name):
            yield split, record


def record_problem(record: dict, vocab_size: int) -> Optional[tuple[str, str]]:
    """(reason, detail) if a merged record cannot be extracted faithfully, else None."""
    ids = record.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return "bad_input_ids", "input_ids must be a non-empty list of ints"
    n_mask = len(record.get("loss_mask") or [])
    if n_mask != len(ids):
        return "loss_mask_misaligned", f"loss_mask has {n_mask} entries, input_ids {len(ids)}"
    if record.get("seq_len", len(ids)) != len(ids):
        return "seq_len_mismatch", f"seq_len {record.get('seq_len')} != {len(ids)} input_ids"
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        return "token_out_of_range", f"{len(bad)} ids outside [0, {vocab_size}), e.g. {bad[0]}"
    return None


def _nonfinite(aux: torch.Tensor, final: torch.Tensor, n_capture: int) -> Optional[str]:
    """Which captured tensors hold NaN/Inf (`aux [T, C*H]`, `final [T, H]`), or None."""
    hidden = final.shape[-1]
    bad = [f"capture#{j}" for j in range(n_capture)
           if not torch.isfinite(aux[:, j * hidden:(j + 1) * hidden]).all()]
    if not torch.isfinite(final).all():
        bad.append("final")
    return ", ".join(bad) or None


def run_extraction(job: UnitJob, out: StageOutput) -> dict[str, Any]:
    """Extract (or reuse) every sample of the unit in this job's slot; returns stats."""
    keys = out.records(KEYS_FILE)
    writer = StoreWriter(job.store_dir, job.spec, job_name(job.shard, job.num_shards), save_file=job.save_file)
    stats = {"other_shards": 0, "tokens_this_run": 0, "seconds_this_run": 0.0, "orphan_shards": 0,
             "done_earlier": 0}
    with writer:
        store = HiddenStateStore(job.store_dir)
        todo: dict[str, Work] = {}
        n_slot = 0
        for split, record in _records(job.merged_dir):
            rid = record["id"]
            ids = record.get("input_ids")
            key = job.spec.key(ids) if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
            if key is not None and shard_of(key, job.num_shards) != job.shard:
                stats["other_shards"] += 1
                continue
            out.count_in()
            n_slot += 1
            if out.is_done(rid):  # written or rejected by an earlier (killed) run of this unit
                stats["done_earlier"] += 1
                continue
            problem = record_problem(record, job.vocab_size)
            if problem is not None:
                out.reject(rid, problem[0], problem[1], split=split)
                continue
            assert key is not None  # record_problem refuses the records whose input_ids are not token ids
            if key in store:
                if store.input_ids(key).tolist() != ids:
                    out.reject(rid, "stored_ids_mismatch", f"store entry {key} holds other token ids", split=split)
                else:
                    # Stored by this same unit (a killed earlier run) is this unit's extraction, so a
                    # resumed unit counts what an uninterrupted one would; only another's is reuse.
                    reused = store.entries[key].unit != out.dir.name
                    keys.write({"id": rid, "key": key, "split": split, "seq_len": len(ids), "reused": reused})
            else:
                todo.setdefault(key, Work(key, np.asarray(ids, dtype=np.int32))).samples.append((rid, split))

        work = sorted(todo.values(), key=lambda w: (-len(w.input_ids), w.key))  # longest first
        need = estimate(job.spec.storage_format, len(work), sum(len(w.input_ids) for w in work),
                        job.spec.hidden_size, len(job.spec.capture_layers))
        log.info("extract: %d samples to extract (%d tokens), %d already stored or done",
                 len(work), need.tokens, n_slot - sum(len(w.samples) for w in work))
        if work:
            log.info(check_disk(need, job.store_dir, job.disk_margin_gb, job.assume_free_bytes))
            _extract(job, work, writer, keys, out, stats)
        store.refresh()
        stats["orphan_shards"] = len(writer.orphans(e.shard for e in store.entries.values()))
    return stats


def _extract(job: UnitJob, work: list[Work], writer: StoreWriter, keys, out: StageOutput, stats: dict) -> None:
    n_capture = len(job.spec.capture_layers)
    batches = plan_batches([len(w.input_ids) for w in work], job.batch_tokens)
    head = None
    if formats.needs_teacher_head(job.spec.storage_format):  # before the source: the cheaper failure first
        if job.teacher_head is None:
            raise ValueError(f"storage format {job.spec.storage_format} needs the target lm_head "
                             "(UnitJob.teacher_head)")
        head = job.teacher_head()
    t0, last_log, done_tokens = time.perf_counter(), time.perf_counter(), 0
    with job.open_source() as source:
        for b, batch in enumerate(batches):
            items = [work[i] for i in batch]
            results = source.states([w.input_ids for w in items])
            encoded: dict[str, tuple[codec.Encoded, int]] = {}
            rejected: list[tuple[Work, str, str]] = []
            for w, result in zip(items, results, strict=True):
                if isinstance(result[0], str):  # (reason, detail): the source has no states for it
                    rejected.append((w, result[0], result[1]))
                    continue
                aux, final = result  # [n, C*H], [n, H]
                bad = _nonfinite(aux, final, n_capture)
                if bad:
                    rejected.append((w, "nonfinite_hidden_states", f"NaN/Inf in {bad}"))
                    continue
                ids = torch.as_tensor(w.input_ids)
                encoded[w.key] = (codec.encode(aux, final, ids, job.spec.storage_format, head=head), len(w.input_ids))
            if encoded:
                writer.write_shard(encoded, unit=out.dir.name)
            for w in items:
                for rid, split in w.samples:
                    if w.key in encoded:
                        keys.write({"id": rid, "key": w.key, "split": split, "seq_len": len(w.input_ids),
                                    "reused": False})
            for w, reason, detail in rejected:
                for rid, split in w.samples:
                    out.reject(rid, reason, detail, split=split)
            done_tokens += sum(len(w.input_ids) for w in items)
            now = time.perf_counter()
            if now - last_log > 30 or b == len(batches) - 1:
                last_log = now
                log.info("extract: batch %d/%d, %d tokens, %.0f tok/s (%s)", b + 1, len(batches), done_tokens,
                         done_tokens / max(now - t0, 1e-9), source.name)
        stats["source"] = source.describe()
    stats["tokens_this_run"] = done_tokens
    stats["seconds_this_run"] = round(time.perf_counter() - t0, 3)
