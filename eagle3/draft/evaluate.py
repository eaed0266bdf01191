"""How good a trained draft is, on the weights a server would load: simulated and real acceptance.

(a) Simulated: per-step top-1 agreement of the exported draft with the target on the eval
split's stored states, and `1 + sum prod acc` (`evaluate_pooled`: pooled over every counted
prediction, since per-batch accuracies averaged over batches would weight a short sample like a
long one). (b) Real: greedy speculative decoding in-process with the HF target on held-out
prompts, chain drafting of K tokens for each K (`speculative`), tokens per target forward,
speedup over plain greedy decoding, and whether the output equals plain greedy decoding token for token (it must).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from eagle3.config.schema import TrainConfig
from eagle3.draft.acceptance import chain_accept_length, simulated_accept_length
from eagle3.draft.batching import collate_padded, fetch, plan_token_batches

if TYPE_CHECKING:
    from eagle3.states.dataset import SplitDataset

__all__ = ["LossyDecoding", "evaluate_pooled", "load_eval_draft", "real_acceptance", "simulated_acceptance"]


class LossyDecoding(RuntimeError):
    """Speculative decoding differed from greedy decoding: a bug, never a result."""


def load_eval_draft(export_dir: Path, target_path: str, *, revision: Optional[str], cache_dir: Optional[str],
                    text_config_key: Optional[str]) -> tuple[Any, Any, torch.Tensor]:
    """`(geometry, draft, target lm_head)`: the exported draft with the target's embedding put back.

    Exports leave the frozen embedding out (the engines take the target's); the draft is run
    here in float32 on the CPU.
    """
    from eagle3.draft.export import load_exported
    from eagle3.target.weights import load_embedding_and_head

    geometry, _, draft = load_exported(export_dir)
    embed, head = load_embedding_and_head(target_path, revision=revision, cache_dir=cache_dir,
                                          text_config_key=text_config_key)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed)
    return geometry, draft, head


def simulated_acceptance(geometry: Any, draft: Any, head: torch.Tensor, train: TrainConfig,
                         eval_set: Any, ks: Sequence[int], batch_tokens: int) -> dict[str, Any]:
    """Per-step agreement on the eval split, over max(train steps, max K) steps (`evaluate_pooled`)."""
    from eagle3.draft.lightning_module import DraftModule

    module = DraftModule(geometry, head, replace(train, ttt_steps=max(train.ttt_steps, max(int(k) for k in ks))))
    module.draft.load_state_dict(draft.state_dict())
    return evaluate_pooled(module, eval_set, batch_tokens=batch_tokens)


def _eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]


def real_acceptance(target_path: str, draft: Any, prompts: Sequence[Sequence[int]], *, ks: Sequence[int],
                    max_new_tokens: int, capture_layers: Sequence[int], check_lossless: bool,
                    revision: Optional[str], trust_remote_code: bool, cache_dir: Optional[str]) -> dict[str, Any]:
    """Greedy speculative decoding of `prompts` with the HF target at each K (`speculative`).

    Raises:
        LossyDecoding: With `check_lossless`, an output differed from plain greedy decoding.
    """
    from transformers import AutoModelForCausalLM

    from eagle3.draft.speculative import evaluate_speculative

    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32, revision=revision,
                                                  trust_remote_code=trust_remote_code, cache_dir=cache_dir).eval()
    threads = torch.get_num_threads()
    if not torch.cuda.is_available():
        # Batch-1 decoding of a small model: per-op work is tiny, and extra CPU threads only add
        # synchronisation (measured 75x slower with 2 threads when another job shares the cores).
        torch.set_num_threads(1)
    try:
        real = evaluate_speculative(target, draft.eval(), list(prompts), ks=tuple(int(k) for k in ks),
                                    max_new_tokens=int(max_new_tokens), eos_ids=_eos_ids(target),
                                    capture_layers=list(capture_layers), check_lossless=check_lossless)
    finally:
        torch.set_num_threads(threads)
    lossy = [k for k, res in real.items() if check_lossless and not res["lossless"]]
    if lossy:
        raise LossyDecoding(f"speculative decoding differed from greedy decoding at K={lossy}: a bug")
    return real


@torch.no_grad()
def evaluate_pooled(module, dataset: SplitDataset, batch_tokens: int) -> dict[str, Any]:
    """Per-step agreement, KL and simulated accept length of `module` (a DraftModule) on `dataset`."""
    steps = module.steps
    correct, counted, chain_correct = torch.zeros(steps), torch.zeros(steps), torch.zeros(steps)
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
        chain_correct[:n] += out.chain_correct.float().cpu()
        loss_sum[:n] += (out.step_loss * out.loss_tokens).float().cpu()
        loss_tokens[:n] += out.loss_tokens.float().cpu()
    module.train(was_training)
    acc = (correct / counted.clamp(min=1)).tolist()
    joint = (chain_correct / counted.clamp(min=1)).tolist()
    return {
        "acc": [round(a, 5) for a in acc],
        "step_kl": [round(x, 5) for x in (loss_sum / loss_tokens.clamp(min=1)).tolist()],
        "sim_accept_len": round(simulated_accept_length(acc), 4),
        "sim_accept_len_by_k": {k: round(simulated_accept_length(acc[:k]), 4) for k in range(1, steps + 1)},
        # Chain by chain (no independence assumed): the joint rate of steps 0..k agreeing, and its τ.
        "chain_acc": [round(a, 5) for a in joint],
        "chain_accept_len": round(chain_accept_length(joint), 4),
        "chain_accept_len_by_k": {k: round(chain_accept_length(joint[:k]), 4) for k in range(1, steps + 1)},
        "counted": [int(c) for c in counted.tolist()],
        "samples": len(dataset),
    }
