"""The draft's math against naive references: TTT attention, teacher, loss, accept length."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from eagle3.draft.acceptance import chain_accept_length, simulated_accept_length
from eagle3.draft.attention import DraftKVCache, apply_rope, rope_cos_sin, ttt_attention
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.ttt import ttt_forward


def dense_ttt_attention(q, keys, values):
    """The L x (k+1)L masked softmax the efficient version must reproduce."""
    bsz, hq, seq, dim = q.shape
    groups = hq // keys[0].shape[1]
    k_all = torch.cat([k.repeat_interleave(groups, 1) for k in keys], dim=2)  # [B, Hq, (k+1)T, D]
    v_all = torch.cat([v.repeat_interleave(groups, 1) for v in values], dim=2)
    t = torch.arange(seq)
    allowed = [t[None, :] <= t[:, None]] + [t[None, :] == t[:, None]] * (len(keys) - 1)
    mask = torch.cat(allowed, dim=1)  # [T, (k+1)T]
    scores = q @ k_all.transpose(-1, -2) / math.sqrt(dim)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v_all


@pytest.mark.parametrize("steps,block,heads,kv_heads", [(1, 4, 2, 2), (3, 5, 4, 2), (5, 64, 4, 1), (2, 7, 3, 3)])
def test_ttt_attention_matches_dense_reference_values_and_grads(steps, block, heads, kv_heads):
    torch.manual_seed(steps * 10 + block)
    bsz, seq, dim = 2, 23, 8
    q = torch.randn(bsz, heads, seq, dim, requires_grad=True)
    keys = [torch.randn(bsz, kv_heads, seq, dim, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(bsz, kv_heads, seq, dim, requires_grad=True) for _ in range(steps)]
    fast = ttt_attention(q, keys, values, block_size=block)
    ref = dense_ttt_attention(q, keys, values)
    assert fast.shape == (bsz, heads, seq, dim)
    assert torch.allclose(fast, ref, atol=1e-5, rtol=0)
    weights = torch.randn_like(ref)
    grads_fast = torch.autograd.grad((fast * weights).sum(), [q, *keys, *values])
    grads_ref = torch.autograd.grad((ref * weights).sum(), [q, *keys, *values])
    for a, b in zip(grads_fast, grads_ref):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_kv_cache_decoding_equals_ttt_attention_chain():
    """Drafting with a cache (serving) sees what step k of TTT sees at the last position."""
    torch.manual_seed(0)
    bsz, heads, seq, dim, steps = 1, 2, 9, 8, 3
    keys = [torch.randn(bsz, heads, seq, dim) for _ in range(steps)]
    values = [torch.randn(bsz, heads, seq, dim) for _ in range(steps)]
    qs = [torch.randn(bsz, heads, seq, dim) for _ in range(steps)]
    cache = DraftKVCache()
    cache.attend(qs[0], keys[0], values[0])  # prefill: step 0 over every position
    last = seq - 1
    for k in range(1, steps):
        got = cache.attend(qs[k][:, :, last:], keys[k][:, :, last:], values[k][:, :, last:])
        want = ttt_attention(qs[k], keys[:k + 1], values[:k + 1], block_size=4)[:, :, last:]
        assert torch.allclose(got, want, atol=1e-5)
    cache.crop(seq)
    assert len(cache) == seq


def test_rope_rotates_pairs_by_position():
    cos, sin = rope_cos_sin(torch.tensor([0, 3]), head_dim=4, theta=10000.0)
    x = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]]])  # [1, 1, 2, 4]
    out = apply_rope(x, cos, sin)
    assert torch.allclose(out[0, 0, 0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(out[0, 0, 1], torch.tensor([math.cos(3.0), 0.0, math.sin(3.0), 0.0]), atol=1e-6)


# The train defaults of the schema, 3 steps.
TTT3 = dict(steps=3, decay=0.8, out_of_vocab="mask", block_size=256)


def tiny_geometry(**kw) -> DraftGeometry:
    base = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16,
                fc_in_features=24, vocab_size=12, draft_vocab_size=5, capture_layers=(1, 2, 3), target_num_layers=5)
    base.update(kw)
    return DraftGeometry(**base)


def tiny_draft(seed: int = 0, num_layers: int = 1) -> tuple[Eagle3Draft, torch.Tensor]:
    torch.manual_seed(seed)
    g = tiny_geometry(num_layers=num_layers)
    draft = Eagle3Draft(g)
    selected = torch.tensor([0, 2, 3, 7, 11])  # target ids in the draft vocab
    d2t = selected - torch.arange(5)
    t2d = torch.zeros(12, dtype=torch.bool)
    t2d[selected] = True
    head = torch.randn(12, 8)
    draft.init_from_target(torch.randn(12, 8), head, d2t, t2d)
    return draft, head


def test_teacher_restricts_to_draft_vocab_and_flags_out_of_vocab_argmax():
    draft, _ = tiny_draft()
    head = torch.eye(12, 8)  # logits = first 8 coordinates of the state; ids 8.. get 0
    final = torch.zeros(1, 2, 8)
    final[0, 0, 3] = 5.0  # argmax target id 3 -> draft id 2
    final[0, 1, 5] = 5.0  # argmax target id 5 -> not in the draft vocab
    teacher = teacher_targets(final, head, draft.draft_ids(), chunk_tokens=1)
    assert teacher.argmax.tolist() == [[2, -1]]
    want0 = torch.softmax(torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0]), -1)  # logits of ids 0, 2, 3, 7, 11
    assert torch.allclose(teacher.at(0, 0), want0, atol=1e-6)
    assert torch.allclose(teacher.at(0, 1), torch.full((5,), 0.2), atol=1e-6)


def test_loss_equals_hand_computed_kl_for_a_uniform_draft():
    """With lm_head = 0 the draft predicts uniform q = 1/5, so KL(p||q) = sum p log p + log 5."""
    draft, _ = tiny_draft()
    with torch.no_grad():
        draft.lm_head.weight.zero_()
    p = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]] * 6).unsqueeze(0)  # [1, 6, 5]
    teacher_argmax = torch.zeros(1, 6, dtype=torch.long)
    from eagle3.draft.teacher import Teacher

    teacher = Teacher.dense(p, teacher_argmax)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    out = ttt_forward(draft, torch.randn(1, 6, 24), ids, mask, torch.tensor([6]), teacher, steps=2, decay=0.5,
                      out_of_vocab="mask", block_size=256)
    kl = sum(x * math.log(x) for x in [0.5, 0.25, 0.125, 0.0625, 0.0625]) + math.log(5)  # 0.2435...
    assert out.step_loss.tolist() == pytest.approx([kl, kl], abs=1e-6)
    assert out.loss.item() == pytest.approx(kl + 0.5 * kl, abs=1e-6)
    # Step 0 predicts tokens 2..5 (4 counted), step 1 tokens 3..5 (3 counted).
    assert out.counted.tolist() == [4, 3]
    # Uniform logits: argmax is draft id 0, the teacher's argmax everywhere.
    assert out.correct.tolist() == [4, 3]


def dense_attends(num_layers: int) -> list:
    """Per draft layer, the dense reference of TTT attention over that layer's own keys of the steps so far."""
    keys, values = [[] for _ in range(num_layers)], [[] for _ in range(num_layers)]  # per layer, per step

    def attend(layer, q, k, v):
        keys[layer].append(k)
        values[layer].append(v)
        return dense_ttt_attention(q, keys[layer], values[layer])

    return [partial(attend, layer) for layer in range(num_layers)]


