"""Training-time test (TTT): K unrolled draft steps, each trained toward the target's distribution.

Indexing (docs/design.md, 'Training-time test'), for a sample of length n and step k = 0..K-1, at
position t: the draft reads fc(aux[t]) (step 0) or its own step-(k-1) output at t, plus the embedding of
token t+1+k; it predicts token j = t+2+k against the teacher distribution at position t+1+k
(the target's prediction of token j). The prediction counts iff j < n and loss_mask[j] = 1.
In a packed row (`train.packing`, `eagle3.draft.packing`) t, n and the rope positions are the
sample's own: j must lie in t's sample, attention stays within it, positions restart at 0.

The teacher (`eagle3.draft.teacher`) is the frozen target lm_head applied to the stored final state,
restricted (and renormalised) to the draft vocab. When the target's argmax over its full vocab is not in the
draft vocab the draft cannot be right: such positions always count as misses in the metrics
(the simulated accept length stays honest) and, with `out_of_vocab="mask"`, are left out of
the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from eagle3.draft.attention import TTTAttention
from eagle3.draft.chains import ALPHA_FLOOR, Rollout, UnbrokenChains, dpace_losses
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.options import (
    LK_ETA,
    LOSS_KL,
    LOSS_LK,
    LOSS_NLA,
    LOSS_TV,
    LOSSES,
    OOV_MASK,
    OUT_OF_VOCAB_POLICIES,
    STEP_WEIGHTS,
    STEP_WEIGHTS_DPACE,
    TTT_CHAINS,
    TTT_CHAINS_ON_POLICY,
)
from eagle3.draft.teacher import Teacher


def add_state_noise(aux: torch.Tensor, captures: int, scale: float) -> torch.Tensor:
    """`aux` `[B, T, C*H]` plus Gaussian noise of std `scale` x each captured layer's per-token RMS.

    Per layer, because captured layers differ in scale by orders of magnitude (an early layer's
    residual is small, a late one's large): one std for the concatenation would drown the first.
    """
    if scale <= 0:
        return aux
    layers = aux.unflatten(-1, (captures, -1))  # [B, T, C, H]
    rms = layers.float().pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, C, 1]
    noisy = layers + (torch.randn(layers.shape, device=aux.device) * rms * scale).to(aux.dtype)
    return noisy.flatten(-2)


@dataclass
class TTTOutput:
    """Loss and per-step statistics of one batch.

    Attributes:
        loss: Weighted sum over steps of the mean loss (`train.loss`, KL by default) per loss token (what is optimised).
        step_loss: `[K]` mean loss per step (detached).
        correct: `[K]` counted predictions whose argmax equals the target's.
        chain_correct: `[K]` counted predictions whose argmax, and its chain's at every earlier
            counted step, equal the target's (`eagle3.draft.chains.UnbrokenChains`).
        counted: `[K]` predictions that count (loss-masked, inside the sample).
        loss_tokens: `[K]` predictions in the loss (counted, minus out-of-vocab ones under "mask").
    """

    loss: torch.Tensor
    step_loss: torch.Tensor
    correct: torch.Tensor
    counted: torch.Tensor
    loss_tokens: torch.Tensor
    chain_correct: torch.Tensor


#: Rows of the fused KL worked on at once: 64 x 32K float32 is 8 MiB, so a chunk's logits, teacher
#: row, softmax and gradient stay in cache across the passes over them instead of streaming a
#: `[N, Vd]` tensor through memory once per operation.
KL_CHUNK_ROWS = 64


class _SoftTargetLoss(torch.autograd.Function):
    """Per row i: w_i D(p_i, softmax(z_i)) over draft logits z `[N, Vd]`, its argmax, and alpha_i.

    D is KL(p || q) by default (`train.loss`, eagle3.draft.options.LOSSES); alpha_i = sum min(p_i, q_i)
    (computed only when `want_alpha`: nla and lk compute it anyway). The gradient of each row's
    value is known in forward. For KL it is w_i (s_i softmax(z_i) - p_i), with s_i = sum p_i (1 for
    the renormalised teacher); for the others, with g = dD/dq, it is w_i q_i (g_i - <q_i, g_i>).
    Forward writes it chunk by chunk in the logits' dtype (what backward would return anyway) and
    backward only scales each row by the gradient its value receives (1 for a plain sum, a D-PACE
    weight otherwise): no `[N, Vd]` float32 log-probs are kept, the teacher rows are gathered
    once, and each element is read in one cache-resident pass instead of ~10 passes through
    memory (the draft head at a 32K vocab made these elementwise passes cost more than its matmul
    on a CPU). With no gradient wanted (eval) the gradient is not formed. lk needs the step's mean
    alpha before any row's blend is known, so it makes one more pass over the rows first.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
                neg_entropy: torch.Tensor, weight: torch.Tensor, loss: str = LOSS_KL, want_alpha: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        want_grad = ctx.needs_input_grad[0]
        work_dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: softmax in fp32
        grad = torch.empty_like(logits) if want_grad else None
        pred = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        row_loss = torch.zeros(logits.shape[0], dtype=work_dtype, device=logits.device)
        alpha = torch.zeros(logits.shape[0], dtype=work_dtype, device=logits.device)
        want_alpha = want_alpha or loss in (LOSS_NLA, LOSS_LK)
        chunks = [slice(start, start + KL_CHUNK_ROWS) for start in range(0, logits.shape[0], KL_CHUNK_ROWS)]
        blend = 1.0  # lk: the KL share lambda of the step
        if loss == LOSS_LK:
            for part in chunks:
                alpha[part] = torch.minimum(probs[rows[part]], torch.softmax(logits[part].to(work_dtype), -1)).sum(-1)
            counted = weight > 0
            mean_alpha = float(alpha[counted].mean()) if bool(counted.any()) else 0.0
            blend = math.exp(-LK_ETA * mean_alpha)
        for part in chunks:
            z = logits[part].to(work_dtype, copy=True)  # [n, Vd]
            top, pred[part] = z.max(dim=-1)
            z.sub_(top.unsqueeze(-1))  # z - max
            p = probs[rows[part]]  # [n, Vd]
            w = weight[part]
            q = torch.exp(z)
            if loss == LOSS_KL:
                norm = q.sum(-1)  # sum exp(z - max)
                mass = p.sum(-1)
                cross = (p * z).sum(-1) - mass * norm.log()  # sum p log softmax(z)
                row_loss[part] = (neg_entropy[rows[part]] - cross) * w
                if want_alpha:
                    alpha[part] = torch.minimum(p, q / norm.unsqueeze(-1)).sum(-1)
                if grad is not None:
                    q.mul_((mass / norm).unsqueeze(-1)).sub_(p).mul_(w.unsqueeze(-1))
                    grad[part] = q
                continue
            total = q.sum(-1, keepdim=True)
            kl_cross = (p * z).sum(-1) - p.sum(-1) * total.squeeze(-1).log() if loss == LOSS_LK else None
            q.div_(total)  # softmax(z)  [n, Vd]
            if want_alpha and loss != LOSS_LK:
                alpha[part] = torch.minimum(p, q).sum(-1)
            extra = None  # lk: KL's logit gradient (before w), added to TV's
            if loss in (LOSS_TV, LOSS_LK):
                values = 0.5 * (q - p).abs().sum(-1)
                q_g = 0.5 * q * torch.sign(q - p)  # q * dD/dq
                if loss == LOSS_LK:
                    assert kl_cross is not None
                    values = blend * (neg_entropy[rows[part]] - kl_cross) + (1.0 - blend) * values
                    q_g.mul_(1.0 - blend)
                    extra = blend * (q * p.sum(-1, keepdim=True) - p)
            elif loss == LOSS_NLA:  # dD/dq = -1[q < p] / alpha
                acc = alpha[part].clamp_min(ALPHA_FLOOR)
                values = -acc.log()
                q_g = -q * (q < p) / acc.unsqueeze(-1)
            else:  # LOSS_JSD; dD/dq = 1/2 log(q / m)
                m = 0.5 * (p + q)
                q_g = 0.5 * (torch.xlogy(q, q) - torch.xlogy(q, m))
                values = 0.5 * (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1) + q_g.sum(-1)
            row_loss[part] = values * w
            if grad is not None:
                g = q_g - q * q_g.sum(-1, keepdim=True)
                if extra is not None:
                    g += extra
                grad[part] = g * w.unsqueeze(-1)
        ctx.mark_non_differentiable(pred, alpha)
        if grad is not None:
            ctx.save_for_backward(grad)
        return row_loss, pred, alpha

    @staticmethod
    def backward(ctx, grad_rows: torch.Tensor, grad_pred: torch.Tensor, grad_alpha: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_rows.to(grad.dtype).unsqueeze(-1), None, None, None, None, None, None


def _loss_terms(draft: Eagle3Draft, state: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
                neg_entropy: torch.Tensor, weight: torch.Tensor, loss: str, want_alpha: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row weighted loss, argmax and alpha of the counted rows: states `[N, H]`, teacher `rows` / weight `[N]`."""
    logits = draft.logits(state)  # [N, Vd]
    return _SoftTargetLoss.apply(logits, probs, rows, neg_entropy, weight, loss, want_alpha)


@dataclass
class _StepRows:
    """One TTT step's counted predictions, waiting for the draft head and the loss.

    The head is off the recurrence (step k+1 reads step k's state, not its logits), so the steps'
    rows can go through it together after the last step: one `[sum N_k, H] x [H, Vd]` product and
    one weight gradient instead of K of each plus K-1 accumulations of a `[Vd, H]` gradient.
    """

    step: int
    b_idx: torch.Tensor  # [N] the predictions that count
    t_idx: torch.Tensor
    target: torch.Tensor  # [N] the teacher's argmax as a draft id, -1 outside the draft vocab
    weight: torch.Tensor  # [N] bool: in the loss
    count: torch.Tensor  # () predictions that count
    state: torch.Tensor  # [N, H]
    teacher: Teacher
    rows: torch.Tensor  # [N] teacher row of each prediction
    keep: bool  # logits kept for backward (within the budget); False: recomputed (checkpoint)
    logit_bytes: float  # its logits' bytes (and its kept gradient's)
    terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # row loss, argmax, alpha


def _evaluate(group: list[_StepRows], draft: Eagle3Draft, loss: str, want_alpha: bool) -> None:
    """Head and loss over `group` (steps sharing a teacher), in one call; fills each step's `terms`."""
    teacher = group[0].teacher
    neg_entropy = teacher.neg_entropy
    assert neg_entropy is not None  # set by Teacher.__post_init__
    cat = (lambda parts: parts[0]) if len(group) == 1 else torch.cat
    args = (draft, cat([r.state for r in group]), teacher.probs, cat([r.rows for r in group]), neg_entropy,
            cat([r.weight for r in group]).float(), loss, want_alpha)
    if group[0].keep or not torch.is_grad_enabled():
        terms = _loss_terms(*args)
    else:
        terms = checkpoint(_loss_terms, *args, use_reentrant=False)
    sizes = [len(r.rows) for r in group]
    for r, row_loss, pred, alpha in zip(group, *(t.split(sizes) for t in terms), strict=True):
        r.terms = (row_loss, pred, alpha)


def _evaluate_pending(pending: list[_StepRows], draft: Eagle3Draft, loss: str, want_alpha: bool,
                      budget_bytes: float) -> None:
    """Steps whose logits are kept and that share a teacher go through the head together; others one by one.

    lk blends by its step's mean alpha, so its steps stay apart; a step past the logits budget
    recomputes its own logits in backward (as one checkpoint each, to bound memory as before). A
    group's logits exist beside the kept gradients while its loss runs, so groups are cut to what
    the budget leaves over (at least one step): the peak stays what one step at a time reached.
    """
    kept: list[_StepRows] = []
    for r in pending:
        if r.terms is None and r.keep and loss != LOSS_LK:
            kept.append(r)
        elif r.terms is None:
            _evaluate([r], draft, loss, want_alpha)
    held = sum(r.logit_bytes for r in kept) if torch.is_grad_enabled() else 0.0  # gradients kept for backward
    room = max(budget_bytes - held, max((r.logit_bytes for r in kept), default=0.0))
    group: list[_StepRows] = []
    group_bytes = 0.0
    for r in kept:
        if group and (r.teacher is not group[0].teacher or group_bytes + r.logit_bytes > room):
            _evaluate(group, draft, loss, want_alpha)
            group, group_bytes = [], 0.0
        group.append(r)
        group_bytes += r.logit_bytes
    if group:
        _evaluate(group, draft, loss, want_alpha)


def ttt_forward(draft: Eagle3Draft, aux: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                lengths: torch.Tensor, teacher: Teacher, *, steps: int, decay: float, out_of_vocab: str,
                block_size: int, logits_budget_bytes: float = float("inf"), loss: str = LOSS_KL,
                step_weights: str = STEP_WEIGHTS[0], dpace_smoothing: float = 0.0,
                ttt_chains: str = TTT_CHAINS[0], positions: torch.Tensor | None = None,
                segment_ends: torch.Tensor | None = None, rollout: Rollout | None = None) -> TTTOutput:
    """Unroll `steps` draft steps over a right-padded batch.

    The draft-vocab head runs only on the positions that count (loss-masked, inside the sample):
    prompts and padding cost the decoder layer, not the head that dominates a step at a 32K draft
    vocab. Each step's logits are kept for its backward while the steps' total stays within
    `logits_budget_bytes`; past it a step recomputes them in backward (activation checkpointing),
    which costs one more head product but bounds memory at any batch size. The kept steps go
    through the head together after the last step (`_StepRows`), in as few groups as the budget
    leaves room for beside the kept gradients, except under on_policy chains, where step k+1
    needs step k's drafted tokens first.

    Args:
        aux: `[B, T, C*H_t]` captured target states. input_ids / loss_mask: `[B, T]`.
        lengths: `[B]` real lengths (positions beyond are padding).
        teacher: From `teacher_targets` over the same batch (at least `teacher_positions`).
        ttt_chains: `train.ttt_chains`: all, on_policy (`eagle3.draft.chains.UnbrokenChains`) or rescored
            (as all without a `rollout`).
        positions / segment_ends: Packed rows (`eagle3.draft.packing.collate_packed`), `[B, T]`:
            each token's position in its sample and the row index where its sample ends. None:
            one sample per row, at positions 0, 1, ...
        rollout: `train.ttt_chains=rescored` (`eagle3.draft.rescoring.rescore`): steps after the first read
            the draft's own tokens and learn toward the target's score of them, on the started chains only.
    """
    if out_of_vocab not in OUT_OF_VOCAB_POLICIES:
        raise ValueError(f"train.out_of_vocab={out_of_vocab!r}; valid: {', '.join(OUT_OF_VOCAB_POLICIES)}")
    if loss not in LOSSES:
        raise ValueError(f"train.loss={loss!r}; valid: {', '.join(LOSSES)}")
    if step_weights not in STEP_WEIGHTS:
        raise ValueError(f"train.step_weights={step_weights!r}; valid: {', '.join(STEP_WEIGHTS)}")
    if ttt_chains not in TTT_CHAINS:
        raise ValueError(f"train.ttt_chains={ttt_chains!r}; valid: {', '.join(TTT_CHAINS)}")
    dpace = step_weights == STEP_WEIGHTS_DPACE
    bsz, seq = input_ids.shape
    device = input_ids.device
    pos = torch.arange(seq, device=device)
    mask = loss_mask.bool()
    hidden = draft.project(aux)  # [B, T, H]
    ends, starts, rope_pos = lengths.unsqueeze(1), None, pos  # where t's sample ends and starts; its position
    packed = positions is not None and segment_ends is not None
    if positions is not None and segment_ends is not None:
        ends, starts, rope_pos = segment_ends, pos - positions, positions  # [B, T] each
    attention = TTTAttention(draft.geometry.num_layers, block_size, starts)
    on_policy = UnbrokenChains(bsz, seq, device) if ttt_chains == TTT_CHAINS_ON_POLICY else None
    draft_ids = draft.draft_ids()  # [Vd] the target id of each draft id, once (on_policy compares ids)
    agreeing = UnbrokenChains(bsz, seq, device)
    kept_bytes = 0.0
    bytes_per_logit = 2 if torch.is_autocast_enabled(device.type) else 4

    pending: list[_StepRows] = []
    for k in range(steps):
        shift = 1 + k  # token read at t is t+shift; predicted token is j = t+shift+1
        span = seq - shift  # positions t with an input token
        if span <= 0:
            break
        on_chain = rollout if k > 0 else None  # reads the draft's own tokens, learns the target's score of them
        step_teacher = on_chain.teachers[k - 1] if on_chain is not None else teacher
        tokens = torch.zeros_like(input_ids)
        tokens[:, :span] = input_ids[:, shift:]
        if on_chain is not None:
            tokens = on_chain.tokens[k - 1]
        if packed:  # the next sample's tokens are not this one's: read 0 past the end, as a lone sample does
            tokens = tokens.masked_fill(pos + shift >= ends, 0)
        state = draft.step(hidden, tokens, rope_pos + k, attention.attends)  # [B, T, H]

        j = pos[:span] + shift + 1  # predicted token index per position t < span
        in_sample = j.unsqueeze(0) < ends[:, :span]  # [B, span]
        target_mask = torch.zeros_like(in_sample)
        target_mask[:, :span - 1] = mask[:, shift + 1:]
        count = in_sample & target_mask
        if on_chain is not None:
            count = count & on_chain.started[:, :span]
        b_idx, t_idx = count.nonzero(as_tuple=True)  # [N] the predictions that count
        target = step_teacher.argmax[b_idx, t_idx + shift]  # [N]
        weight = (target >= 0) if out_of_vocab == OOV_MASK else torch.ones_like(target, dtype=torch.bool)
        if on_policy is not None:
            weight = weight & on_policy.keep(b_idx, t_idx)
        step_bytes = len(b_idx) * draft.geometry.draft_vocab_size * bytes_per_logit
        keep = kept_bytes + step_bytes <= logits_budget_bytes  # (in eval: logits that exist at once)
        kept_bytes += step_bytes if keep else 0
        pending.append(_StepRows(k, b_idx, t_idx, target, weight, count.sum(), state[b_idx, t_idx], step_teacher,
                                 step_teacher.row_of[b_idx, t_idx + shift], keep, step_bytes))
        if on_policy is not None:  # the token drafted here is the one step k+1 reads: t + shift + 1
            _evaluate_pending(pending, draft, loss, dpace, logits_budget_bytes)
            pred = pending[-1].terms[1]  # type: ignore[index]
            on_policy.advance(b_idx, t_idx, draft_ids[pred] == input_ids[b_idx, t_idx + shift + 1])
        hidden = draft.carry(state)
    _evaluate_pending(pending, draft, loss, dpace, logits_budget_bytes)

    losses, step_loss, correct, counted, loss_tokens, chain_correct = [], [], [], [], [], []
    chains: list[tuple[torch.Tensor, ...]] = []  # dpace: per step, (b, t, row losses, alpha) of its rows
    for r in pending:
        assert r.terms is not None
        row_loss, pred, alpha = r.terms
        n_loss = r.weight.sum()
        loss_k = row_loss.sum() / n_loss.clamp(min=1)
        if dpace:
            chains.append((r.b_idx, r.t_idx, row_loss, alpha * r.weight))
        else:
            losses.append(loss_k * decay ** r.step)
        step_loss.append(loss_k.detach())
        hit = pred == r.target
        correct.append(hit.sum())
        agreeing.advance(r.b_idx, r.t_idx, hit)
        chain_correct.append(agreeing.keep(r.b_idx, r.t_idx).sum())
        counted.append(r.count)
        loss_tokens.append(n_loss)
    if dpace and chains:
        losses = dpace_losses(chains, bsz, seq, dpace_smoothing)
    return TTTOutput(loss=torch.stack(losses).sum(), step_loss=torch.stack(step_loss),
                     correct=torch.stack(correct), counted=torch.stack(counted),
                     loss_tokens=torch.stack(loss_tokens), chain_correct=torch.stack(chain_correct))
