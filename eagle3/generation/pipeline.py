"""The resumable run behind stage `generate`: prompt-only conversations in, regenerated ones out.

Batches are consecutive chunks of the input order (`generate.batch_size` conversations) and each
generate call is seeded from its batch's ids and turn (`regenerate.batch_seed`), so a batch re-run
after a kill reproduces itself exactly; already-written ids are not written again and fully done
batches are skipped without running the model. Counters derived from the output files (not from
this run's work) make a resumed run's manifest equal an uninterrupted one's. A batch that an
earlier output ran under the same config is copied from it (`eagle3.generation.reuse`).

The HTTP backend answers many requests at once, so several batches run at the same time
(`generate.http.inflight_batches`, by default enough to keep the largest concurrency partition
full), each in its own thread, still turn by turn. Their outcomes are written strictly in batch
order, so the output file has the same order as a sequential run and a kill leaves a prefix of it
(plus at worst a part of one batch), which the rerun completes by id: nothing lost, nothing
written twice. Finished batches may wait behind a slow one (up to WRITE_WINDOW x inflight
batches), so one stalled request does not idle the rest.

A server outage loses nothing: a conversation whose request failed after all retries is left
undone (not rejected), the run goes on, and at the end the unit is not finalized
(GenerationIncomplete: how many, the last error, rerun). When the backend stops altogether
(BackendUnavailable: too many failures in a row), no further batch starts, what the batches in
flight did finish is written, and the run stops. The rerun regenerates exactly what is missing
(only those conversations, for a backend of independent requests) and, since they come after
everything else, restores the input order of both files before finalizing: the unit is then
byte-equal to one that never saw the outage. `request_failed` rejects an earlier version wrote
are taken back out of rejects.jsonl on resume, so those conversations are retried too.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from eagle3.artifacts import StageOutput, progress, read_jsonl
from eagle3.artifacts.console import Progress
from eagle3.generation.factory import make_backend
from eagle3.generation.regenerate import BatchInterrupted, GenerateSettings, Outcome, regenerate_batch
from eagle3.generation.reuse import EarlierGenerations, chunks
from eagle3.generation.types import RETRYABLE_REJECT_REASONS, BackendUnavailable, GenerationIncomplete

if TYPE_CHECKING:
    from eagle3.config.schema import Eagle3Config, GenerateConfig

__all__ = ["WRITE_WINDOW", "generate_file", "inflight_batches", "settings_for"]

log = logging.getLogger("eagle3")

# Batches submitted but not yet written, per batch running at once (head-of-line slack).
WRITE_WINDOW = 4


def settings_for(cfg: Eagle3Config, unit: str) -> GenerateSettings:
    """The sampling knobs of a unit: `generate.*` joined with its source's thinking mode and the data seed."""
    gen = cfg.generate
    return GenerateSettings(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
                            max_user_turns=gen.max_user_turns, length_policy=gen.length_policy,
                            thinking=cfg.dataset.sources[unit].thinking, seed=cfg.data.seed)


def _file_stats(out: StageOutput, writer) -> dict[str, Any]:
    """Counters over everything in the output files (earlier runs' work included)."""
    writer.flush()
    out.rejects.flush()
    finish: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    tokens = turns = kept_cut = 0
    for path, is_output in ((writer.partial_path, True), (out.rejects.partial_path, False)):
        if not path.exists():
            continue
        for record in read_jsonl(path):
            generation = (record.get("meta") or {}).get("generation") if is_output else record.get("generation")
            for turn in (generation or {}).get("turns", []):
                finish[turn["finish_reason"]] += 1
                tokens += turn["completion_tokens"]
                turns += 1
            if is_output:
                assert generation is not None  # every output record carries its meta.generation
                ended[generation["ended"]] += 1
                kept_cut += bool(record["meta"].get("truncated"))
    return {"finish": dict(sorted(finish.items())), "ended": dict(sorted(ended.items())),
            "tokens": tokens, "turns": turns, "length_cut_kept": kept_cut}


def inflight_batches(generate: GenerateConfig, backend: Any) -> int:
    """How many batches to regenerate at once: 1 unless the backend serves requests concurrently."""
    suggest = getattr(backend, "suggested_inflight_batches", None)
    if suggest is None:
        return 1  # in-process backends run one batch at a time
    explicit = generate.http.inflight_batches
    return int(explicit) if explicit else int(suggest(generate.batch_size))


