"""Training the EAGLE-3 draft with Lightning: the model, data and trainer of one train unit.

`fit_draft` builds `DraftModule` (the draft with the K-step training-time test), the
token-budget data module over the hidden-state store and the Trainer, and fits, resuming from
`checkpoints/last.ckpt` when a killed run left one (weights, optimizer state, LR schedule, step and
the position inside the epoch are all in it). `export_engines` writes the trained draft for
each serving engine. Stage `train` is the wiring around these.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from eagle3.config.schema import Eagle3Config, ModelConfig
from eagle3.draft.geometry import DraftGeometry, engines_refusing, geometry_from_target
from eagle3.draft.options import AUTO_PRECISION
from eagle3.dtypes import cpu_has_native_bf16
from eagle3.engines import ENGINES
from eagle3.errors import Eagle3Error
from eagle3.target_info import CONFIG_FILE, TargetConfigError, read_config, resolve_dir
from eagle3.threads import ranks_share_cores

if TYPE_CHECKING:  # lightning and the datasets load only when a fit runs
    import lightning as L

    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.rescoring import Rescorer
    from eagle3.states.dataset import SplitDataset

__all__ = ["CHECKPOINT_DIR", "FIT_SUMMARY", "LAST_CHECKPOINT", "FitResult", "build_trainer", "draft_geometry",
           "export_engines", "fit_draft", "load_vocab_maps", "resolve_precision", "resume_point", "split_dataset",
           "training_sets"]

log = logging.getLogger("eagle3")
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
FIT_SUMMARY = "fit_summary.json"


def draft_geometry(model: ModelConfig, hf_cache: Optional[str]) -> DraftGeometry:
    """The draft geometry for this target, from the target's config.json (`model.draft` overrides fields)."""
    directory = resolve_dir(model.path, model.revision, hf_cache)
    target_cfg = read_config(directory, model.text_config_key)
    if target_cfg is None:
        raise TargetConfigError(f"model.path: {directory} has no {CONFIG_FILE} (or it is not a JSON object)")
    return geometry_from_target(target_cfg, model.capture_layers, model.draft.vocab_size, asdict(model.draft))


def load_vocab_maps(d2t_file: Path, t2d_file: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """`d2t` (int64 offsets) and `t2d` (bool) from the vocab stage's files, loaded tensors-only."""
    d2t = torch.load(d2t_file, weights_only=True)
    t2d = torch.load(t2d_file, weights_only=True)
    return d2t.long(), t2d.bool()


def resolve_precision(precision: str, accelerator: str = "auto") -> str:
    """`auto` = bf16-mixed on a GPU and on a CPU that multiplies bf16 in hardware, else 32-true.

    Mixed precision keeps fp32 weights, optimizer state, the norms' statistics and the KL's softmax;
    the matmuls, and the activations between them, are bf16 (`eagle3.draft.norm`), as every GPU recipe
    trains EAGLE-3 and the engines serve it. On a CPU without bf16 units oneDNN emulates them,
    slower than fp32, so those stay at 32-true.
    """
    if precision != AUTO_PRECISION:
        return precision
    if accelerator != "cpu" and torch.cuda.is_available():
        return "bf16-mixed"
    return "bf16-mixed" if cpu_has_native_bf16() else "32-true"


def build_trainer(config: Eagle3Config, loggers: Sequence[Any], unit_dir: Path, data_callbacks: Sequence[Any] = ()):
    """The Lightning Trainer of one train unit: the one place `train.*` meets Lightning.

    Callbacks: `data_callbacks` (the data position a resumed run restarts from), the fit summary
    stage train reads back (`FIT_SUMMARY`), checkpoints every `train.checkpoint_every_n_steps`
    steps and `last.ckpt` (written atomically), progress lines when no terminal watches, and the
    LR monitor when there is a logger. `loggers` are the job's, built by the stage (the tracking
    layer sits above this package), shared with the stages that log reports into the same run after
    training.
    """
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from eagle3.draft.batching import FitSummaryCallback
    from eagle3.draft.checkpoint_io import AtomicCheckpointIO
    from eagle3.draft.progress import ProgressLines, interactive, quiet_lightning

    quiet_lightning()
    t = config.train
    loggers = list(loggers)
    ckpt_dir = unit_dir / CHECKPOINT_DIR
    every = t.checkpoint_every_n_steps
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), filename="step{step}", auto_insert_metric_name=False,
                                 every_n_train_steps=every if every > 0 else None, save_last=True, save_top_k=1,
                                 save_on_train_epoch_end=True)
    watched = interactive()
    callbacks = [*data_callbacks, FitSummaryCallback(unit_dir / FIT_SUMMARY), checkpoint]
    if not watched:
        callbacks.append(ProgressLines(t.progress_every_s))
    if loggers:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    devices = t.devices if not isinstance(t.devices, str) or t.devices == "auto" else int(t.devices)
    return L.Trainer(
        accelerator=t.accelerator, devices=devices, strategy=t.strategy,
        # One of draft.options.PRECISIONS (validated), all of which Lightning's literal type lists.
        precision=resolve_precision(t.precision, t.accelerator),  # type: ignore[arg-type]
        max_epochs=t.max_epochs, max_steps=t.max_steps,
        gradient_clip_val=float(t.grad_clip) if t.grad_clip else None,
        logger=loggers or False, callbacks=callbacks, plugins=[AtomicCheckpointIO()],
        log_every_n_steps=t.log_every_n_steps, check_val_every_n_epoch=t.eval_every_n_epochs,
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=str(unit_dir),
        enable_progress_bar=watched,
        use_distributed_sampler=False,
    )


