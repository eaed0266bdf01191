"""Stage `train`: the EAGLE-3 draft, trained with Lightning on the hidden-state store.

The unit is one mix (`dataset.name`). Inputs: the extract manifest (store + merged splits) and
the vocab manifest (`d2t`/`t2d`). Outputs in the unit directory: `checkpoints/` (Lightning,
`last.ckpt` every `train.checkpoint_every_n_steps` steps and at the end), the exported draft
for each engine under `draft/sglang` and `draft/vllm`, and `train_metrics.json`.

A killed run resumes from `last.ckpt` when rerun (optimizer, scheduler, step and the position
inside the epoch are all in it). Metrics go through Lightning to the job's loggers (CSV, W&B).
"""

from __future__ import annotations

import logging
import time
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


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    import lightning as L

    from eagle3.draft.data import DraftDataModule
    from eagle3.draft.export import export_draft
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.pooled_eval import evaluate_pooled
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
    out.count_in(len(train_set))
    out.count_out(len(train_set))
    module = DraftModule(geometry, head, OmegaConf.to_container(t, resolve=True), embed=embed, d2t=d2t, t2d=t2d)
    data = DraftDataModule(train_set, eval_set if len(eval_set) else None, batch_tokens=int(t.batch_tokens),
                           seed=int(cfg.seed), num_workers=int(t.num_workers))
    ckpt_dir = out.dir / CHECKPOINT_DIR
    resume = ckpt_dir / LAST_CHECKPOINT
    trainer = build_trainer(cfg, ckpt_dir, job_loggers(cfg, ctx.run_dir), [data.position_callback()])
    resumed_at = None
    if resume.is_file():
        resumed_at = int(torch.load(resume, map_location="cpu", weights_only=True)["global_step"])
        log.info("train: resuming from %s (step %d)", resume, resumed_at)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume.is_file() else None)
    wall = time.perf_counter() - started
    if trainer.global_rank != 0:
        return None

    module.to("cpu").eval()
    pooled = evaluate_pooled(module, eval_set, batch_tokens=int(t.batch_tokens)) if len(eval_set) else None
    exports = {}
    for engine in ("sglang", "vllm"):
        exports[engine] = str(export_draft(module.draft, out.dir / EXPORT_DIR / engine, engine,
                                           dtype=str(t.export_dtype),
                                           extra_metadata={"dataset": unit, "global_step": int(trainer.global_step)}))
    tokens = int(sum(int(n) for n in train_set.lengths)) * max(1, int(trainer.current_epoch))
    metrics = {
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "train_samples": len(train_set),
        "eval_samples": len(eval_set),
        "train_tokens_per_epoch": int(sum(int(n) for n in train_set.lengths)),
        "fit_wall_s": round(wall, 1),
        "train_tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "resumed_at_step": resumed_at,
        "world_size": int(trainer.world_size),
        "eval": pooled,
        "geometry": geometry.to_dict(),
        "trainable_parameters": sum(p.numel() for p in module.draft.parameters() if p.requires_grad),
    }
    atomic_write_json(out.dir / METRICS_FILE, metrics)
    if pooled:
        log.info("train: eval simulated accept length %.3f (acc per step %s)", pooled["sim_accept_len"],
                 ", ".join(f"{a:.3f}" for a in pooled["acc"]))
    return {**metrics, "exports": exports, "files": {"metrics": METRICS_FILE}}


TRAIN = UnitStage(
    name="train",
    help="EAGLE-3 draft with the training-time test (Lightning), exported for SGLang and vLLM",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