def naive_ttt_loss(draft, aux, ids, mask, teacher, steps, decay, on_policy=False, live=None, agreeing=None):
    """Token-by-token reference: explicit per-position states and a dense attention per step.

    on_policy: a chain start t trains at step k only if at every earlier counted step its argmax,
    as a target id, was the data's token (the token the next step reads); `live` collects, per step,
    how many chains trained; `agreeing`, how many counted chains agreed with the target's argmax at
    this step and every earlier counted one.
    """
    seq = ids.shape[1]
    hidden = draft.project(aux)
    attends = dense_attends(draft.geometry.num_layers)
    total = 0.0
    alive, agreed = [True] * seq, [True] * seq
    for k in range(steps):
        tokens = torch.zeros_like(ids)
        tokens[:, :seq - 1 - k] = ids[:, 1 + k:]
        state = draft.step(hidden, tokens, torch.arange(seq) + k, attends)
        logq = torch.log_softmax(draft.logits(state), -1)
        terms, n = 0.0, 0
        for t in range(seq):
            j = t + k + 2
            if j < seq and mask[0, j] and teacher.argmax[0, t + 1 + k] >= 0 and (alive[t] or not on_policy):
                p = teacher.at(0, t + 1 + k)
                terms = terms + (torch.xlogy(p, p) - p * logq[0, t]).sum()
                n += 1
        unbroken = 0
        for t in range(seq):
            j = t + k + 2
            if j < seq and mask[0, j]:
                alive[t] = alive[t] and int(draft.draft_ids()[logq[0, t].argmax()]) == int(ids[0, j])
                agreed[t] = agreed[t] and int(logq[0, t].argmax()) == int(teacher.argmax[0, t + 1 + k])
                unbroken += agreed[t]
        if live is not None:
            live.append(n)
        if agreeing is not None:
            agreeing.append(unbroken)
        total = total + decay ** k * terms / max(n, 1)
        hidden = state
    return total


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_ttt_forward_matches_token_by_token_reference(num_layers):
    """Each layer attends over its own keys of steps 0..k (a deeper draft: TTT through every layer)."""
    draft, head = tiny_draft(3, num_layers)
    torch.manual_seed(1)
    seq = 11
    ids = torch.randint(0, 12, (1, seq))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]])
    aux, final = torch.randn(1, seq, 24), torch.randn(1, seq, 8)
    teacher = teacher_targets(final, head, draft.draft_ids())
    fast = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, steps=4, decay=0.8,
                       out_of_vocab="mask", block_size=3)
    ref = naive_ttt_loss(draft, aux, ids, mask, teacher, steps=4, decay=0.8)
    assert fast.loss.item() == pytest.approx(float(ref.detach()), abs=1e-5)
    weights = [draft.fc.weight, *(layer.self_attn.q_proj.weight for layer in draft.layers.values())]
    g_fast = torch.autograd.grad(fast.loss, weights)
    g_ref = torch.autograd.grad(naive_ttt_loss(draft, aux, ids, mask, teacher, 4, 0.8), weights)
    for fast_grad, ref_grad in zip(g_fast, g_ref, strict=True):
        assert torch.allclose(fast_grad, ref_grad, atol=1e-5)
        assert fast_grad.abs().max() > 0  # every layer trains