@dataclass
class FitResult:
    """What a fit leaves: the trainer, the trained module, its data, wall time, the step it resumed at."""

    trainer: L.Trainer
    module: DraftModule
    train_set: SplitDataset
    eval_set: SplitDataset
    wall_s: float
    resumed_at: Optional[int]


@dataclass
class TrainMetrics:
    """What a train unit reports (`train_metrics.json` and its manifest's `extra`), read back by stage
    report (`eagle3.sweeps.collect`) and stage plan (`eagle3.planning.modes`: `train_tokens_per_s`)."""

    global_step: int
    epochs: int
    train_samples: int
    eval_samples: int
    train_tokens_per_epoch: int
    fit_wall_s: float
    train_tokens_this_run: int  # sample tokens (not padding) this process trained; a resumed run counts its own
    train_tokens_per_s: Optional[float]
    resumed_at_step: Optional[int]
    world_size: int
    eval: Optional[dict[str, Any]]  # `eagle3.draft.evaluate.evaluate_pooled` on the eval split; None without one
    geometry: dict[str, Any]
    trainable_parameters: int
    hidden_states: str  # train.hidden_states
    # Online and hybrid: what computing the states cost rank 0 during the fit (train shard, validations).
    states_source: Optional[list[dict[str, Any]]] = None

    def record(self) -> dict[str, Any]:
        """As JSON holds it (no `states_source` key where the states were stored)."""
        plain = asdict(self)
        if self.states_source is None:
            del plain["states_source"]
        return plain


def split_dataset(inputs: dict[str, Any], split: str, make_source: Optional[Any] = None,
                  hybrid: Optional[dict[str, Any]] = None) -> SplitDataset:
    """A split's dataset: the store of the `extract` input, or with `make_source` (online) the merged
    split of the `merged` input, its states computed per batch; with `hybrid` (the store's
    `HybridStateDataset` arguments) computed once and stored."""
    from eagle3.data.mixture import SPLIT_FILES
    from eagle3.states.dataset import HiddenStateDataset, OnlineStateDataset
    from eagle3.states.hybrid import HybridStateDataset

    if make_source is None:
        return HiddenStateDataset.from_manifests(inputs["extract"], split, dtype=torch.float32)
    split_file = Path(inputs["merged"].dir) / SPLIT_FILES[split]
    if hybrid is not None:
        return HybridStateDataset(split_file, make_source, dtype=torch.float32, **hybrid)
    return OnlineStateDataset(split_file, make_source, dtype=torch.float32)


def training_sets(inputs: dict[str, Any], make_source: Optional[Any] = None,
                  hybrid: Optional[dict[str, Any]] = None) -> tuple[SplitDataset, SplitDataset]:
    """`(train, eval)`: `split_dataset` of both splits."""
    return split_dataset(inputs, "train", make_source, hybrid), split_dataset(inputs, "eval", make_source, hybrid)


