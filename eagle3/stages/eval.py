"""Stage `eval`: how much the trained draft would speed the target up, simulated and for real.

(a) Simulated: per-step top-1 agreement of the exported draft (the weights a server would
load, in their export dtype) with the target on the eval split, and `1 + sum prod acc`.
(b) Real: greedy speculative decoding in-process with the HF target on held-out prompts (the
first assistant turn of eval-split samples), chain drafting of K tokens for each `eval.ks`,
reporting tokens per target forward, wall-clock speedup over plain greedy decoding, and
whether the output equals plain greedy decoding token for token (it must).

The report (`eval_report.json`, `eval_report.md`, `acceptance.png`) is written in the unit
directory and copied into the job's run directory, and logged to the job's loggers (W&B).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.data.heldout import heldout_prompts
from eagle3.data.mixture import EVAL_FILE
from eagle3.reports import eval_report
from eagle3.reports.loggers import log_report
from eagle3.reports.output import copy_files
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.train import EXPORT_DIR, TRAIN, hybrid_store, online

log = logging.getLogger("eagle3")
FORMAT_VERSION = 1
EVAL_ENGINE_EXPORT = "vllm"  # the export read back for evaluation (both hold the same tensors)


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    return {"eval": fingerprinted(config.eval), "format": FORMAT_VERSION}


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    """The draft; the merged split whose held-out prompts it decodes; and, unless states come from
    the target online, the store of the eval split's hidden states it is scored on."""
    from eagle3.stages.extract import EXTRACT
    from eagle3.stages.merge import MERGE

    inputs = {"train": require(TRAIN, config, ctx, unit), "merged": require(MERGE, config, ctx, unit)}
    if not online(config):
        inputs["extract"] = require(EXTRACT, config, ctx, unit)
    return inputs


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:

    from eagle3.draft.evaluate import (
        load_eval_draft,
        real_acceptance,
        simulated_acceptance,
    )
    from eagle3.draft.fit import split_dataset
    from eagle3.extract.sources import online_states
    from eagle3.tracking import job_loggers

    inputs = _unit_inputs(config, ctx, unit)
    trained, merged_dir = inputs["train"], inputs["merged"].directory
    states = {"merged": inputs["merged"]} if online(config) else {"extract": inputs["extract"]}
    m, ev = config.model, config.eval
    geometry, draft, head = load_eval_draft(trained.directory / EXPORT_DIR / EVAL_ENGINE_EXPORT, m.path,
                                            revision=m.revision, cache_dir=config.paths.hf_cache,
                                            text_config_key=m.text_config_key)
    with contextlib.ExitStack() as stack:  # online: the states of the eval split come from the target now
        make_source = stack.enter_context(online_states(config, ctx.run_dir)) if online(config) else None
        # hybrid: the eval split the train job stored is read, what it did not store is computed (and stored)
        eval_set = split_dataset(states, "eval", make_source, hybrid_store(config, ctx, out.dir))
        simulated = simulated_acceptance(geometry, draft, head, config.train, eval_set, ev.ks,
                                         batch_tokens=config.train.batch_tokens)
        if make_source is not None:
            eval_set.close_source()
    report: dict[str, Any] = {"dataset": unit, "draft": str(trained.directory / EXPORT_DIR), "simulated": simulated}
    log.info("eval: simulated accept length %.3f over %d eval samples (acc per step %s)",
             simulated["sim_accept_len"], simulated["samples"], ", ".join(f"{a:.3f}" for a in simulated["acc"]))

    prompts = heldout_prompts(merged_dir / EVAL_FILE, ev.num_prompts)
    out.count_in(len(prompts))
    out.count_out(len(prompts))
    if prompts:
        report["real"] = real_acceptance(
            m.path, draft, [p["input_ids"] for p in prompts], ks=ev.ks, max_new_tokens=ev.max_new_tokens,
            capture_layers=m.capture_layers, check_lossless=ev.check_lossless, revision=m.revision,
            trust_remote_code=m.trust_remote_code, cache_dir=config.paths.hf_cache)
        report["prompt_ids"] = [p["id"] for p in prompts]
        for k, res in report["real"].items():
            log.info("eval: K=%s real accept length %.3f tokens per target forward, speedup %.2fx, lossless %s",
                     k, res["accept_length"], res["speedup"], res["lossless"])
    files = eval_report.write_eval_report(report, out.dir)
    copy_files(files, ctx.run_dir)
    flat = eval_report.metrics(report)
    log_report(job_loggers(config, ctx.run_dir), flat, images={"eval/acceptance": files["png"]},
               summary={k.replace("/", "_"): v for k, v in flat.items()})
    summary = {"sim_accept_len": simulated["sim_accept_len"]}
    for k, res in report.get("real", {}).items():
        summary[f"real_accept_len_k{k}"] = res["accept_length"]
        summary[f"speedup_k{k}"] = res["speedup"]
    print("eval: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()), flush=True)
    return {"summary": summary, "files": {name: Path(p).name for name, p in files.items()}}


EVAL = UnitStage(
    name="eval",
    help="simulated accept length on the eval split and real greedy speculative decoding vs the target",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
