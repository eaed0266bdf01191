"""Stage `train`: the EAGLE-3 draft, trained with Lightning on the hidden-state store.

The unit is one mix (`dataset.name`). Inputs: the extract manifest (store + merged splits) and
the vocab manifest (`d2t`/`t2d`). Outputs in the unit directory: `checkpoints/` (Lightning,
`last.ckpt` every `train.checkpoint_every_n_steps` steps and at the end), the exported draft
for each engine under `draft/sglang` and `draft/vllm`, and `train_metrics.json`.

A killed run resumes from `last.ckpt` when rerun (optimizer, scheduler, step and the position
inside the epoch are all in it). Metrics go through Lightning to the job's loggers (CSV, W&B).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput, atomic_write_json
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.extract import EXTRACT
from eagle3.stages.vocab import D2T_FILE, T2D_FILE, VOCAB

log = logging.getLogger("eagle3")
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
EXPORT_DIR = "draft"
METRICS_FILE = "train_metrics.json"
FIT_SUMMARY = "fit_summary.json"
FORMAT_VERSION = 1
# Keys of `train` that do not change what is trained (only how it is watched).
_UNTRACKED = ("log_every_n_steps", "num_workers")


def _units(cfg: DictConfig) -> list[str]:
    return [cfg.dataset.name]


def draft_geometry(cfg: DictConfig):
    """The draft geometry for this config, from the target's config.json."""
    from eagle3.draft.geometry import geometry_from_target, target_text_config
    from eagle3.draft.target_weights import _resolve_dir

    m = cfg.model
    root = _resolve_dir(m.path, m.revision, cfg.paths.hf_cache)
    target_cfg = target_text_config(root, m.text_config_key)
    return geometry_from_target(target_cfg, m.capture_layers, int(m.draft.vocab_size),
                                OmegaConf.to_container(m.draft, resolve=True))


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    train = OmegaConf.to_container(cfg.train, resolve=True)
    return {
        "train": {k: v for k, v in train.items() if k not in _UNTRACKED},
        "draft": OmegaConf.to_container(cfg.model.draft, resolve=True),
        "seed": int(cfg.seed),
        "format": FORMAT_VERSION,
    }


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"extract": require(EXTRACT, cfg, ctx, unit), "vocab": require(VOCAB, cfg, ctx, unit)}


def load_vocab_maps(vocab: Manifest) -> tuple[torch.Tensor, torch.Tensor]:
    d2t = torch.load(Path(vocab.dir) / D2T_FILE, weights_only=True)
    t2d = torch.load(Path(vocab.dir) / T2D_FILE, weights_only=True)
    return d2t.long(), t2d.bool()


def resolve_precision(precision: str) -> str:
    """`auto` = bf16-mixed on a GPU, 32-true on CPU (bf16 matmuls on CPU are slow and lossy)."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


def build_trainer(cfg: DictConfig, ckpt_dir: Path, loggers: list, callbacks: list):
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from eagle3.draft.checkpoint_io import AtomicCheckpointIO

    t = cfg.train
    every = int(t.checkpoint_every_n_steps)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), filename="step{step}", auto_insert_metric_name=False,
                                 every_n_train_steps=every if every > 0 else None, save_last=True, save_top_k=1,
                                 save_on_train_epoch_end=True)
    all_callbacks = [*callbacks, checkpoint]
    if loggers:
        all_callbacks.append(LearningRateMonitor(logging_interval="step"))
    devices = t.devices if not isinstance(t.devices, str) or t.devices == "auto" else int(t.devices)
    return L.Trainer(
        accelerator=t.accelerator, devices=devices, strategy=t.strategy,
        precision=resolve_precision(str(t.precision)),
        max_epochs=int(t.max_epochs), max_steps=int(t.max_steps),
        gradient_clip_val=float(t.grad_clip) if t.grad_clip else None,
        logger=loggers or False, callbacks=all_callbacks, plugins=[AtomicCheckpointIO()],
        log_every_n_steps=int(t.log_every_n_steps), check_val_every_n_epoch=int(t.eval_every_n_epochs),
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=str(ckpt_dir.parent),
        use_distributed_sampler=False,
    )


def launched_rank() -> int:
    """This process's rank when an external or Lightning launcher started several (else 0)."""
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if int(os.environ.get(var, "0") or 0) > 0:
            return int(os.environ[var])
    return 0


@dataclass
class FitResult:
    trainer: Any
    module: Any
    train_set: Any
    eval_set: Any
    wall_s: float
    resumed_at: Optional[int]