def test_on_policy_chains_train_only_where_the_draft_drafted_the_datas_tokens():
    """train.ttt_chains=on_policy: step k trains chain t only if steps < k drafted the tokens the data
    continues with (what a served draft would read), against the token-by-token reference."""
    draft, head = tiny_draft(3)
    torch.manual_seed(4)
    seq = 16
    in_vocab = torch.tensor([0, 2, 3, 7, 11])
    ids = in_vocab[torch.randint(0, 5, (1, seq))]
    mask = torch.tensor([[0, 0, 0] + [1] * 13])
    aux, final = torch.randn(1, seq, 24), torch.randn(1, seq, 8)
    with torch.no_grad():  # every third chain's next token is the one step 0 drafts (causal: t reads ids <= t+1)
        hidden = draft.project(aux)
        for t in range(2, seq - 2, 3):
            tokens = torch.zeros_like(ids)
            tokens[:, :seq - 1] = ids[:, 1:]
            state = draft.step(hidden, tokens, torch.arange(seq), dense_attends(1))
            ids[0, t + 2] = draft.draft_ids()[draft.logits(state)[0, t].argmax()]
    teacher = teacher_targets(final, head, draft.draft_ids())
    kw = dict(steps=4, decay=0.8, out_of_vocab="mask", block_size=3)
    fast = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, **kw, ttt_chains="on_policy")
    live: list[int] = []
    agreeing: list[int] = []
    ref = naive_ttt_loss(draft, aux, ids, mask, teacher, 4, 0.8, on_policy=True, live=live, agreeing=agreeing)
    assert fast.loss.item() == pytest.approx(float(ref.detach()), abs=1e-5)
    assert fast.loss_tokens.tolist() == live
    # the metrics count whole chains that agree with the target's argmax, whatever the training mode
    assert fast.chain_correct.tolist() == agreeing and fast.chain_correct[0] == fast.correct[0]
    assert all(c <= a for c, a in zip(fast.chain_correct.tolist(), fast.correct.tolist(), strict=True))
    assert live[0] == fast.counted[0] - (teacher.argmax[0, 1:seq - 1][mask[0, 2:].bool()] < 0).sum()
    assert 0 < live[1] < live[0]  # some chains left the data's path after step 0, some did not
    every = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, **kw)
    assert every.counted.tolist() == fast.counted.tolist() and every.correct.tolist() == fast.correct.tolist()
    assert every.chain_correct.tolist() == agreeing
    assert every.loss.item() != pytest.approx(fast.loss.item())
    (g_fast,) = torch.autograd.grad(fast.loss, draft.fc.weight)
    (g_ref,) = torch.autograd.grad(naive_ttt_loss(draft, aux, ids, mask, teacher, 4, 0.8, on_policy=True),
                                   draft.fc.weight)
    assert torch.allclose(g_fast, g_ref, atol=1e-5)


