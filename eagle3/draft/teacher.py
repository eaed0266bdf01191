"""The teacher signal of TTT: the target's next-token distribution over the draft vocab, per position.

From the stored final states and the target's lm_head (`teacher_targets`), or from a compact store's
top-k (`teacher_from_topk`), at the positions some TTT step reads (`teacher_positions`). Indexing as in
`eagle3.draft.ttt`: the row at position p is the target's distribution of token p+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.draft.teacher_head import TeacherHead, without_autocast


@dataclass
class Teacher:
    """Per position t: the target's distribution of token t+1 over the draft vocab.

    Only the positions a loss or a metric reads hold a row (`teacher_positions`): prompt tokens,
    padding and the last token of a sample never do, and at a 49K-152K target vocab each row
    costs a full-vocab lm_head product.

    Attributes:
        probs: `[N, draft_vocab]` float32, one row per computed position.
        argmax: `[B, T]` draft id of the target's full-vocab argmax; -1 if outside the draft vocab
            (or not computed).
        row_of: `[B, T]` row of `probs` for each position; -1 where none was computed.
        neg_entropy: `[N]` sum p log p (KL = this - sum p log q; computed once, not per step).
    """

    probs: torch.Tensor
    argmax: torch.Tensor
    row_of: torch.Tensor
    neg_entropy: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.neg_entropy is None:
            self.neg_entropy = torch.xlogy(self.probs, self.probs).sum(-1)

    @classmethod
    def dense(cls, probs: torch.Tensor, argmax: torch.Tensor) -> Teacher:
        """A teacher with a row at every position of `probs` `[B, T, Vd]`."""
        bsz, seq, vocab = probs.shape
        row_of = torch.arange(bsz * seq, device=probs.device).view(bsz, seq)
        return cls(probs=probs.reshape(-1, vocab), argmax=argmax, row_of=row_of)

    def at(self, b: int, t: int) -> torch.Tensor:
        """The distribution at sample b, position t `[Vd]` (which must have been computed)."""
        row = int(self.row_of[b, t])
        if row < 0:
            raise IndexError(f"no teacher row at ({b}, {t}): not a position any loss reads")
        return self.probs[row]


def teacher_positions(loss_mask: torch.Tensor, lengths: torch.Tensor, positions: torch.Tensor | None = None,
                      segment_ends: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, T]` bool: positions p whose teacher row some TTT step reads.

    Step k at t reads the teacher at p = t+1+k (k >= 0, so p >= 1) for the token p+1, which must
    be inside the sample and in the loss mask. Packed rows (`positions`, `segment_ends` `[B, T]`,
    `eagle3.draft.packing`): p is not its sample's first token and p+1 lies before its sample's end.
    """
    bsz, seq = loss_mask.shape
    needed = torch.zeros(bsz, seq, dtype=torch.bool, device=loss_mask.device)
    if seq > 2:
        nxt = torch.arange(2, seq, device=loss_mask.device)  # p + 1 for p = 1 .. T-2
        if segment_ends is None or positions is None:
            needed[:, 1:seq - 1] = loss_mask[:, 2:].bool() & (nxt.unsqueeze(0) < lengths.unsqueeze(1))
        else:
            needed[:, 1:seq - 1] = (loss_mask[:, 2:].bool() & (nxt.unsqueeze(0) < segment_ends[:, 1:seq - 1])
                                    & (positions[:, 1:seq - 1] >= 1))
    return needed


