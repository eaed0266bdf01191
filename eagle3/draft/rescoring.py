"""Train each TTT step on the draft's own chain, scored by the target (`train.ttt_chains=rescored`).

EAGLE-3's TTT feeds step k the data's token t+1+k whatever the draft drafted at step k-1; served, the
draft reads its own. Here, per batch: (1) the draft drafts its chains at every start t without grad
(`draft_chains`: the tokens a served draft would draft from that prefix); (2) the target scores every
chain's prefixes at once, as branches of a prefix tree off the sample (a `BranchScorer`, e.g.
`eagle3.target.tree.TreeScorer`); (3) the training pass feeds step k the drafted token and learns
toward the target's distribution after the drafted prefix (`eagle3.draft.chains.Rollout`). Where the
chain followed the data the rescored teacher is the stored one (up to the kernels' rounding).

The cost is a target forward over the sample plus K-1 branch tokens per trained chain start, and a
draft forward without grad, per batch: the target must fit in the training process beside the draft.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from eagle3.draft.attention import TTTAttention
from eagle3.draft.chains import Rollout
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.teacher import Teacher, teacher_targets
from eagle3.draft.teacher_head import TeacherHead

#: Rows whose draft-vocab logits exist at once while drafting (x 32K floats: 128 MiB).
ARGMAX_CHUNK_ROWS = 1024


class BranchScorer(Protocol):
    """The target: its final states at the nodes of branches off one sample (`eagle3.target.tree`)."""

    def final_states(self, tokens: torch.Tensor, branch_at: torch.Tensor, branch_tokens: torch.Tensor,
                     depth: torch.Tensor) -> torch.Tensor: ...


@torch.no_grad()
def draft_chains(draft: Eagle3Draft, aux: torch.Tensor, input_ids: torch.Tensor, steps: int,
                 block_size: int) -> torch.Tensor:
    """`[steps-1, B, T]` target ids the draft drafts at steps 0..steps-2 of the chain starting at each t.

    Step 0 at t reads the data through t+1 (and the target's states through t) and drafts the token for
    t+2; step k reads the token it drafted at step k-1. These are the tokens a served draft proposes
    after the prefix ending at t+1 (`eagle3.draft.speculative.Eagle3Drafter`; a test pins the two).
    """
    bsz, seq = input_ids.shape
    pos = torch.arange(seq, device=input_ids.device)
    hidden = draft.project(aux)  # [B, T, H]
    attention = TTTAttention(draft.geometry.num_layers, block_size)
    tokens = torch.zeros_like(input_ids)
    tokens[:, :seq - 1] = input_ids[:, 1:]
    draft_ids = draft.draft_ids()
    drafted = []
    for k in range(steps - 1):
        state = draft.step(hidden, tokens, pos + k, attention.attends)  # [B, T, H]
        flat = state.reshape(bsz * seq, -1)
        best = torch.cat([draft.logits(flat[s:s + ARGMAX_CHUNK_ROWS]).argmax(-1)
                          for s in range(0, flat.shape[0], ARGMAX_CHUNK_ROWS)])
        tokens = draft_ids[best].view(bsz, seq)
        drafted.append(tokens)
        hidden = draft.carry(state)
    return torch.stack(drafted) if drafted else input_ids.new_zeros(0, bsz, seq)


def chain_nodes(loss_mask: torch.Tensor, lengths: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(started [B, T], depth [B, T])`: which chains train after step 0, and how many drafted tokens each needs scored.

    Chain t is started when step 0's predicted token t+2 is a loss token inside the sample. Step k >= 1
    counts where token t+2+k is; it reads the target's score of the prefix ending at the drafted token of
    step k-1 (node depth k-1). A chain's branch holds depths 0..(its deepest counted step - 1): a deeper
    node's prefix includes the shallower ones.
    """
    bsz, seq = loss_mask.shape
    pos = torch.arange(seq, device=loss_mask.device)
    mask = loss_mask.bool()

    def counts(j: int) -> torch.Tensor:  # [B, T] token t+j is a loss token inside its sample
        out = torch.zeros(bsz, seq, dtype=torch.bool, device=loss_mask.device)
        if j < seq:
            out[:, :seq - j] = mask[:, j:] & (pos[j:].unsqueeze(0) < lengths.unsqueeze(1))
        return out

    started = counts(2)
    depth = torch.zeros(bsz, seq, dtype=torch.long, device=loss_mask.device)
    for k in range(1, steps):
        depth = torch.where(started & counts(2 + k), torch.full_like(depth, k), depth)
    return started, depth


@torch.no_grad()
def rescore(draft: Eagle3Draft, scorer: BranchScorer, head: torch.Tensor | TeacherHead, aux: torch.Tensor,
            input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, *, steps: int,
            block_size: int, renormalise: bool = True) -> Rollout:
    """The `Rollout` of one right-padded batch: the draft's chains and the target's teacher after each prefix."""
    bsz, seq = input_ids.shape
    drafted = draft_chains(draft, aux, input_ids, steps, block_size)  # [K-1, B, T]
    started, depth = chain_nodes(loss_mask, lengths, steps)
    finals, where = [], []
    for b in range(bsz):
        starts = (depth[b] > 0).nonzero().squeeze(1)  # [C] chain starts with a node to score
        if not len(starts):
            continue
        reps = depth[b, starts]  # [C] nodes per branch
        chain_t = starts.repeat_interleave(reps)  # [N]
        node_depth = torch.cat([torch.arange(int(r), device=depth.device) for r in reps])  # [N]
        tokens = drafted[node_depth, b, chain_t]  # [N]
        finals.append(scorer.final_states(input_ids[b, :int(lengths[b])], chain_t + 1, tokens, node_depth))
        where.append((b, chain_t, node_depth))
    hidden_size = head.full.shape[1] if isinstance(head, TeacherHead) else head.shape[1]
    final = torch.cat(finals).to(aux.device) if finals else aux.new_zeros(0, hidden_size)
    nodes = teacher_targets(final.unsqueeze(0), head, draft.draft_ids(), renormalise=renormalise)
    teachers = []
    for k in range(1, steps):
        argmax = torch.full((bsz, seq), -1, dtype=torch.long, device=input_ids.device)
        row_of = torch.full((bsz, seq), -1, dtype=torch.long, device=input_ids.device)
        offset = 0
        for b, chain_t, node_depth in where:
            at = node_depth == k - 1  # the node whose prefix ends at step k-1's drafted token
            rows = offset + at.nonzero().squeeze(1)
            argmax[b, chain_t[at] + 1 + k] = nodes.argmax[0, rows]
            row_of[b, chain_t[at] + 1 + k] = rows
            offset += len(chain_t)
        teachers.append(Teacher(probs=nodes.probs, argmax=argmax, row_of=row_of, neg_entropy=nodes.neg_entropy))
    return Rollout(tokens=drafted, teachers=teachers, started=started)


class Rescorer:
    """The target and settings `DraftModule` re-scores its training batches with (`train.ttt_chains=rescored`).

    Not a module: the target is not the draft's parameter, its checkpoint or its optimizer's.
    """

    def __init__(self, scorer: BranchScorer, steps: int, block_size: int) -> None:
        self.scorer, self.steps, self.block_size = scorer, steps, block_size
        self.scored_tokens = 0  # drafted tokens the target scored, this process
        self.seconds = 0.0  # spent drafting and scoring them

    def rollout(self, draft: Eagle3Draft, head: torch.Tensor | TeacherHead, aux: torch.Tensor,
                batch: dict[str, torch.Tensor], renormalise: bool) -> Rollout:
        started = time.perf_counter()
        rollout = rescore(draft, self.scorer, head, aux, batch["input_ids"], batch["loss_mask"], batch["lengths"],
                          steps=self.steps, block_size=self.block_size, renormalise=renormalise)
        self.scored_tokens += int(rollout.teachers[0].probs.shape[0]) if rollout.teachers else 0
        self.seconds += time.perf_counter() - started
        return rollout
