"""Lightning wrapper of the draft: TTT loss, per-step metrics, optimizer and schedule.

Metrics logged per TTT step k (train and eval): `loss_k`, `acc_k` (top-1 agreement with the
target), and `sim_accept_len` = 1 + sum_k prod_{j<=k} acc_j. Eval metrics are pooled over the
whole eval split (and over ranks) before they are logged, so they are one figure per eval.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, cast

import lightning as L
import torch
from hydra.utils import instantiate

from eagle3.config.schema import TrainConfig
from eagle3.draft.acceptance import simulated_accept_length
from eagle3.draft.checkpoint_io import embedding_fingerprint, leave_out_embedding, put_back_embedding
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.options import LR_SCHEDULES, TEACHER_DRAFT_VOCAB
from eagle3.draft.rescoring import Rescorer
from eagle3.draft.teacher import teacher_from_topk, teacher_positions, teacher_targets
from eagle3.draft.teacher_head import TeacherHead
from eagle3.draft.ttt import add_state_noise, ttt_forward


def lr_multiplier(step: int, total: int, warmup: int, floor: float = 0.1, schedule: str = "cosine") -> float:
    """LR multiplier: linear warmup to 1, then cosine or linear (`schedule`) down to `floor`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"train.lr_schedule={schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return floor + (1 - floor) * shape