def test_chain_counts_follow_each_chain_against_a_reference():
    """chain_correct[k]: the counted chains whose argmax agreed with the target's at step k and every
    earlier counted step. The teacher's argmax is set to the draft's own step-0 guesses, so step 0
    agrees everywhere and the later steps in some chains only."""
    draft, head = tiny_draft(5)
    torch.manual_seed(6)
    seq = 14
    ids = torch.randint(0, 12, (1, seq))
    mask = torch.tensor([[0, 0] + [1] * 12])
    aux, final = torch.randn(1, seq, 24), torch.randn(1, seq, 8)
    teacher = teacher_targets(final, head, draft.draft_ids())
    with torch.no_grad():
        tokens = torch.zeros_like(ids)
        tokens[:, :seq - 1] = ids[:, 1:]
        state = draft.step(draft.project(aux), tokens, torch.arange(seq), dense_attends(1))
        teacher.argmax[0, 1:] = draft.logits(state)[0, :seq - 1].argmax(-1)  # position t+1 <- step 0's guess at t
    out = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, steps=4, decay=0.8,
                      out_of_vocab="mask", block_size=4)
    agreeing: list[int] = []
    naive_ttt_loss(draft, aux, ids, mask, teacher, 4, 0.8, agreeing=agreeing)
    assert out.chain_correct.tolist() == agreeing
    assert out.chain_correct[0] == out.correct[0] == out.counted[0]
    assert 0 < out.chain_correct[1] < out.correct[1] or 0 < out.chain_correct[2] < out.correct[2]


def test_padding_does_not_change_a_samples_loss():
    draft, head = tiny_draft(5)
    torch.manual_seed(2)
    ids = torch.randint(0, 12, (1, 7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    aux, final = torch.randn(1, 7, 24), torch.randn(1, 7, 8)
    alone = ttt_forward(draft, aux, ids, mask, torch.tensor([7]),
                        teacher_targets(final, head, draft.draft_ids()), **TTT3)
    pad = lambda x: torch.cat([x, torch.zeros(1, 4, *x.shape[2:], dtype=x.dtype)], dim=1)  # noqa: E731
    padded = ttt_forward(draft, pad(aux), pad(ids), pad(mask), torch.tensor([7]),
                         teacher_targets(pad(final), head, draft.draft_ids()), **TTT3)
    assert padded.loss.item() == pytest.approx(alone.loss.item(), abs=1e-6)
    assert padded.counted.tolist() == alone.counted.tolist()


def test_simulated_accept_length_is_one_plus_sum_of_running_products():
    assert simulated_accept_length([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert simulated_accept_length([1.0, 0.0, 1.0]) == pytest.approx(2.0)
    # chain by chain: the joint rates are summed as they are, not multiplied
    assert chain_accept_length([0.5, 0.3, 0.1]) == pytest.approx(1.9)
    assert chain_accept_length(torch.tensor([0.5, 0.25])) == pytest.approx(1.75)
    assert simulated_accept_length(torch.tensor([])) == 1.0


def _padded_batch(seed: int = 7):
    """Two samples of different lengths, right-padded, with prompt tokens out of the loss."""
    torch.manual_seed(seed)
    seq = 13
    ids = torch.randint(0, 12, (2, seq))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
                         [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]])
    lengths = torch.tensor([seq, 9])
    return torch.randn(2, seq, 24), ids, mask, lengths, torch.randn(2, seq, 8)


def _loss_and_grads(draft, batch, teacher, **kw):
    aux, ids, mask, lengths, _ = batch
    out = ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=4, decay=0.8, out_of_vocab="mask",
                      block_size=4, **kw)
    grads = torch.autograd.grad(out.loss, [p for p in draft.parameters() if p.requires_grad])
    return out, grads


def test_teacher_rows_at_the_read_positions_only_change_nothing():
    """A teacher computed only where a loss reads it gives the dense teacher's loss, metrics and gradients."""
    from eagle3.draft.teacher import teacher_positions

    draft, head = tiny_draft(11)
    batch = _padded_batch()
    _, _, mask, lengths, final = batch
    needed = teacher_positions(mask, lengths)
    sparse = teacher_targets(final, head, draft.draft_ids(), needed=needed)
    assert sparse.probs.shape[0] == int(needed.sum()) < final.shape[0] * final.shape[1]
    dense_out, dense_grads = _loss_and_grads(draft, batch, teacher_targets(final, head, draft.draft_ids()))
    sparse_out, sparse_grads = _loss_and_grads(draft, batch, sparse)
    assert sparse_out.loss.item() == pytest.approx(dense_out.loss.item(), abs=1e-6)
    assert sparse_out.correct.tolist() == dense_out.correct.tolist()
    assert sparse_out.counted.tolist() == dense_out.counted.tolist()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(sparse_grads, dense_grads))


