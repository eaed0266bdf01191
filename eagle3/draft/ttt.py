"""Training-time test (TTT): K unrolled draft steps, each trained toward the target's distribution.

Indexing (DESIGN.md section 4), for a sample of length n and step k = 0..K-1, at position t:
the draft reads fc(aux[t]) (step 0) or its own step-(k-1) output at t, plus the embedding of
token t+1+k; it predicts token j = t+2+k against the teacher distribution at position t+1+k
(the target's prediction of token j). The prediction counts iff j < n and loss_mask[j] = 1.

The teacher is the frozen target lm_head applied to the stored final state, restricted (and
renormalised) to the draft vocab. When the target's argmax over its full vocab is not in the
draft vocab the draft cannot be right: such positions always count as misses in the metrics
(the simulated accept length stays honest) and, with `out_of_vocab="mask"`, are left out of
the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from eagle3.draft.attention import ttt_attention
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.options import OOV_MASK, OUT_OF_VOCAB_POLICIES


@dataclass
class Teacher:
    """Per position t: the target's distribution of token t+1 over the draft vocab.

    Attributes:
        probs: `[B, T, draft_vocab]` float32.
        argmax: `[B, T]` draft id of the target's full-vocab argmax; -1 if outside the draft vocab.
        neg_entropy: `[B, T]` sum p log p (KL = this - sum p log q; computed once, not per step).
    """

    probs: torch.Tensor
    argmax: torch.Tensor
    neg_entropy: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.neg_entropy is None:
            self.neg_entropy = torch.xlogy(self.probs, self.probs).sum(-1)


@torch.no_grad()
def teacher_targets(final: torch.Tensor, head: torch.Tensor, draft_ids: torch.Tensor,
                    chunk_tokens: int = 4096, renormalise: bool = True) -> Teacher:
    """Teacher signal from stored final states `[B, T, H]` and the target lm_head `[V, H]`.

    Full-vocab logits exist for `chunk_tokens` rows at a time only (at V = 163840 a full batch
    would not fit). `renormalise=False` keeps the full-vocab probabilities of the draft-vocab
    ids (rows sum to the in-vocab mass; `train.teacher=full_vocab`).
    """
    bsz, seq, hidden = final.shape
    vocab = head.shape[0]
    to_draft = torch.full((vocab,), -1, dtype=torch.long, device=head.device)
    to_draft[draft_ids] = torch.arange(len(draft_ids), device=head.device)
    flat = final.reshape(-1, hidden)
    probs, argmax = [], []
    for start in range(0, flat.shape[0], chunk_tokens):
        logits = flat[start:start + chunk_tokens].float() @ head.float().T  # [n, V]
        argmax.append(to_draft[logits.argmax(-1)])
        if renormalise:
            probs.append(torch.softmax(logits[:, draft_ids], dim=-1))
        else:
            probs.append(torch.softmax(logits, dim=-1)[:, draft_ids])
    return Teacher(probs=torch.cat(probs).view(bsz, seq, -1), argmax=torch.cat(argmax).view(bsz, seq))


@dataclass
class TTTOutput:
    """Loss and per-step statistics of one batch.

    Attributes:
        loss: Weighted sum over steps of the mean KL per loss token (what is optimised).
        step_loss: `[K]` mean KL per step (detached).
        correct: `[K]` counted predictions whose argmax equals the target's.
        counted: `[K]` predictions that count (loss-masked, inside the sample).
        loss_tokens: `[K]` predictions in the loss (counted, minus out-of-vocab ones under "mask").
    """

    loss: torch.Tensor
    step_loss: torch.Tensor
    correct: torch.Tensor
    counted: torch.Tensor
    loss_tokens: torch.Tensor


def _kl_terms(draft: Eagle3Draft, state: torch.Tensor, probs: torch.Tensor, neg_entropy: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted KL sum and argmax: states `[B, L, H]`, probs `[B, L, Vd]`, neg_entropy / weight `[B, L]`."""
    logits = draft.logits(state).float()  # [B, L, Vd]
    logq = torch.log_softmax(logits, dim=-1)
    kl = neg_entropy - (probs * logq).sum(-1)  # [B, L]
    return (kl * weight).sum(), logits.argmax(-1)


def ttt_forward(draft: Eagle3Draft, aux: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                lengths: torch.Tensor, teacher: Teacher, *, steps: int, decay: float, out_of_vocab: str,
                block_size: int) -> TTTOutput:
    """Unroll `steps` draft steps over a right-padded batch.

    Args:
        aux: `[B, T, C*H_t]` captured target states. input_ids / loss_mask: `[B, T]`.
        lengths: `[B]` real lengths (positions beyond are padding).
        teacher: From `teacher_targets` over the same batch.
    """
    if out_of_vocab not in OUT_OF_VOCAB_POLICIES:
        raise ValueError(f"train.out_of_vocab={out_of_vocab!r}; valid: {', '.join(OUT_OF_VOCAB_POLICIES)}")
    bsz, seq = input_ids.shape
    device = input_ids.device
    pos = torch.arange(seq, device=device)
    mask = loss_mask.bool()
    hidden = draft.project(aux)  # [B, T, H]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys.append(k)
        values.append(v)
        return ttt_attention(q, keys, values, block_size)

    losses, step_loss, correct, counted, loss_tokens = [], [], [], [], []
    grad = torch.is_grad_enabled()
    for k in range(steps):
        shift = 1 + k  # token read at t is t+shift; predicted token is j = t+shift+1
        span = seq - shift  # positions t with an input token
        if span <= 0:
            break
        tokens = torch.zeros_like(input_ids)
        tokens[:, :span] = input_ids[:, shift:]
        state = draft.step(hidden, tokens, pos + k, attend)  # [B, T, H]

        j = pos[:span] + shift + 1  # predicted token index per position t < span
        in_sample = j.unsqueeze(0) < lengths.unsqueeze(1)  # [B, span]
        target_mask = torch.zeros_like(in_sample)
        target_mask[:, :span - 1] = mask[:, shift + 1:]
        count = in_sample & target_mask
        target = teacher.argmax[:, shift:]  # [B, span]
        weight = count & (target >= 0) if out_of_vocab == OOV_MASK else count
        args = (draft, state[:, :span], teacher.probs[:, shift:], teacher.neg_entropy[:, shift:],
                weight.to(teacher.probs.dtype))
        kl_sum, pred = checkpoint(_kl_terms, *args, use_reentrant=False) if grad else _kl_terms(*args)
        n_loss = weight.sum()
        loss_k = kl_sum / n_loss.clamp(min=1)
        losses.append(loss_k * decay ** k)
        step_loss.append(loss_k.detach())
        correct.append(((pred == target) & count).sum())
        counted.append(count.sum())
        loss_tokens.append(n_loss)
        hidden = draft.carry(state)
    return TTTOutput(loss=torch.stack(losses).sum(), step_loss=torch.stack(step_loss),
                     correct=torch.stack(correct), counted=torch.stack(counted),
                     loss_tokens=torch.stack(loss_tokens))
