"""Tokenizing a conversations file over every core: the work behind stage `tokenize`.

Rendering and masks are `eagle3.data.render`; this module runs them over a spawn-safe process pool
whose workers load the tokenizer once, fed chunks of conversations through an ordered, bounded
window (output order is the input order whatever the number of workers, and memory stays flat
however long the input is). Resume is by id: ids an earlier, killed run already wrote or rejected
are skipped before dispatch.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import StageOutput, progress, read_jsonl
from eagle3.data.render import Reject, RenderSettings, tokenize_conversation
from eagle3.threads import job_cores

__all__ = ["TokenizerSpec", "load_tokenizer", "resolve_workers", "run_pool", "tokenize_chunk", "tokenize_unit"]


@dataclass(frozen=True)
class TokenizerSpec:
    """How a worker loads the tokenizer (picklable, so it crosses the spawn boundary)."""

    path: str
    revision: Optional[str] = None
    trust_remote_code: bool = False
    cache_dir: Optional[str] = None


def load_tokenizer(spec: TokenizerSpec) -> Any:
    """The target's tokenizer, imported lazily so config-only commands stay light."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.path, revision=spec.revision,
                                         trust_remote_code=spec.trust_remote_code, cache_dir=spec.cache_dir)


_WORKER: dict[str, Any] = {}


def _init_worker(spec: TokenizerSpec, settings: RenderSettings) -> None:
    # One process per core already; the tokenizer's own thread pool would oversubscribe them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["tokenizer"] = load_tokenizer(spec)
    _WORKER["settings"] = settings


def tokenize_chunk(tokenizer: Any, settings: RenderSettings, chunk: list[dict]) -> list[tuple]:
    """Outcomes of a chunk: ``("ok", record)`` or ``("reject", id, reason, detail, source)``.

    Any exception is a reject of that one conversation (never a crash of the job); an exception
    that is not a :class:`Reject` is labelled ``tokenize_error`` so it stays visible as a bug.
    """
    outcomes: list[tuple] = []
    for conv in chunk:
        try:
            outcomes.append(("ok", tokenize_conversation(tokenizer, conv, settings)))
        except Reject as rej:
            outcomes.append(("reject", conv["id"], rej.reason, rej.detail, conv.get("source")))
        except (OSError, MemoryError):
            raise  # the machine's trouble, not the sample's: a reject would outlive the rerun
        except Exception as exc:  # noqa: BLE001 - reported per sample, see docstring
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            outcomes.append(("reject", conv["id"], "tokenize_error", detail[:500], conv.get("source")))
    return outcomes


def _work(chunk: list[dict]) -> list[tuple]:
    return tokenize_chunk(_WORKER["tokenizer"], _WORKER["settings"], chunk)


def run_pool(chunks: Iterable[list[dict]], spec: TokenizerSpec, settings: RenderSettings,
             workers: int) -> Iterator[tuple]:
    """Outcomes in input order, computed by ``workers`` processes (1 = in this process).

    At most ``2 * workers`` chunks are in flight: unlike ``Pool.imap``, whose feeder thread reads
    the whole input ahead, this keeps memory independent of the input size.
    """
    if workers <= 1:
        tokenizer = load_tokenizer(spec)
        for chunk in chunks:
            yield from tokenize_chunk(tokenizer, settings, chunk)
        return
    with mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(spec, settings)) as pool:
        window: deque = deque()
        for chunk in chunks:
            window.append(pool.apply_async(_work, (chunk,)))
            if len(window) >= 2 * workers:
                yield from window.popleft().get()
        while window:
            yield from window.popleft().get()


def resolve_workers(requested: int, pending: Optional[int], chunk_size: int) -> int:
    """Worker count: ``0`` = one per core this job may use, never more than there are chunks to do."""
    workers = requested or job_cores()
    if pending is not None:
        workers = min(workers, max(1, math.ceil(pending / chunk_size)))
    return max(1, workers)


#: Record fields summed into manifest counters of the same name: the ids regenerated answers were
#: emitted as, and how many of them a re-encoding of the text / the training ids do not reproduce.
_EMITTED_COUNTS = ("emitted_tokens", "emitted_unmatched_reencoded", "emitted_unmatched_trained",
                   "answers_reencoded_differently")


def _record_stats(records: Iterable[dict]) -> dict[str, int]:
    """Manifest counters: tokens, generated tokens, samples cut at data.max_len (``truncated``),
    samples whose last answer generate cut at max_new_tokens (``generation_truncated``), and the
    emitted-id drift of regenerated answers (_EMITTED_COUNTS)."""
    stats = {"tokens": 0, "response_tokens": 0, "truncated": 0, "generation_truncated": 0,
             **dict.fromkeys(_EMITTED_COUNTS, 0)}
    for rec in records:
        stats["tokens"] += rec["seq_len"]
        stats["response_tokens"] += rec["n_response_tokens"]
        stats["truncated"] += int(rec["truncated_max_len"])
        stats["generation_truncated"] += int(rec["truncated_generation"])
        for key in _EMITTED_COUNTS:
            stats[key] += int(rec.get(key, 0))
    return stats


def _pending(conversations: Iterable[dict], out: StageOutput, unit: str, chunk_size: int) -> Iterator[list[dict]]:
    """Chunks of conversations not done yet; counts every input (done or not) as `in`."""
    chunk: list[dict] = []
    for conv in conversations:
        out.count_in()
        if out.is_done(conv["id"]):
            continue
        conv.setdefault("source", unit)
        chunk.append(conv)
        if len(chunk) >= chunk_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_unit(out: StageOutput, conversations: Path, total: Optional[int], unit: str, settings: RenderSettings,
                  spec: TokenizerSpec, num_workers: int, chunk_size: int, output_name: str) -> dict[str, Any]:
    """Tokenize a complete conversations file into ``out`` (resumable by id).

    The stage's work, callable on a file a test or benchmark built itself.

    Args:
        out: The open unit output.
        conversations: The upstream conversations file.
        total: Its number of conversations, when known (progress and worker count).
        unit: The source name (records without a `source` get it).
        settings: Template, thinking mode and length policy.
        spec: How workers load the tokenizer.
        num_workers: Processes (0 = one per core).
        chunk_size: Conversations per worker task.
        output_name: The record file to write.

    Returns:
        The manifest ``extra`` (file name, template hash, thinking, length policy, workers).
    """
    records = out.records(output_name)
    # Statistics of records an earlier, killed run wrote, so a resumed manifest equals a clean one.
    stats = _record_stats(read_jsonl(records.partial_path) if len(records) else [])
    pending = None if total is None else max(0, total - len(out.done_ids))
    workers = resolve_workers(num_workers, pending, chunk_size)
    chunks = _pending(read_jsonl(conversations), out, unit, chunk_size)
    for outcome in progress(run_pool(chunks, spec, settings, workers), total=pending, desc=f"tokenize {unit}"):
        if outcome[0] == "ok":
            records.write(outcome[1])
            for key, value in _record_stats([outcome[1]]).items():
                stats[key] += value
        else:
            _, rid, reason, detail, source = outcome
            out.reject(rid, reason, detail, source=source)
    for key, value in stats.items():
        out.count(key, value)
    return {"file": output_name, "template_sha256": settings.template_sha256, "thinking": settings.thinking,
            "max_len": settings.max_len, "overlength": settings.overlength, "answer_ids": settings.answer_ids,
            "workers": workers}
