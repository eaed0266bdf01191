"""Stage `bench`: the served target without and with the EAGLE-3 draft -- tok/s and accept length.

Standalone (not part of `stage=all`). The same held-out prompts the in-process eval decodes
(the first assistant turn of the merged eval split, as token ids, `eagle3.data.heldout`) are
sent greedily (temperature 0, `bench.max_new_tokens` each, `bench.concurrency` at a time) to

1. the target alone (`server.speculative.algorithm` off), then
2. the target with the draft (`server.speculative.*`; the export for this engine of this
   config's train output unless `server.speculative.draft_path` names one),

each launched with the project's launcher (`eagle3.serving`; the draft and the EAGLE/EAGLE3
choice are checked before launch, so an EAGLE-3 draft is never served with EAGLE) and stopped
afterwards. With `server.urls` nothing is launched: those URLs are the speculative server and
`bench.baseline_urls` the baseline (neither's flags can be checked then).

Reported (`eagle3.serving.benchmark`): output tokens/s of both, the speedup, and the accept
length read from the engine's own counters (`eagle3.serving.engine_metrics`) -- tokens per target
forward, excluding the prefill token, as `stage=eval` counts it.

An accept length <= `bench.min_accept_length` under speculation means the draft is not
used at all; it is reported as a FAILED benchmark with the likely causes, not as a number, and
the job exits non-zero. The chain's outputs (prompts, draft, eval) are this config's: its data
was generated with `generate.backend`, whatever engine `server` benchmarks (the demo chain
generates in-process and is benchmarked on vLLM with `server=vllm`). When the in-process eval of
this config is complete, its accept length at the same K (`server.speculative.num_steps`) is put
beside the engine's, with the relative difference.
Whether both servers produced the same greedy tokens is reported too.

Results: `bench_report.json`, `bench_report.md`, `bench.png` in the unit directory and the run
directory, logged to the job's loggers; the server logs are `bench-<mode>-<backend>.log` in the
run directory.

    python scripts/run.py stage=bench server=vllm server.python=.vllm-venv/bin/python
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.data.heldout import heldout_prompts
from eagle3.data.mixture import EVAL_FILE
from eagle3.reports import bench_report
from eagle3.reports.eval_report import REPORT_FILES as EVAL_REPORT_FILES
from eagle3.reports.loggers import log_report
from eagle3.reports.output import copy_files
from eagle3.serving.benchmark import (
    SPECULATIVE,
    BenchmarkFailed,
    failure_message,
    run_benchmark,
)
from eagle3.stages.base import MissingInput, StageContext, UnitStage, mixture_unit, require
from eagle3.target_info import target_identity

log = logging.getLogger("eagle3")

# 2: the slice is the schema's fingerprint of `bench` and `server`, speed included (eagle3.config.slices)
FORMAT_VERSION = 2


def _connect_mode(config: Eagle3Config) -> bool:
    return bool(config.server.urls)


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    """What is measured: the bench settings and the served engine with everything that changes its
    speed (a bench on another port is the same bench); in connect mode, which servers."""
    model = target_identity(config.model.path, config.model.revision, config.paths.hf_cache)
    slice_ = {"bench": fingerprinted(config.bench, speed=True), "server": fingerprinted(config.server, speed=True),
              "model": model, "format": FORMAT_VERSION}
    if _connect_mode(config):
        slice_["endpoints"] = {"speculative": list(config.server.urls), "baseline": list(config.bench.baseline_urls)}
    elif config.server.speculative.draft_path is not None:
        # A draft named by path is keyed by its bytes, as the target is: a draft retrained into the same
        # directory is a new bench, not the old one's figures (the chain's own draft is keyed by its train input).
        slice_["draft"] = target_identity(config.server.speculative.draft_path)
    return slice_


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    from eagle3.stages.merge import MERGE
    from eagle3.stages.train import TRAIN

    inputs = {"merged": require(MERGE, config, ctx, unit)}
    if not _connect_mode(config) and config.server.speculative.draft_path is None:
        inputs["train"] = require(TRAIN, config, ctx, unit)
    return inputs


def resolve_bench_draft(config: Eagle3Config, ctx: StageContext, unit: str) -> Optional[Path]:
    """`server.speculative.draft_path`, else this chain's export for the benchmarked engine."""
    from eagle3.stages.train import EXPORT_DIR

    spec = config.server.speculative
    if spec.draft_path is not None:
        return Path(spec.draft_path).expanduser()
    if _connect_mode(config):
        return None  # someone else's server: whatever it serves
    return _unit_inputs(config, ctx, unit)["train"].directory / EXPORT_DIR / config.server.backend