def fit_draft(config: Eagle3Config, train_set: SplitDataset, eval_set: SplitDataset,
              vocab_maps: tuple[torch.Tensor, torch.Tensor], unit_dir: Path, loggers: Sequence[Any],
              rescorer: Optional[Rescorer] = None) -> FitResult:
    """Build the model, data and trainer for a unit directory and train, resuming from its `last.ckpt`.

    Args:
        config: The job's config (`model`, `train`, `seed`, `paths.hf_cache`, and `logger` for the trainer).
        train_set, eval_set: The splits (`training_sets`: stored or online states).
        vocab_maps: `(d2t, t2d)` of the vocab stage (`load_vocab_maps`).
        unit_dir: The train unit directory (checkpoints and the fit summary go there).
        loggers: The job's experiment loggers (`eagle3.tracking.job_loggers`), shared with the stages
            that log reports into the same run after training.
        rescorer: `train.ttt_chains=rescored`: the target scoring the draft's own chains (`eagle3.draft.rescoring`).
    """
    import lightning as L

    from eagle3.draft.batching import DraftDataModule
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.target.weights import load_embedding_and_head

    m, t = config.model, config.train
    L.seed_everything(config.seed, workers=True, verbose=False)
    geometry = draft_geometry(m, config.paths.hf_cache)
    embed, head = load_embedding_and_head(m.path, revision=m.revision, cache_dir=config.paths.hf_cache,
                                          text_config_key=m.text_config_key)
    d2t, t2d = vocab_maps
    module = DraftModule(geometry, head, t, embed=embed, d2t=d2t, t2d=t2d, rescorer=rescorer)
    data = DraftDataModule(train_set, eval_set if len(eval_set) else None, batch_tokens=t.batch_tokens,
                           seed=config.seed, num_workers=t.num_workers, packing=t.packing)
    trainer = build_trainer(config, loggers, unit_dir, [data.position_callback()])
    ckpt_dir = unit_dir / CHECKPOINT_DIR
    resume, resumed_at = resume_point(ckpt_dir)
    if resume is not None:
        log.info("train: resuming from %s (step %d)", resume, resumed_at)
    started = time.perf_counter()
    with ranks_share_cores(int(trainer.num_devices), trainer.strategy.root_device.type == "cpu"):
        trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume is not None else None)
    return FitResult(trainer, module, train_set, eval_set, time.perf_counter() - started, resumed_at)


class UnreadableCheckpoints(Eagle3Error):
    """Every checkpoint a killed fit left is unreadable: resuming from none of them, nor silently from scratch."""


def resume_point(ckpt_dir: Path) -> tuple[Optional[Path], Optional[int]]:
    """The newest readable checkpoint of a killed fit and its step, or `(None, None)` when there is none.

    Checkpoints are written atomically, so a torn one means a damaged disk or a copy cut short; the
    `step*.ckpt` Lightning keeps beside `last.ckpt` is then the place to resume from. Read with
    `mmap=True`: opening the archive and one scalar costs no read of the weights.

    Raises:
        UnreadableCheckpoints: Checkpoints exist but none can be read (one line naming each).
    """
    found = sorted(ckpt_dir.glob("*.ckpt")) if ckpt_dir.is_dir() else []
    readable: list[tuple[int, bool, Path]] = []
    broken: list[str] = []
    for path in found:
        try:
            step = int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])
        except Exception as exc:  # noqa: BLE001 - torch's zip reader raises RuntimeError, EOFError, KeyError...
            text = str(exc).strip().splitlines()
            broken.append(f"{path.name} ({type(exc).__name__}: {text[0][:160] if text else ''})")
            continue
        readable.append((step, path.name == LAST_CHECKPOINT, path))
    if broken and readable:
        log.warning("train: unreadable checkpoint(s) in %s: %s; resuming from the newest readable one",
                    ckpt_dir, "; ".join(broken))
    if not readable:
        if broken:
            raise UnreadableCheckpoints(
                f"train: no checkpoint of the interrupted fit in {ckpt_dir} can be read: {'; '.join(broken)}; "
                "restore them, or delete that directory to train this unit from the start")
        return None, None
    step, _, path = max(readable)  # the newest step; last.ckpt on a tie (it holds the epoch-end state)
    return path, step


def export_engines(module: Any, export_root: Path, dtype: str, metadata: dict[str, Any]) -> dict[str, str]:
    """The trained draft exported under `export_root/<engine>` (validated on write) for every engine
    that serves its geometry (`eagle3.draft.geometry.geometry_refusals`); the others are logged and left out."""
    from eagle3.draft.export import export_draft

    refused = engines_refusing(module.draft.geometry, ENGINES)
    for engine, why in refused.items():
        log.info("train: no %s export: it cannot serve %s", engine,
                 "; ".join(f"{r.config_key} ({r.field} {r.message()})" for r in why))
    return {engine: str(export_draft(module.draft, export_root / engine, engine, dtype=dtype, extra_metadata=metadata))
            for engine in ENGINES if engine not in refused}