def _fit(cfg: DictConfig, ctx: StageContext, unit: str, unit_dir: Path) -> FitResult:
    """Build the model, data and trainer for a unit directory and train (resuming if possible)."""
    import lightning as L

    from eagle3.draft.data import DraftDataModule, FitSummaryCallback
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.target_weights import load_embedding_and_head
    from eagle3.extract.dataset import HiddenStateDataset
    from eagle3.tracking import job_loggers

    inputs = _unit_inputs(cfg, ctx, unit)
    m, t = cfg.model, cfg.train
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    geometry = draft_geometry(cfg)
    embed, head = load_embedding_and_head(m.path, revision=m.revision, cache_dir=cfg.paths.hf_cache,
                                          text_config_key=m.text_config_key)
    d2t, t2d = load_vocab_maps(inputs["vocab"])
    train_set = HiddenStateDataset.from_manifests(inputs["extract"], "train", dtype=torch.float32)
    eval_set = HiddenStateDataset.from_manifests(inputs["extract"], "eval", dtype=torch.float32)
    module = DraftModule(geometry, head, OmegaConf.to_container(t, resolve=True), embed=embed, d2t=d2t, t2d=t2d)
    data = DraftDataModule(train_set, eval_set if len(eval_set) else None, batch_tokens=int(t.batch_tokens),
                           seed=int(cfg.seed), num_workers=int(t.num_workers))
    ckpt_dir = unit_dir / CHECKPOINT_DIR
    resume = ckpt_dir / LAST_CHECKPOINT
    summary = FitSummaryCallback(unit_dir / FIT_SUMMARY)
    trainer = build_trainer(cfg, ckpt_dir, job_loggers(cfg, ctx.run_dir), [data.position_callback(), summary])
    resumed_at = None
    if resume.is_file():
        resumed_at = int(torch.load(resume, map_location="cpu", weights_only=True)["global_step"])
        log.info("train: resuming from %s (step %d)", resume, resumed_at)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume.is_file() else None)
    return FitResult(trainer, module, train_set, eval_set, time.perf_counter() - started, resumed_at)


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    from eagle3.draft.export import export_draft
    from eagle3.draft.pooled_eval import evaluate_pooled

    t = cfg.train
    fit = _fit(cfg, ctx, unit, out.dir)
    module, train_set, eval_set, wall, resumed_at = fit.module, fit.train_set, fit.eval_set, fit.wall_s, fit.resumed_at
    done = json.loads((out.dir / FIT_SUMMARY).read_text())  # what rank 0 saw (also under ddp_spawn)
    geometry = module.draft.geometry
    out.count_in(len(train_set))
    out.count_out(len(train_set))

    module.to("cpu").eval()
    pooled = evaluate_pooled(module, eval_set, batch_tokens=int(t.batch_tokens)) if len(eval_set) else None
    exports = {}
    for engine in ("sglang", "vllm"):
        exports[engine] = str(export_draft(module.draft, out.dir / EXPORT_DIR / engine, engine,
                                           dtype=str(t.export_dtype),
                                           extra_metadata={"dataset": unit, "global_step": done["global_step"]}))
    metrics = {
        "global_step": done["global_step"],
        "epochs": done["epochs"],
        "train_samples": len(train_set),
        "eval_samples": len(eval_set),
        "train_tokens_per_epoch": int(sum(int(n) for n in train_set.lengths)),
        "fit_wall_s": round(wall, 1),
        # Sample tokens (not padding) trained by this process; a resumed run counts its own steps.
        "train_tokens_this_run": done["tokens_this_run"],
        "train_tokens_per_s": round(done["tokens_this_run"] / wall, 1) if wall > 0 else None,
        "resumed_at_step": resumed_at,
        "world_size": done["world_size"],
        "eval": pooled,
        "geometry": geometry.to_dict(),
        "trainable_parameters": sum(p.numel() for p in module.draft.parameters() if p.requires_grad),
    }
    atomic_write_json(out.dir / METRICS_FILE, metrics)
    if pooled:
        _log_final_eval(cfg, ctx, pooled, done["global_step"])
        log.info("train: eval simulated accept length %.3f (acc per step %s)", pooled["sim_accept_len"],
                 ", ".join(f"{a:.3f}" for a in pooled["acc"]))
    return {**metrics, "exports": exports, "files": {"metrics": METRICS_FILE}}


def _log_final_eval(cfg: DictConfig, ctx: StageContext, pooled: dict, step: int) -> None:
    """The trained draft's pooled eval figures, logged once more at the last step.

    Lightning validates every `eval_every_n_epochs`, which need not divide the epoch count; the
    final figures are what a sweep compares, so every run ends with them.
    """
    from eagle3.tracking import job_loggers

    final = {"eval/sim_accept_len": pooled["sim_accept_len"]}
    final.update({f"eval/acc_{k}": a for k, a in enumerate(pooled["acc"])})
    final.update({f"eval/loss_{k}": x for k, x in enumerate(pooled["step_kl"])})
    for logger in job_loggers(cfg, ctx.run_dir):
        logger.log_metrics(final, step=step)
        if type(logger).__name__ == "WandbLogger":
            logger.experiment.summary.update(final)


class TrainStage(UnitStage):
    """UnitStage, plus the worker side of multi-process launches.

    Under torchrun/SLURM (or Lightning's own `ddp` launcher, which re-runs this command) every
    rank runs the job. Rank 0 owns the unit directory as usual; the other ranks join `fit`
    for the same directory without taking its lock (rank 0 holds it while it waits for them)
    and end the job after training: manifests, exports and later stages are rank 0's.
    """

    def __call__(self, cfg: DictConfig, ctx: StageContext) -> list[Manifest]:
        rank = launched_rank()
        if rank == 0:
            return super().__call__(cfg, ctx)
        for unit in self.units(cfg):
            where, manifest = self.locate(cfg, ctx, unit)
            if manifest is None:
                log.info("train: rank %d joins training of %s", rank, where)
                _fit(cfg, ctx, unit, where)
        raise SystemExit(0)


TRAIN = TrainStage(
    name="train",
    help="EAGLE-3 draft with the training-time test (Lightning), exported for SGLang and vLLM",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