def test_recomputing_logits_past_the_memory_budget_gives_the_same_gradients():
    draft, head = tiny_draft(12)
    batch = _padded_batch(8)
    teacher = teacher_targets(batch[4], head, draft.draft_ids())
    kept_out, kept = _loss_and_grads(draft, batch, teacher)
    recomputed_out, recomputed = _loss_and_grads(draft, batch, teacher, logits_budget_bytes=0)
    assert recomputed_out.loss.item() == pytest.approx(kept_out.loss.item(), abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(recomputed, kept))


@pytest.mark.parametrize("loss, step_weights", [("kl", "decay"), ("kl", "dpace"), ("tv", "decay"),
                                                 ("jsd", "decay"), ("nla", "dpace"), ("lk", "decay")])
def test_the_steps_head_together_equals_one_head_product_per_step(loss, step_weights, monkeypatch):
    """Within the logits budget the steps' rows go through the draft head in one product: the loss, every
    metric and every gradient equal those of one head product per step (a zero budget, checkpointed
    step by step). lk keeps one per step: its blend reads the step's own mean alpha."""
    import eagle3.draft.ttt as ttt_module

    draft, head = tiny_draft(13)
    batch = _padded_batch(9)
    teacher = teacher_targets(batch[4], head, draft.draft_ids())
    calls: list[int] = []
    real = ttt_module._loss_terms

    def counting(d, state, *rest):
        calls.append(state.shape[0])
        return real(d, state, *rest)

    monkeypatch.setattr(ttt_module, "_loss_terms", counting)
    kw = dict(loss=loss, step_weights=step_weights)
    together_out, together = _loss_and_grads(draft, batch, teacher, **kw)
    together_calls = list(calls)
    calls.clear()
    apart_out, apart = _loss_and_grads(draft, batch, teacher, logits_budget_bytes=0, **kw)
    assert together_calls == ([sum(calls[:4])] if loss != "lk" else calls[:4])  # backward's recompute after
    assert together_out.loss.item() == pytest.approx(apart_out.loss.item(), rel=1e-6)
    for field in ("step_loss", "correct", "counted", "loss_tokens", "chain_correct"):
        assert getattr(together_out, field).tolist() == pytest.approx(getattr(apart_out, field).tolist(), rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(together, apart, strict=True))
    assert max(float(g.abs().max()) for g in together) > 0
    if loss == "lk":
        return
    # a budget that holds every step's kept gradient but not all their logits beside it: the steps go
    # through the head in a few groups (the peak stays what one step at a time reached), same results
    calls.clear()
    kept_bytes = sum(apart_out.counted.tolist()) * draft.geometry.draft_vocab_size * 4  # float32 logits
    grouped_out, grouped = _loss_and_grads(draft, batch, teacher, logits_budget_bytes=1.5 * kept_bytes, **kw)
    assert 1 < len(calls) < 4 and sum(calls) == sum(apart_out.counted.tolist())
    assert grouped_out.loss.item() == pytest.approx(apart_out.loss.item(), rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grouped, apart, strict=True))


