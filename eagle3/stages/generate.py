"""Stage `generate`: regenerate every assistant turn of prompt-only sources through the target.

EAGLE-3 learns the *target's* next-token distribution, so answers written by another model are
replaced (DESIGN.md §1, two tracks): each prompt-only conversation from prep is replayed user
turn by user turn against the backend `server.backend` names, with the source's thinking mode.

Resume and determinism: batches are consecutive chunks of prep's output order
(`generate.batch_size` conversations) and each generate call is seeded from its batch's ids and
turn, so a batch re-run after a kill reproduces itself exactly; already-written ids are not
written again and fully done batches are skipped without running the model. Counters derived
from the output files (not from this run's work) make a resumed run's manifest equal an
uninterrupted one's. For the same reason a batch that an earlier output of the same source ran
under the same config (a smaller sample: prep's samples are nested) is copied from it, not run
again (`eagle3.generation.reuse`, `generate.reuse_earlier`).

Servers (`server=vllm|sglang`): with `server.urls=[...]` the stage talks to running servers;
without, it launches the configured one for the stage's duration (`GenerateStage`). The HTTP
backend answers many requests at
once, so several batches run at the same time (`generate.http.inflight_batches`, by default
enough to keep the largest concurrency partition full), each in its own thread, still turn by
turn. Their outcomes are written strictly in batch order, so the output file has the same order
as a sequential run and a kill leaves a prefix of it (plus at worst a part of one batch), which
the rerun completes by id: nothing lost, nothing written twice. Finished batches may wait behind
a slow one (up to WRITE_WINDOW x inflight batches), so one stalled request does not idle the rest.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput, progress, read_jsonl
from eagle3.generation.backend import HTTP_BACKENDS, make_backend
from eagle3.generation.regenerate import GenerateSettings, Outcome, regenerate_batch
from eagle3.generation.reuse import EarlierGenerations, chunks
from eagle3.stages.base import StageContext, UnitStage, require

CONVERSATIONS_FILE = "conversations.jsonl"  # prep's output name, and ours (tokenize reads either)
FORMAT_VERSION = 1
PROMPT_ONLY = "prompt_only"
# Keys of generate.http that change what a server generates (the rest is how the client asks).
HTTP_REQUEST_KEYS = ("chat_template_kwargs", "thinking_keys", "extra_body")

GENERATE_NAME = "generate"
# Batches submitted but not yet written, per batch running at once (head-of-line slack).
WRITE_WINDOW = 4

log = logging.getLogger("eagle3")


def _units(cfg: DictConfig) -> list[str]:
    return [name for name, src in cfg.dataset.sources.items() if src.track == PROMPT_ONLY]


def weights_signature(path: str | Path) -> Optional[str]:
    """Hash of the file names and sizes of a local checkpoint directory (None for a hub id).

    Names and sizes, not contents: hashing many GB of weights on every config lookup would cost
    minutes, and a retrained or re-quantized checkpoint changes sizes or files in practice.
    """
    directory = Path(path)
    if not directory.is_dir():
        return None
    entries = sorted(f"{p.name}:{p.stat().st_size}" for p in directory.iterdir()
                     if p.is_file() and not p.name.startswith("."))
    return hashlib.sha256("\n".join(entries).encode("utf-8")).hexdigest()[:16]


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    model = cfg.model
    generate = OmegaConf.to_container(cfg.generate, resolve=True)
    # Endpoints, concurrency, timeouts and retries do not change what is generated: a resumed
    # run may use other ones. The request fields that do change it count for HTTP backends.
    http = generate.pop("http", None) or {}
    generate.pop("reuse_earlier", None)  # reuse copies exactly what a fresh run would generate
    if cfg.server.backend in HTTP_BACKENDS:
        generate["request"] = {k: http.get(k) for k in HTTP_REQUEST_KEYS}
    return {
        "backend": cfg.server.backend,
        "target": {"path": str(model.path), "revision": model.revision, "dtype": model.dtype,
                   "weights": weights_signature(model.path)},
        "thinking": bool(cfg.dataset.sources[unit].thinking),
        "generate": generate,
        "seed": cfg.data.seed,
        "format": FORMAT_VERSION,
    }


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    from eagle3.stages.prep import PREP  # the stage before this one

    return {"conversations": require(PREP, cfg, ctx, unit)}


def settings_for(cfg: DictConfig, unit: str) -> GenerateSettings:
    """Plain settings of a unit, so nothing OmegaConf reaches the backend."""
    gen = cfg.generate
    return GenerateSettings(max_new_tokens=int(gen.max_new_tokens), temperature=float(gen.temperature),
                            top_p=float(gen.top_p), max_user_turns=int(gen.max_user_turns),
                            length_policy=str(gen.length_policy),
                            thinking=bool(cfg.dataset.sources[unit].thinking), seed=int(cfg.data.seed))


def _file_stats(out: StageOutput, writer) -> dict[str, Any]:
    """Counters over everything in the output files (earlier runs' work included)."""
    writer.flush()
    out.rejects.flush()
    finish, ended = Counter(), Counter()
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
                ended[generation["ended"]] += 1
                kept_cut += bool(record["meta"].get("truncated"))
    return {"finish": dict(sorted(finish.items())), "ended": dict(sorted(ended.items())),
            "tokens": tokens, "turns": turns, "length_cut_kept": kept_cut}


def inflight_batches(cfg: DictConfig, backend: Any) -> int:
    """How many batches to regenerate at once: 1 unless the backend serves requests concurrently."""
    suggest = getattr(backend, "suggested_inflight_batches", None)
    if suggest is None:
        return 1  # in-process backends run one batch at a time
    explicit = cfg.generate.http.inflight_batches
    return int(explicit) if explicit else int(suggest(int(cfg.generate.batch_size)))


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def generate_file(cfg: DictConfig, unit: str, source: Path, out: StageOutput, total: Optional[int] = None,
                  earlier: Optional[EarlierGenerations] = None) -> dict:
    """Regenerate the prompt-only conversations of `source` into `out` (resumable).

    Separate from the stage wrapper so that a caller holding its own conversations file (a
    test, a one-off job) runs exactly the code the stage runs. Batches that `earlier` outputs
    already ran under the same config are copied from them instead of generated.

    Returns:
        The manifest `extra`: totals over the output and this run's throughput.
    """
    settings = settings_for(cfg, unit)
    writer = out.records(CONVERSATIONS_FILE)
    batch_size = int(cfg.generate.batch_size)
    if earlier and earlier.covers(source, batch_size, out.is_done):
        backend: Any = _NoModel(cfg.server.backend)  # every batch is copied: load nothing
    else:
        backend = make_backend(cfg)  # fails fast for a backend that cannot generate
    inflight = inflight_batches(cfg, backend)
    live = getattr(backend, "progress", None)  # live client figures (HTTP backends)
    log_every = float(cfg.generate.http.log_every_s)
    run = Counter()
    seen: set = set()
    started = time.perf_counter()
    first_run: Optional[float] = None
    last_log = started
    bar = progress(None, total=total, desc=f"generate {unit}", unit="conv")
    pending: deque[tuple[int, list[dict], Future]] = deque()
    executor = ThreadPoolExecutor(inflight, thread_name_prefix=f"generate-{unit}") if inflight > 1 else None
    window = WRITE_WINDOW * inflight

    def write(n_batch: int, fresh: list[dict], outcomes: list[Outcome], generated: bool = True) -> None:
        for outcome in outcomes:
            run["tokens"] += outcome.completion_tokens
            if out.is_done(outcome.id):
                continue  # written by the killed run; the batch only re-ran to reproduce the rest
            if outcome.record is not None:
                writer.write(outcome.record)
            else:
                out.reject(outcome.id, outcome.reason, outcome.detail, source=unit,
                           generation=outcome.generation)
        if generated:
            run["batches_run"] += 1
            run["conversations"] += len(fresh)
        run["progressed"] += n_batch
        bar.update(n_batch)
        seconds = time.perf_counter() - (first_run or started)
        postfix = {"tok/s": f"{run['tokens'] / max(seconds, 1e-9):.0f}"}
        if live is not None:
            postfix.update(live())
        bar.set_postfix(postfix, refresh=False)
        if live is not None and time.perf_counter() - last_log >= log_every:
            log_progress(postfix)

    def flush_head() -> None:
        n_batch, done_fresh, future = pending.popleft()
        write(n_batch, done_fresh, future.result(), generated=not getattr(future, "reused", False))

    def log_progress(postfix: dict[str, str]) -> None:
        """One line for logs of batch jobs, where the progress bar is off."""
        nonlocal last_log
        last_log = time.perf_counter()
        done = run["progressed"]
        rate = run["conversations"] / max(last_log - (first_run or started), 1e-9)
        eta = _eta(max(total - done, 0) / rate) if total and rate > 0 else "?"
        log.info("generate %s: %d/%s conversations, %s, ETA %s", unit, done, total if total else "?",
                 ", ".join(f"{k} {v}" for k, v in postfix.items()), eta)

    try:
        for batch in chunks(read_jsonl(source), batch_size):
            out.count_in(len(batch))
            fresh = []
            for record in batch:  # prep's ids are unique; a repeat would be written twice
                if record["id"] in seen:
                    out.count_reject("duplicate_id")
                else:
                    seen.add(record["id"])
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
                if executor is None:
                    write(len(batch), fresh, regenerate_batch(backend, fresh, settings))
                    continue
                pending.append((len(batch), fresh, executor.submit(regenerate_batch, backend, fresh, settings)))
            # Write in batch order (the file order never depends on timing), as soon as the head
            # is done. Up to `window` batches are queued or finished-but-unwritten, so one slow
            # batch at the head does not idle the other workers (nor holds many copied ones).
            while pending and (pending[0][2].done() or len(pending) >= window):
                flush_head()
        while pending:
            flush_head()
        if live is not None and run["batches_run"]:
            log_progress(live())
    finally:
        for _, _, future in pending:
            future.cancel()
        bar.close()
        backend.close()  # also ends requests still in flight in other batches' threads
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
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
        "file": CONVERSATIONS_FILE,
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


def _earlier_outputs(cfg: DictConfig, ctx: StageContext, unit: str, out_dir: Path,
                     config: dict[str, Any]) -> Optional[EarlierGenerations]:
    """Earlier complete outputs of `unit` under `config` (None when reuse is off or there are none)."""
    if not cfg.generate.reuse_earlier:
        return None
    earlier = EarlierGenerations(ctx.root / GENERATE_NAME, unit, config, exclude=out_dir,
                                 input_name="conversations", file_name=CONVERSATIONS_FILE,
                                 batch_size=int(cfg.generate.batch_size))
    return earlier or None


def copyable_conversations(cfg: DictConfig, ctx: StageContext, unit: str) -> int:
    """Conversations of a unit not generated yet that a run would copy from earlier outputs.

    For `stage=plan`; raises MissingInput while prep has not run (as `locate` does).
    """
    where, manifest = GENERATE.locate(cfg, ctx, unit)
    earlier = None if manifest else _earlier_outputs(cfg, ctx, unit, where, _unit_config(cfg, unit))
    if earlier is None:
        return 0
    prep = _unit_inputs(cfg, ctx, unit)["conversations"]
    return earlier.copyable(Path(prep.dir) / CONVERSATIONS_FILE, int(cfg.generate.batch_size))


def _done(outcomes: list[Outcome]) -> Future:
    """A finished future holding batch outcomes copied from an earlier output."""
    future: Future = Future()
    future.set_result(outcomes)
    future.reused = True  # type: ignore[attr-defined]
    return future


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    prep = _unit_inputs(cfg, ctx, unit)["conversations"]
    earlier = _earlier_outputs(cfg, ctx, unit, out.dir, out.config)
    if earlier:
        log.info("[generate] %s: batches that %d earlier output(s) ran under this config are reused: %s",
                 unit, len(earlier.dirs), ", ".join(str(d) for d in earlier.dirs))
    return generate_file(cfg, unit, Path(prep.dir) / CONVERSATIONS_FILE, out, total=prep.counts.get("out"),
                         earlier=earlier)


@dataclass(frozen=True)
class GenerateStage(UnitStage):
    """`generate`, launching the configured server itself when no `server.urls` are given.

    With `server=vllm|sglang` and no URLs, the target is served (on 127.0.0.1, log in the run
    directory) once for all units of the stage, only when some unit still has work, and stopped
    afterwards -- also on error or Ctrl-C. It serves the target alone unless
    `server.speculative.draft_path` names a draft (speculation does not change what is sampled,
    only how fast).
    """

    def __call__(self, cfg: DictConfig, ctx: StageContext) -> list[Manifest]:
        server = cfg.server
        if server.backend not in HTTP_BACKENDS or server.urls or not self._has_work(cfg, ctx):
            return super().__call__(cfg, ctx)
        from eagle3.serving import server_endpoints

        launch = copy.deepcopy(cfg)
        if server.speculative.draft_path is None:
            OmegaConf.update(launch, "server.speculative.algorithm", None, merge=False)
        log.info("generate: launching %s for %s (log in %s)", server.backend, cfg.model.path, ctx.run_dir)
        with server_endpoints(launch, ctx.run_dir) as urls:
            connected = copy.deepcopy(cfg)
            OmegaConf.update(connected, "server.urls", list(urls), merge=False)
            return super().__call__(connected, ctx)

    def _has_work(self, cfg: DictConfig, ctx: StageContext) -> bool:
        """Whether some unit needs the model: not complete, and not all copied from earlier outputs."""
        for unit in self.units(cfg):
            where, manifest = self.locate(cfg, ctx, unit)
            if manifest is not None and not ctx.force:
                continue
            earlier = _earlier_outputs(cfg, ctx, unit, where, self.unit_config(cfg, unit))
            prep = self.unit_inputs(cfg, ctx, unit)["conversations"]
            if earlier is None or not earlier.covers(Path(prep.dir) / CONVERSATIONS_FILE,
                                                     int(cfg.generate.batch_size)):
                return True
        return False


GENERATE = GenerateStage(
    name=GENERATE_NAME,
    help="regenerate prompt-only conversations through the target (every assistant turn)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