def generate_file(cfg: Eagle3Config, unit: str, source: Path, out: StageOutput, output_name: str,
                  total: Optional[int] = None, earlier: Optional[EarlierGenerations] = None) -> dict:
    """Regenerate the prompt-only conversations of `source` into `out` (resumable).

    Separate from the stage wrapper so that a caller holding its own conversations file (a
    test, a one-off job) runs exactly the code the stage runs. Batches that `earlier` outputs
    already ran under the same config are copied from them instead of generated.

    Returns:
        The manifest `extra`: totals over the output and this run's throughput.

    Raises:
        GenerationIncomplete: Some conversations failed after all retries (left undone; the
            unit is not finalized and a rerun retries exactly them).
        BackendUnavailable: The backend stopped (the endpoints look down, or none answered);
            what was finished is written, the rest is left for a rerun.
    """
    settings = settings_for(cfg, unit)
    writer = out.records(output_name)
    retried = out.rejects.drop(lambda r: r.get("reason") in RETRYABLE_REJECT_REASONS)
    if retried:
        log.warning("generate %s: %d conversation(s) an earlier version rejected as %s are retried", unit,
                    len(retried), "/".join(sorted(RETRYABLE_REJECT_REASONS)))
    batch_size = cfg.generate.batch_size
    if earlier and earlier.covers(source, batch_size, out.is_done):
        backend: Any = _NoModel(cfg.generate.backend)  # every batch is copied: load nothing
    else:
        backend = make_backend(cfg)  # fails fast for a backend that cannot generate
    inflight = inflight_batches(cfg.generate, backend)
    live = getattr(backend, "progress", None)  # live client figures (HTTP backends)
    run: Counter[str] = Counter()
    rank: dict[Any, int] = {}  # id -> position in the source: the order both files end in
    failed: list[Any] = []  # details of conversations left undone by failed requests
    stopped: Optional[BackendUnavailable] = None
    started = time.perf_counter()
    first_run: Optional[float] = None
    bar: Progress[Any] = progress(None, total=total, desc=f"generate {unit}", unit="conv",
                                  every_s=cfg.generate.http.log_every_s, live=live)
    pending: deque[tuple[int, list[dict], Future]] = deque()
    executor = ThreadPoolExecutor(inflight, thread_name_prefix=f"generate-{unit}") if inflight > 1 else None
    window = WRITE_WINDOW * inflight

    def write(n_batch: int, fresh: list[dict], outcomes: list[Outcome], generated: bool = True) -> None:
        for outcome in outcomes:
            run["tokens"] += outcome.completion_tokens
            if out.is_done(outcome.id):
                continue  # written by the killed run; the batch only re-ran to reproduce the rest
            if outcome.retryable:  # the server failed, not the conversation: left for the rerun
                failed.append(outcome.detail)
                continue
            if outcome.record is not None:
                writer.write(outcome.record)
            else:
                assert outcome.reason is not None  # an outcome without a record is a reject, which says why
                out.reject(outcome.id, outcome.reason, outcome.detail, source=unit,
                           generation=outcome.generation)
        if generated:
            run["batches_run"] += 1
            run["conversations"] += len(fresh)
        run["progressed"] += n_batch
        bar.update(n_batch)
        seconds = time.perf_counter() - (first_run or started)
        bar.set_postfix({"tok/s": f"{run['tokens'] / max(seconds, 1e-9):.0f}"}, refresh=False)

    def outcomes_of(run_batch: Callable[[], list[Outcome]]) -> list[Outcome]:
        """A batch's outcomes; if the backend stopped during it, those that had ended (and note the stop)."""
        nonlocal stopped
        try:
            return run_batch()
        except BatchInterrupted as exc:
            stopped = stopped or exc.cause
            return exc.outcomes

    def flush_head() -> None:
        n_batch, done_fresh, future = pending.popleft()
        write(n_batch, done_fresh, outcomes_of(future.result), generated=not getattr(future, "reused", False))

    try:
        for batch in chunks(read_jsonl(source), batch_size):
            out.count_in(len(batch))
            fresh = []
            for record in batch:  # prep's ids are unique; a repeat would be written twice
                if record["id"] in rank:
                    out.count_reject("duplicate_id")
                else:
                    rank[record["id"]] = len(rank)
                    fresh.append(record)
            if all(out.is_done(r["id"]) for r in fresh):
                run["batches_skipped"] += 1
                run["progressed"] += len(batch)
                bar.update(len(batch))
                continue
            reused = earlier.lookup(fresh) if earlier and len(fresh) == len(batch) else None
            if reused is not None:
                run["batches_reused"] += 1
                run["conversations_reused"] += len(fresh)
                if executor is None:
                    write(len(batch), fresh, reused, generated=False)
                    continue
                # Queued behind the batches in flight, so the file keeps the sequential order.
                pending.append((len(batch), fresh, _done(reused)))
            else:
                if first_run is None:
                    first_run = time.perf_counter()
                done = {r["id"] for r in fresh if out.is_done(r["id"])}  # not sent again where they need not be
                if executor is None:
                    write(len(batch), fresh, outcomes_of(partial(regenerate_batch, backend, fresh, settings, done)))
                    if stopped is not None:
                        break
                    continue
                pending.append((len(batch), fresh,
                                executor.submit(regenerate_batch, backend, fresh, settings, done)))
            # Write in batch order (the file order never depends on timing), as soon as the head
            # is done. Up to `window` batches are queued or finished-but-unwritten, so one slow
            # batch at the head does not idle the other workers (nor holds many copied ones).
            while pending and stopped is None and (pending[0][2].done() or len(pending) >= window):
                flush_head()
            if stopped is not None:
                break
        while pending:
            if stopped is not None and pending[0][2].cancel():
                pending.popleft()  # not started: its conversations stay undone
                continue
            flush_head()  # finished or running: what it completes is written
        if run["batches_run"]:
            log.info(bar.line())  # the final count, also in a log no terminal watched
        if stopped is not None:
            raise stopped
    finally:
        for _, _, future in pending:
            future.cancel()
        bar.close()
        backend.close()  # also ends requests still in flight in other batches' threads
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
    if failed:
        last = failed[-1].get("error") if isinstance(failed[-1], dict) else failed[-1]
        last = " ".join(str(last).split())  # server error text may hold newlines; the message is one line
        raise GenerationIncomplete(
            f"generate {unit}: {len(failed)} conversation(s) failed after all retries "
            f"({'/'.join(sorted(RETRYABLE_REJECT_REASONS))}; last: {last}); they are left undone, not rejected, and "
            f"the unit is not finalized (manifest stays running): rerun the same command to retry them")
    for records in (writer, out.rejects):  # conversations retried by a rerun were appended at the end
        if records.reorder(rank):
            log.info("generate %s: %s put back in input order", unit, records.path.name)
    stats = _file_stats(out, writer)
    out.count("length_cut_kept", stats["length_cut_kept"])
    out.count("assistant_turns", stats["turns"])
    out.count("tokens_generated", stats["tokens"])
    seconds = time.perf_counter() - first_run if first_run is not None else 0.0
    this_run = {
        "batches_run": run["batches_run"], "batches_skipped": run["batches_skipped"],
        "batches_reused": run["batches_reused"], "conversations_reused": run["conversations_reused"],
        "conversations": run["conversations"], "tokens_generated": run["tokens"],
        "seconds": round(seconds, 3), "wall_s": round(time.perf_counter() - started, 3),
        "tokens_per_s": round(run["tokens"] / seconds, 2) if seconds else None,
        "conversations_per_s": round(run["conversations"] / seconds, 4) if seconds else None,
        "inflight_batches": inflight,
    }
    if hasattr(backend, "stats"):
        this_run["client"] = backend.stats()
    return {
        "file": output_name,
        "reused_from": dict(earlier.used) if earlier else {},
        "backend": backend.describe(),
        "thinking": settings.thinking,
        "finish_reasons": stats["finish"],
        "ended": stats["ended"],
        "tokens_generated": stats["tokens"],
        "this_run": this_run,
    }


class _NoModel:
    """The backend of a run whose every batch was done or copied: it is never asked anything."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "loaded": False, "why": "every batch was copied from an earlier output"}

    def generate(self, requests, params):  # pragma: no cover - covers() guarantees no call
        raise AssertionError("no model was loaded: every batch should have been copied")

    def close(self) -> None:
        """Nothing was opened."""


def _done(outcomes: list[Outcome]) -> Future:
    """A finished future holding batch outcomes copied from an earlier output."""
    future: Future = Future()
    future.set_result(outcomes)
    future.reused = True  # type: ignore[attr-defined]
    return future
