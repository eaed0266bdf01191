"""Simulated acceptance of a draft on a whole split, pooled over every counted prediction.

Per-batch accuracies averaged over batches would weight a short sample like a long one; the
figures reported for a draft (manifests, eval report) pool the counts instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from eagle3.draft.acceptance import simulated_accept_length
from eagle3.draft.data import collate_padded, fetch, plan_token_batches

if TYPE_CHECKING:
    from eagle3.extract.dataset import SplitDataset


@torch.no_grad()
def evaluate_pooled(module, dataset: SplitDataset, batch_tokens: int) -> dict[str, Any]:
    """Per-step agreement, KL and simulated accept length of `module` (a DraftModule) on `dataset`."""
    steps = module.steps
    correct, counted = torch.zeros(steps), torch.zeros(steps)
    loss_sum, loss_tokens = torch.zeros(steps), torch.zeros(steps)
    was_training = module.training
    module.eval()
    for batch_ids in plan_token_batches([int(n) for n in dataset.lengths], batch_tokens):
        batch = collate_padded(fetch(dataset, batch_ids))
        batch = {k: v.to(module.device) for k, v in batch.items()}
        out = module.run_batch(batch)
        n = len(out.step_loss)
        correct[:n] += out.correct.float().cpu()
        counted[:n] += out.counted.float().cpu()
        loss_sum[:n] += (out.step_loss * out.loss_tokens).float().cpu()
        loss_tokens[:n] += out.loss_tokens.float().cpu()
    module.train(was_training)
    acc = (correct / counted.clamp(min=1)).tolist()
    return {
        "acc": [round(a, 5) for a in acc],
        "step_kl": [round(x, 5) for x in (loss_sum / loss_tokens.clamp(min=1)).tolist()],
        "sim_accept_len": round(simulated_accept_length(acc), 4),
        "sim_accept_len_by_k": {k: round(simulated_accept_length(acc[:k]), 4) for k in range(1, steps + 1)},
        "counted": [int(c) for c in counted.tolist()],
        "samples": len(dataset),
    }