class DraftModule(L.LightningModule):
    """Trains an `Eagle3Draft` against stored target states.

    Args:
        geometry: Draft shape. head: Frozen target lm_head `[V, H_t]` (the teacher).
        embed / d2t / t2d: Target embedding and vocab maps, copied into the draft when given (a
            resumed run reads d2t / t2d from its checkpoint, which leaves the frozen embedding out:
            `eagle3.draft.checkpoint_io`, so a fit always gives it).
        train: The `train` config (TTT steps and loss, optimizer, schedule). It stays an
            attribute, out of the checkpoint: a resumed run takes the config of its rerun, whose
            fingerprint equals the killed one's.
        rescorer: `train.ttt_chains=rescored`: the target that scores the draft's own chains in each
            training batch (`eagle3.draft.rescoring`); eval batches keep the data's chains, so the eval
            figures compare with every other recipe's.
    """

    teacher_head: torch.Tensor  # a buffer (register_buffer), declared for the type checker

    def __init__(self, geometry: DraftGeometry, head: torch.Tensor, train: TrainConfig,
                 embed: torch.Tensor | None = None, d2t: torch.Tensor | None = None,
                 t2d: torch.Tensor | None = None, rescorer: Rescorer | None = None) -> None:
        super().__init__()
        self.draft = Eagle3Draft(geometry)
        if embed is not None:
            assert d2t is not None and t2d is not None, "embed, d2t and t2d are given together"
            self.draft.init_from_target(embed, head, d2t, t2d)
        self.register_buffer("teacher_head", head.float(), persistent=False)
        self.train_config = train
        self.rescorer = rescorer
        self.steps = train.ttt_steps
        self._eval_sums: dict[str, torch.Tensor] = {}
        self._teacher_split: TeacherHead | None = None
        self._embedding_fingerprint: dict[str, Any] | None = None
        self.last_eval: dict[str, Any] = {}

    # ------------------------------------------------------------------ checkpoints
    def embedding_fingerprint(self) -> dict[str, Any]:
        """The frozen embedding's fingerprint, computed once (it never changes)."""
        if self._embedding_fingerprint is None:
            self._embedding_fingerprint = embedding_fingerprint(self.draft.embed_tokens.weight)
        return self._embedding_fingerprint

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        leave_out_embedding(checkpoint, self.embedding_fingerprint())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        put_back_embedding(checkpoint, self.draft.embed_tokens.weight, self.embedding_fingerprint())

    # ------------------------------------------------------------------ forward
    def run_batch(self, batch: dict[str, torch.Tensor], state_noise: float = 0.0, rescore: bool = False):
        """One batch's TTT; `rescore` (training batches) lets the rescorer, if any, supply the chains."""
        packed = {key: batch[key] for key in ("positions", "segment_ends") if key in batch}  # train.packing
        needed = teacher_positions(batch["loss_mask"], batch["lengths"], **packed)
        aux = add_state_noise(batch["aux"], len(self.draft.geometry.capture_layers), state_noise)
        t = self.train_config
        renormalise = t.teacher == TEACHER_DRAFT_VOCAB
        head = self._split_head() if renormalise else self.teacher_head
        if "teacher_ids" in batch:  # a compact store: the teacher's top k, not the final state
            teacher = teacher_from_topk(batch["teacher_ids"], batch["teacher_logprob"], self.teacher_head.shape[0],
                                        self.draft.draft_ids(), renormalise=renormalise, needed=needed)
        else:
            teacher = teacher_targets(batch["final"], head, self.draft.draft_ids(),
                                      renormalise=renormalise, needed=needed)
        rollout = None
        if rescore and self.rescorer is not None:
            rollout = self.rescorer.rollout(self.draft, head, aux, batch, renormalise)
        return ttt_forward(self.draft, aux, batch["input_ids"], batch["loss_mask"], batch["lengths"],
                           teacher, steps=self.steps, decay=t.ttt_decay, out_of_vocab=t.out_of_vocab,
                           block_size=t.attention_block, logits_budget_bytes=t.logits_memory_gb * 2**30,
                           loss=t.loss, step_weights=t.step_weights,
                           dpace_smoothing=t.dpace_smoothing, ttt_chains=t.ttt_chains, rollout=rollout, **packed)

    def _split_head(self) -> TeacherHead:
        """The teacher head split by the draft vocab, built once (not per batch: ~0.3 s at V = 262K).

        Rebuilt if the module moved or its d2t changed (a resumed run loads the checkpoint's after __init__).
        """
        split, draft_ids = self._teacher_split, self.draft.draft_ids()
        if split is None or split.full.device != self.teacher_head.device or not torch.equal(split.draft_ids,
                                                                                             draft_ids):
            split = self._teacher_split = TeacherHead.build(self.teacher_head, draft_ids)
        return split

    def _step_metrics(self, out, prefix: str) -> dict[str, torch.Tensor]:
        metrics = {f"{prefix}/loss": out.loss.detach()}
        accs = []
        for k in range(len(out.step_loss)):
            acc = out.correct[k].float() / out.counted[k].clamp(min=1).float()
            accs.append(float(acc))
            metrics[f"{prefix}/loss_{k}"] = out.step_loss[k]
            metrics[f"{prefix}/acc_{k}"] = acc
        metrics[f"{prefix}/sim_accept_len"] = torch.tensor(simulated_accept_length(accs))
        return metrics

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self.run_batch(batch, state_noise=self.train_config.state_noise, rescore=True)  # eval: clean states
        tokens = batch["lengths"].sum()
        self.log_dict(self._step_metrics(out, "train"), on_step=True, on_epoch=False, prog_bar=False,
                      batch_size=int(tokens))
        self.log("train/tokens", tokens.float(), on_step=True, reduce_fx="sum", batch_size=1)
        self.log("loss", out.loss.detach(), prog_bar=True, logger=False, batch_size=int(tokens))
        return out.loss

    # ------------------------------------------------------------------ eval
    def on_validation_epoch_start(self) -> None:
        self._eval_sums = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self.run_batch(batch)
        parts = {"loss_sum": out.step_loss * out.loss_tokens, "loss_tokens": out.loss_tokens.float(),
                 "correct": out.correct.float(), "counted": out.counted.float()}
        for key, value in parts.items():
            value = torch.nn.functional.pad(value, (0, self.steps - len(value)))
            self._eval_sums[key] = self._eval_sums.get(key, 0) + value

    def on_validation_epoch_end(self) -> None:
        sums = {k: self._eval_sums.get(k, torch.zeros(self.steps, device=self.device)) for k in
                ("loss_sum", "loss_tokens", "correct", "counted")}
        if self.trainer.world_size > 1:
            # all_gather of a tensor is a tensor (its declared type also covers collections)
            sums = {k: cast(torch.Tensor, self.all_gather(v)).sum(0) for k, v in sums.items()}
        step_loss = sums["loss_sum"] / sums["loss_tokens"].clamp(min=1)
        acc = sums["correct"] / sums["counted"].clamp(min=1)
        decay = self.train_config.ttt_decay
        metrics = {"eval/loss": sum(decay ** k * step_loss[k] for k in range(self.steps))}
        for k in range(self.steps):
            metrics[f"eval/loss_{k}"] = step_loss[k]
            metrics[f"eval/acc_{k}"] = acc[k]
        sim = simulated_accept_length(acc)
        metrics["eval/sim_accept_len"] = torch.tensor(sim)
        self.log_dict(metrics, sync_dist=False)
        self.last_eval = {"acc": [round(float(a), 5) for a in acc],
                          "step_loss": [round(float(x), 5) for x in step_loss],
                          "sim_accept_len": round(sim, 4), "counted": [int(c) for c in sums["counted"]],
                          "epoch": int(self.current_epoch), "global_step": int(self.global_step)}

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        params = [(name, p) for name, p in self.draft.named_parameters() if p.requires_grad]
        # Partial, so the (name, tensor) pairs reach the optimizer as tuples (instantiate would turn them into lists).
        t = self.train_config
        optimizer = instantiate(asdict(t.optimizer), _partial_=True, _convert_="all")(params)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = int(round(t.warmup_ratio * total))
        floor, schedule = t.min_lr_ratio, t.lr_schedule
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_multiplier(s, total, warmup, floor, schedule))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