@pytest.mark.parametrize("in_vocab_mass", [1.0, 0.7])
def test_closed_form_kl_gradient_matches_autograd_through_log_softmax(in_vocab_mass, monkeypatch):
    """The fused KL's value and logit gradient against autograd of the textbook formula, for a
    renormalised teacher (rows sum to 1) and a full-vocab one (rows sum to the in-vocab mass)."""
    from eagle3.draft.ttt import _SoftTargetLoss

    torch.manual_seed(3)
    monkeypatch.setattr("eagle3.draft.ttt.KL_CHUNK_ROWS", 4)  # rows in two chunks, the second short
    logits = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(4, 9, dtype=torch.float64), -1) * in_vocab_mass
    rows = torch.tensor([0, 2, 3, 1, 2, 0])
    weight = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    neg_entropy = torch.xlogy(probs, probs).sum(-1)
    fused, pred, _ = _SoftTargetLoss.apply(logits, probs, rows, neg_entropy, weight)
    fused = fused.sum()
    assert pred.tolist() == logits.argmax(-1).tolist()
    (g_fused,) = torch.autograd.grad(fused, logits)
    p = probs[rows]
    ref = ((neg_entropy[rows] - (p * torch.log_softmax(logits, -1)).sum(-1)) * weight).sum()
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert fused.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(g_fused, g_ref, atol=1e-12)
    assert torch.autograd.gradcheck(lambda z: _SoftTargetLoss.apply(z, probs, rows, neg_entropy, weight)[0],
                                    (logits,))