@contextlib.contextmanager
def _server(config: Eagle3Config, ctx: StageContext, mode: str, draft: Optional[Path]) -> Iterator[dict[str, Any]]:
    """`{"url", "command"}` of the server for `mode`, launched (and stopped) unless connecting."""
    from eagle3.serving.commands import build_command, launch_config
    from eagle3.serving.health import check_health
    from eagle3.serving.process import ServerProcess, records_dir

    server = config.server
    if _connect_mode(config):
        urls = list(server.urls) if mode == SPECULATIVE else list(config.bench.baseline_urls)
        healthy = check_health(urls, server.backend, timeout_s=30.0)
        yield {"url": healthy[0], "command": None, "launched": False}
        return
    # The baseline is the target alone: the same server with speculation off.
    launch = launch_config(config, "server", speculative=mode == SPECULATIVE)
    command = build_command(launch, draft if mode == SPECULATIVE else None)
    log_path = ctx.run_dir / f"bench-{mode}-{command.backend}.log"
    log.info("bench: starting the %s server: %s (log %s)", mode, command.shell(), log_path)
    started = time.perf_counter()
    with ServerProcess(command, log_path, startup_timeout_s=server.startup_timeout_s,
                       records_dir=records_dir(config.paths)) as proc:
        log.info("bench: %s server ready at %s after %.0f s", mode, proc.url, time.perf_counter() - started)
        yield {"url": proc.url, "command": command.shell(), "launched": True,
               "startup_s": time.perf_counter() - started, "log": str(log_path)}


def _eval_figure(config: Eagle3Config, ctx: StageContext, unit: str, k: int) -> Optional[dict[str, Any]]:
    """The in-process eval's accept length at K drafted tokens, when its output is complete."""
    from eagle3.stages.eval import EVAL

    try:
        where, manifest = EVAL.locate(config, ctx, unit)
    except MissingInput:
        return None
    report_path = where / EVAL_REPORT_FILES["json"]
    if manifest is None or not report_path.is_file():
        return None
    real = json.loads(report_path.read_text()).get("real") or {}
    row = real.get(str(k))
    if not row or row.get("accept_length") is None:
        return {"dir": str(where), "accept_length": None, "k": k, "ks": sorted(real, key=int)}
    return {"dir": str(where), "k": k, "accept_length": float(row["accept_length"]),
            "num_prompts": row.get("num_prompts"), "max_new_tokens": row.get("max_new_tokens")}


def benchmark(config: Eagle3Config, ctx: StageContext, unit: str, prompts: list[dict],
              draft: Optional[Path]) -> dict[str, Any]:
    """Both modes measured on `prompts` with this config's servers (`eagle3.serving.benchmark`)."""
    server = config.server
    k = server.speculative.num_steps
    header = {"dataset": unit, "algorithm": server.speculative.algorithm, "k": k,
              "draft": None if draft is None else str(draft), "connect_mode": _connect_mode(config)}
    if not _connect_mode(config):  # before the baseline starts: the speculative server must run here too
        from eagle3.serving.machine import refuse_unservable

        refuse_unservable(server.backend, speculative=True)
    return run_benchmark(server.backend, prompts, config.bench,
                         lambda mode: _server(config, ctx, mode, draft), header, _eval_figure(config, ctx, unit, k))


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    from eagle3.tracking import job_loggers

    inputs = _unit_inputs(config, ctx, unit)
    prompts = heldout_prompts(inputs["merged"].directory / EVAL_FILE, config.bench.num_prompts)
    if not prompts:
        raise BenchmarkFailed(f"bench: the eval split of {inputs['merged'].dir} has no prompt to send (its "
                              "samples start with an assistant turn, or the split is empty)")
    out.count_in(len(prompts))
    report = benchmark(config, ctx, unit, prompts, resolve_bench_draft(config, ctx, unit))
    files = bench_report.write_bench_report(report, out.dir)
    copy_files(files, ctx.run_dir)
    flat = bench_report.metrics(report)
    log_report(job_loggers(config, ctx.run_dir), flat, images={"bench/throughput": files["png"]},
               summary={k.replace("/", "_"): v for k, v in flat.items()})
    if report["status"] != "ok":
        raise BenchmarkFailed(failure_message(report, ctx.run_dir / bench_report.REPORT_FILES["md"]))
    out.count_out(len(prompts))
    print(bench_report.summary_line(report), flush=True)
    summary = {key: report.get(key) for key in ("baseline_tokens_per_s", "speculative_tokens_per_s", "speedup")}
    summary["accept_length"] = report["accept"]["accept_length"]
    summary["eval_accept_length"] = (report.get("eval") or {}).get("accept_length")
    return {"summary": summary, "files": {name: Path(p).name for name, p in files.items()}}


BENCH = UnitStage(
    name="bench",
    help="serve the target without and with the draft: output tokens/s, speedup, engine-reported accept length",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
