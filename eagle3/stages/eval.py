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

import logging
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput, read_jsonl
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.train import EXPORT_DIR, TRAIN

log = logging.getLogger("eagle3")
FORMAT_VERSION = 1
EVAL_ENGINE_EXPORT = "vllm"  # the export read back for evaluation (both hold the same tensors)


def _units(cfg: DictConfig) -> list[str]:
    return [cfg.dataset.name]


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    return {"eval": OmegaConf.to_container(cfg.eval, resolve=True), "format": FORMAT_VERSION}


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"train": require(TRAIN, cfg, ctx, unit)}


def heldout_prompts(eval_split: Path, limit: int) -> list[dict[str, Any]]:
    """Prompt ids of the first assistant turn of each eval sample (up to its first target token)."""
    prompts = []
    for record in read_jsonl(eval_split):
        if len(prompts) >= limit:
            break
        mask = record["loss_mask"]
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is None or first == 0:
            continue
        prompts.append({"id": record["id"], "input_ids": record["input_ids"][:first]})
    return prompts


def _eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]


def _log_report(cfg: DictConfig, ctx: StageContext, report: dict, files: dict[str, Path]) -> None:
    from eagle3.tracking import job_loggers

    flat = {"eval/sim_accept_len": report["simulated"]["sim_accept_len"]}
    for k, acc in enumerate(report["simulated"]["acc"]):
        flat[f"eval/sim_acc_{k}"] = acc
    for key, res in report.get("real", {}).items():
        flat[f"eval/real_accept_len_k{key}"] = res["accept_length"]
        flat[f"eval/speedup_k{key}"] = res["speedup"]
    for logger in job_loggers(cfg, ctx.run_dir):
        logger.log_metrics(flat)
        if type(logger).__name__ == "WandbLogger" and "png" in files:
            logger.log_image(key="eval/acceptance", images=[str(files["png"])])
            logger.experiment.summary.update({k.replace("/", "_"): v for k, v in flat.items()})


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    from transformers import AutoModelForCausalLM

    from eagle3.draft.export import load_exported
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.pooled_eval import evaluate_pooled
    from eagle3.draft.report import write_eval_report
    from eagle3.draft.speculative import evaluate_speculative
    from eagle3.draft.target_weights import load_embedding_and_head
    from eagle3.extract.dataset import HiddenStateDataset
    from eagle3.stages.extract import EXTRACT

    trained = _unit_inputs(cfg, ctx, unit)["train"]
    extract = require(EXTRACT, cfg, ctx, unit)
    m, ev = cfg.model, cfg.eval
    geometry, _, draft = load_exported(Path(trained.dir) / EXPORT_DIR / EVAL_ENGINE_EXPORT)
    embed, head = load_embedding_and_head(m.path, revision=m.revision, cache_dir=cfg.paths.hf_cache,
                                          text_config_key=m.text_config_key)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed)

    # (a) simulated, on the eval split's stored states
    train_cfg = OmegaConf.to_container(cfg.train, resolve=True)
    train_cfg["ttt_steps"] = max(int(cfg.train.ttt_steps), max(int(k) for k in ev.ks))
    module = DraftModule(geometry, head, train_cfg)
    module.draft.load_state_dict(draft.state_dict())
    eval_set = HiddenStateDataset.from_manifests(extract, "eval", dtype=torch.float32)
    simulated = evaluate_pooled(module, eval_set, batch_tokens=int(cfg.train.batch_tokens))
    report: dict[str, Any] = {"dataset": unit, "draft": str(Path(trained.dir) / EXPORT_DIR), "simulated": simulated}
    log.info("eval: simulated accept length %.3f over %d eval samples (acc per step %s)",
             simulated["sim_accept_len"], simulated["samples"], ", ".join(f"{a:.3f}" for a in simulated["acc"]))

    # (b) real greedy speculative decoding with the HF target
    prompts = heldout_prompts(Path(extract.inputs["merged"]["path"]) / "eval.jsonl", int(ev.num_prompts))
    out.count_in(len(prompts))
    out.count_out(len(prompts))
    if prompts:
        target = AutoModelForCausalLM.from_pretrained(m.path, dtype=torch.float32, revision=m.revision,
                                                      trust_remote_code=bool(m.trust_remote_code),
                                                      cache_dir=cfg.paths.hf_cache).eval()
        threads = torch.get_num_threads()
        if not torch.cuda.is_available():
            # Batch-1 decoding of a small model: per-op work is tiny, and extra CPU threads only
            # add synchronisation (measured 75x slower with 2 threads when another job shares
            # the cores).
            torch.set_num_threads(1)
        try:
            real = evaluate_speculative(target, draft.eval(), [p["input_ids"] for p in prompts],
                                        ks=tuple(int(k) for k in ev.ks), max_new_tokens=int(ev.max_new_tokens),
                                        eos_ids=_eos_ids(target), capture_layers=list(m.capture_layers),
                                        check_lossless=bool(ev.check_lossless))
        finally:
            torch.set_num_threads(threads)
        report["real"] = real
        report["prompt_ids"] = [p["id"] for p in prompts]
        for k, res in real.items():
            log.info("eval: K=%s real accept length %.3f tokens per target forward, speedup %.2fx, lossless %s",
                     k, res["accept_length"], res["speedup"], res["lossless"])
        lossy = [k for k, res in real.items() if bool(ev.check_lossless) and not res["lossless"]]
        if lossy:
            raise RuntimeError(f"speculative decoding differed from greedy decoding at K={lossy}: a bug, "
                               f"see {out.dir / 'eval_report.json'}")
    files = write_eval_report(report, out.dir)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    for path in files.values():
        shutil.copy2(path, ctx.run_dir / Path(path).name)
    _log_report(cfg, ctx, report, files)
    summary = {"sim_accept_len": simulated["sim_accept_len"]}
    for k, res in report.get("real", {}).items():
        summary[f"real_accept_len_k{k}"] = res["accept_length"]
        summary[f"speedup_k{k}"] = res["speedup"]
    print("eval: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()), flush=True)
    return {"summary": summary, "files": {name: Path(p).name for name, p in files.items()}}


EVAL = UnitStage(
    name="eval",
    help="simulated accept length on the eval split and real greedy speculative decoding vs the target",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