def _naive_loss(kind: str, p: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per-row distance between teacher rows p and softmax(logits), written out as in a textbook."""
    q = torch.softmax(logits, -1)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # sum a log(a / b), 0 log 0 = 0
        return (torch.xlogy(a, a) - torch.xlogy(a, b)).sum(-1)

    alpha = torch.minimum(p, q).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    if kind == "tv":
        return tv
    if kind == "nla":
        return -alpha.log()
    if kind == "lk":  # one blend per call, from the counted rows' mean acceptance, not differentiated
        blend = math.exp(-3.0 * float(alpha[weight > 0].mean()))
        return blend * kl(p, q) + (1 - blend) * tv
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


@pytest.mark.parametrize("kind", ["tv", "jsd", "nla", "lk"])
@pytest.mark.parametrize("in_vocab_mass", [1.0, 0.7])
def test_tv_jsd_nla_and_lk_losses_match_their_textbook_formulas(kind, in_vocab_mass, monkeypatch):
    """train.loss=tv|jsd|nla|lk: the fused per-row values, their closed-form logit gradient and the
    acceptance alpha = sum min(p, q) against autograd of the plain formulas, chunked, with a
    zero-weight row and a teacher row holding exact zeros."""
    from eagle3.draft.ttt import _SoftTargetLoss

    torch.manual_seed(4)
    monkeypatch.setattr("eagle3.draft.ttt.KL_CHUNK_ROWS", 4)
    logits = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(4, 9, dtype=torch.float64), -1) * in_vocab_mass
    probs[1, :3] = 0.0  # a teacher with exact zeros (xlogy's 0 log 0)
    rows = torch.tensor([0, 2, 3, 1, 2, 1])
    weight = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    neg_entropy = torch.xlogy(probs, probs).sum(-1)
    fused, pred, alpha = _SoftTargetLoss.apply(logits, probs, rows, neg_entropy, weight, kind, True)
    assert pred.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(alpha, torch.minimum(probs[rows], torch.softmax(logits, -1)).sum(-1), atol=1e-12)
    row_grads = torch.rand(6, dtype=torch.float64)  # a weighted sum of rows, as D-PACE makes it
    (g_fused,) = torch.autograd.grad((fused * row_grads).sum(), logits)
    ref = _naive_loss(kind, probs[rows], logits, weight) * weight
    (g_ref,) = torch.autograd.grad((ref * row_grads).sum(), logits)
    assert torch.allclose(fused, ref, atol=1e-12)
    assert torch.allclose(g_fused, g_ref, atol=1e-10)
    assert fused.sum().item() > 0


def test_every_loss_trains_the_draft_toward_the_teacher():
    """A few optimizer steps under each train.loss (and D-PACE's step weights) lower that loss on the same batch."""
    cases = [(kind, "decay") for kind in ("kl", "tv", "jsd", "nla", "lk")] + [("kl", "dpace")]
    for kind, step_weights in cases:
        draft, head = tiny_draft(14)
        batch = _padded_batch(10)
        teacher = teacher_targets(batch[4], head, draft.draft_ids())
        opt = torch.optim.Adam(draft.parameters(), lr=3e-3)
        first = None
        for _ in range(8):
            out = ttt_forward(draft, *batch[:4], teacher, steps=3, decay=0.8, out_of_vocab="mask", block_size=4,
                              loss=kind, step_weights=step_weights)
            first = out.loss.item() if first is None else first
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        assert out.loss.item() < first, (kind, step_weights)
    with pytest.raises(ValueError, match="train.loss='mse'; valid: kl, tv, jsd, nla, lk"):
        ttt_forward(draft, *batch[:4], teacher, steps=1, decay=0.8, out_of_vocab="mask", block_size=4, loss="mse")
    with pytest.raises(ValueError, match="train.step_weights='linear'; valid: decay, dpace"):
        ttt_forward(draft, *batch[:4], teacher, steps=1, decay=0.8, out_of_vocab="mask", block_size=4,
                    step_weights="linear")


def test_dpace_weights_are_the_derivative_of_the_expected_accepted_length():
    """D-PACE: the weight of step k is d E[L] / d log a_k with E[L] = sum_m prod_{j<=m} a_j, per chain."""
    from eagle3.draft.chains import dpace_weights

    alpha = torch.tensor([[0.9, 0.5], [0.8, 0.0], [0.5, 0.7]], dtype=torch.float64).view(3, 1, 2)  # [K, B, T]
    every = torch.ones_like(alpha, dtype=torch.bool)
    log_a = alpha.log().requires_grad_(True)
    expected = torch.cumprod(log_a.exp(), 0).sum()
    (by_autograd,) = torch.autograd.grad(expected, log_a)
    weights = dpace_weights(alpha, every)
    assert torch.allclose(weights[:, :, 0], by_autograd[:, :, 0])
    # unsmoothed, chain 1 breaks at step 1 (alpha 0): its later steps weigh nothing, its first only itself
    assert weights[:, 0, 1].tolist() == pytest.approx([0.5, 0.0, 0.0])
    assert weights[:, 0, 0].tolist() == pytest.approx([0.9 + 0.72 + 0.36, 0.72 + 0.36, 0.36])
    # smoothed (s = 0.5: a -> 0.5 a + 0.5), the missed step still passes half on
    smooth = dpace_weights(alpha, every, 0.5)[:, 0, 1]
    assert smooth.tolist() == pytest.approx([0.75 + 0.375 + 0.31875, 0.375 + 0.31875, 0.31875])
    # a step that does not count passes the product on and adds no term of its own
    gap = every.clone()
    gap[1, 0, 0] = False
    assert dpace_weights(alpha, gap)[:, 0, 0].tolist() == pytest.approx([0.9 + 0.45, 0.0, 0.45])


def test_dpace_loss_matches_a_per_chain_reference():
    """ttt_forward with step_weights=dpace: the loss and gradients equal a hand-built sum over the
    counted predictions of (detached, smoothed chain weight) x KL, normalised by step 0's weights."""
    draft, head = tiny_draft(15)
    batch = _padded_batch(11)
    teacher = teacher_targets(batch[4], head, draft.draft_ids())
    kwargs = dict(steps=3, decay=0.8, out_of_vocab="mask", block_size=4)
    out = ttt_forward(draft, *batch[:4], teacher, **kwargs, step_weights="dpace", dpace_smoothing=0.3)
    (g_fast,) = torch.autograd.grad(out.loss, draft.fc.weight)

    # the reference: the same unrolled steps, the per-row KL and alpha written out
    plain = ttt_forward(draft, *batch[:4], teacher, **kwargs)
    assert out.step_loss.tolist() == pytest.approx(plain.step_loss.tolist())  # the weights change only the total
    captured = []
    import eagle3.draft.ttt as ttt_module

    real = ttt_module._loss_terms

    def spy(d, state, probs, rows, neg_entropy, weight, loss, want_alpha):
        logits = d.logits(state)
        q = torch.softmax(logits.double(), -1)
        p = probs[rows].double()
        kl = (torch.xlogy(p, p) - p * torch.log_softmax(logits.double(), -1)).sum(-1) * weight
        captured.append((kl, (torch.minimum(p, q).sum(-1) * weight).detach(), rows.clone()))
        return real(d, state, probs, rows, neg_entropy, weight, loss, want_alpha)

    ttt_module._loss_terms = spy
    try:
        again = ttt_forward(draft, *batch[:4], teacher, **kwargs, step_weights="dpace", dpace_smoothing=0.3)
    finally:
        ttt_module._loss_terms = real
    assert again.loss.item() == pytest.approx(out.loss.item())
    sizes = again.counted.tolist()  # the steps' rows go through the head together: split them per step
    captured = [tuple(zip(*(t.split(sizes) for t in parts), strict=True)) for parts in captured]
    captured = [step for parts in captured for step in parts]
    assert [len(c[2]) for c in captured] == sizes
    # step k's row reads the teacher at p = t + 1 + k: its chain start (b, t) follows from the teacher row
    where = {int(r): (b, pos) for (b, pos), r in zip(torch.nonzero(teacher.row_of >= 0).tolist(),
                                                     teacher.row_of[teacher.row_of >= 0].tolist(), strict=True)}
    alpha_at = [{(where[int(r)][0], where[int(r)][1] - 1 - k): float(a) for a, r in zip(c[1], c[2], strict=True)}
                for k, c in enumerate(captured)]
    weights = []
    for k, (_, _, rows) in enumerate(captured):
        w = torch.zeros(len(rows), dtype=torch.float64)
        for i, r in enumerate(rows.tolist()):
            b, t = where[r][0], where[r][1] - 1 - k
            reach, total = 1.0, 0.0
            for m in range(3):
                if (b, t) not in alpha_at[m]:
                    continue  # a step that does not count: the product passes on, no term
                reach *= 0.7 * alpha_at[m][(b, t)] + 0.3
                total += reach if m >= k else 0.0
            w[i] = total
        weights.append(w)
    assert any(len(a) != len(alpha_at[0]) for a in alpha_at)  # chains of different lengths
    n0 = int((captured[0][1] > 0).sum())
    scale = n0 / float(weights[0].sum())
    ref = sum((kl * w * scale).sum() / n0 for (kl, _, _), w in zip(captured, weights, strict=True))
    assert out.loss.item() == pytest.approx(float(ref), rel=1e-5)
    (g_ref,) = torch.autograd.grad(ref, draft.fc.weight)
    assert torch.allclose(g_fast, g_ref.to(g_fast.dtype), atol=1e-6)
    assert g_fast.abs().max() > 0


def test_state_noise_scales_with_each_captured_layer():
    """train.state_noise: per captured layer, noise std = scale x that layer's per-token RMS, so a
    small early layer is not drowned by a late layer's scale; 0 leaves the states untouched."""
    from eagle3.draft.ttt import add_state_noise

    torch.manual_seed(5)
    small, large = torch.randn(4, 500, 64) * 0.01, torch.randn(4, 500, 64) * 100.0
    aux = torch.cat([small, large], dim=-1)  # [B, T, C*H] with C = 2
    assert add_state_noise(aux, 2, 0.0) is aux
    noise = (add_state_noise(aux, 2, 0.1) - aux).unflatten(-1, (2, -1))
    assert noise[..., 0, :].std().item() == pytest.approx(0.001, rel=0.05)
    assert noise[..., 1, :].std().item() == pytest.approx(10.0, rel=0.05)


def test_bf16_autocast_step_stays_close_to_float32():
    """CPU bf16-mixed (train.precision=auto on CPUs with native bf16) changes the loss by rounding only."""
    draft, head = tiny_draft(13)
    batch = _padded_batch(9)
    teacher = teacher_targets(batch[4], head, draft.draft_ids())
    full, _ = _loss_and_grads(draft, batch, teacher)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, _ = _loss_and_grads(draft, batch, teacher)
    assert mixed.loss.dtype == torch.float32
    assert mixed.loss.item() == pytest.approx(full.loss.item(), rel=0.03)