@torch.no_grad()
def teacher_targets(final: torch.Tensor, head: torch.Tensor | TeacherHead, draft_ids: torch.Tensor,
                    chunk_tokens: int = 4096, renormalise: bool = True,
                    needed: torch.Tensor | None = None) -> Teacher:
    """Teacher signal from stored final states `[B, T, H]` and the target lm_head `[V, H]`.

    `head` may come split already (`TeacherHead.build(head, draft_ids)`, what training does once):
    the renormalised teacher then screens the out-of-vocab logits in bf16 (`eagle3.draft.teacher_head`)
    and has the float32 one's argmax exactly and its probabilities up to float32 summation order.
    Full-vocab logits exist for `chunk_tokens` rows at a time only (at V = 163840 a full batch would
    not fit). `renormalise=False` keeps the full-vocab probabilities of the draft-vocab ids (rows sum to the
    in-vocab mass; `train.teacher=full_vocab`). `needed` `[B, T]` bool (default: every position)
    chooses the positions that get a row.
    """
    if isinstance(head, TeacherHead):
        if not torch.equal(head.draft_ids, draft_ids.to(head.draft_ids.device)):
            raise ValueError("teacher_targets: the TeacherHead was split for another draft vocab")
        split = head
    else:
        split = TeacherHead.build(head, draft_ids, screen=None if renormalise else False)
    bsz, seq, hidden = final.shape
    if needed is None:
        needed = torch.ones(bsz, seq, dtype=torch.bool, device=final.device)
    where = needed.reshape(-1).nonzero().squeeze(1)  # [N] flat positions
    flat = final.reshape(-1, hidden)[where]
    probs, argmax = [], []
    with without_autocast(final.device):  # float32 under a bf16-mixed training_step too
        for start in range(0, flat.shape[0], chunk_tokens):
            chunk = flat[start:start + chunk_tokens]
            if renormalise:
                logits, best = split.draft_logits(chunk)  # [n, Vd], [n]
                probs.append(torch.softmax(logits, dim=-1))
            else:
                full = chunk.float() @ split.full.T  # [n, V]
                best = split.draft_id_of(full.argmax(-1))
                probs.append(torch.softmax(full, dim=-1)[:, split.draft_ids])
            argmax.append(best)
    dense_argmax = torch.full((bsz * seq,), -1, dtype=torch.long, device=final.device)
    row_of = torch.full((bsz * seq,), -1, dtype=torch.long, device=final.device)
    if len(where):
        dense_argmax[where] = torch.cat(argmax)
        row_of[where] = torch.arange(len(where), device=final.device)
    rows = torch.cat(probs) if probs else final.new_zeros(0, len(draft_ids), dtype=torch.float32)
    return Teacher(probs=rows, argmax=dense_argmax.view(bsz, seq), row_of=row_of.view(bsz, seq))


@torch.no_grad()
def teacher_from_topk(top_ids: torch.Tensor, top_logprob: torch.Tensor, vocab_size: int, draft_ids: torch.Tensor,
                      renormalise: bool = True, needed: torch.Tensor | None = None) -> Teacher:
    """The teacher of a compact store: the target's top-k next tokens instead of its final state.

    Args:
        top_ids: `[B, T, k]` target ids, most likely first. top_logprob: `[B, T, k]` their full-vocab
            log-probabilities. vocab_size: V of the target (the ids' range).
        renormalise / needed: As in :func:`teacher_targets`.

    Equals :func:`teacher_targets` on the same final states with the tail beyond k left out: rows
    keep the in-vocab part of the top k (`renormalise` rescales it to sum to 1); a row with no
    top-k token in the draft vocab stays all zero and adds nothing to the loss.
    """
    bsz, seq, _ = top_ids.shape
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=top_ids.device)
    to_draft[draft_ids] = torch.arange(len(draft_ids), device=top_ids.device)
    if needed is None:
        needed = torch.ones(bsz, seq, dtype=torch.bool, device=top_ids.device)
    where = needed.reshape(-1).nonzero().squeeze(1)  # [N] flat positions
    drafted = to_draft[top_ids.reshape(bsz * seq, -1)[where]]  # [N, k] draft ids, -1 outside the draft vocab
    mass = top_logprob.reshape(bsz * seq, -1)[where].float().exp() * (drafted >= 0)  # [N, k]
    rows = torch.zeros(len(where), len(draft_ids), dtype=torch.float32, device=top_ids.device)
    rows.scatter_add_(1, drafted.clamp_min(0), mass)
    if renormalise:
        total = rows.sum(-1, keepdim=True)
        rows = torch.where(total > 0, rows / total.clamp_min(torch.finfo(torch.float32).tiny), rows)
    dense_argmax = torch.full((bsz * seq,), -1, dtype=torch.long, device=top_ids.device)
    row_of = torch.full((bsz * seq,), -1, dtype=torch.long, device=top_ids.device)
    if len(where):
        dense_argmax[where] = drafted[:, 0]
        row_of[where] = torch.arange(len(where), device=top_ids.device)
    return Teacher(probs=rows, argmax=dense_argmax.view(bsz, seq), row_of=row_of.view(bsz, seq))
