"""Packed rows (`train.packing`): planning, collation, the sampler, and TTT kept within each sample.

The references are naive: a dense masked attention over the whole row, and each sample run alone
in a batch of its own (no padding), token by token.
"""

from __future__ import annotations

import math

import pytest
import torch

from eagle3.draft.attention import ttt_attention
from eagle3.draft.batching import TokenBudgetBatchSampler, collate_padded, plan_token_batches
from eagle3.draft.packing import collate_packed, pack_rows, row_layout
from eagle3.draft.teacher import teacher_positions, teacher_targets
from eagle3.draft.ttt import ttt_forward
from tests.unit.draft.test_ttt import dense_attends, tiny_draft

LENGTHS = [300, 20, 700, 512, 1100, 90, 256, 256, 64, 5, 480, 33, 1024, 7, 150, 2000, 40, 610]


def test_pack_rows_places_every_sample_once_within_the_row_budget():
    rows = pack_rows(LENGTHS, 1024)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(len(LENGTHS)))
    for row in rows:
        total = sum(LENGTHS[i] for i in row)
        assert total <= 1024 or len(row) == 1, (row, total)  # a longer sample is a row of its own, never split
    assert [LENGTHS[i] for row in rows if len(row) == 1 for i in row if LENGTHS[i] > 1024] == [2000, 1100]
    assert pack_rows(LENGTHS, 1024) == rows  # deterministic
    # Fewer steps than padded batches of the same budget, and as few as the tokens allow here.
    assert len(rows) < len(plan_token_batches(LENGTHS, 1024))
    small = [n for n in LENGTHS if n <= 1024]
    assert len(rows) - 2 == math.ceil(sum(small) / 1024)
    assert pack_rows([], 8) == [] and pack_rows([9], 8) == [[0]]


def test_row_layout_restarts_positions_and_marks_each_samples_end():
    layout = row_layout([3, 1, 2])
    assert layout["positions"].tolist() == [0, 1, 2, 0, 0, 1]
    assert layout["segment_ids"].tolist() == [0, 0, 0, 1, 2, 2]
    assert layout["segment_ends"].tolist() == [3, 3, 3, 4, 6, 6]


def _sample(n: int, seed: int, compact: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, dtype=torch.long)
    mask[:n // 3] = 0  # a prompt out of the loss
    teacher = ({"teacher_ids": torch.randint(0, 12, (n, 3), generator=gen), "teacher_logprob": -torch.rand(n, 3)}
               if compact else {"final": torch.randn(n, 8, generator=gen)})
    return {"input_ids": torch.randint(0, 12, (n,), generator=gen), "loss_mask": mask,
            "aux": torch.randn(n, 24, generator=gen), **teacher}


@pytest.mark.parametrize("compact", [False, True])
def test_collate_packed_concatenates_without_padding_and_keeps_the_padded_keys(compact):
    samples = [_sample(n, seed, compact) for seed, n in enumerate([5, 3, 4])]
    batch = collate_packed(samples)
    padded = collate_padded(samples)
    assert set(padded) < set(batch)
    assert set(batch) - set(padded) == {"positions", "segment_ids", "segment_ends"}
    assert batch["input_ids"].shape == batch["loss_mask"].shape == batch["positions"].shape == (1, 12)
    assert batch["aux"].shape == (1, 12, 24)
    assert batch["lengths"].tolist() == [12]
    assert torch.equal(batch["input_ids"][0], torch.cat([s["input_ids"] for s in samples]))
    assert batch["positions"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    assert batch["segment_ends"][0].tolist() == [5] * 5 + [8] * 3 + [12] * 4
    for key in ("teacher_ids", "teacher_logprob") if compact else ("final",):
        assert batch[key].shape[:2] == (1, 12)


def test_packed_sampler_is_seeded_sharded_and_resumable():
    sampler = TokenBudgetBatchSampler(LENGTHS, 1024, seed=3, packing=True)
    rows = pack_rows(LENGTHS, 1024)
    assert sorted(map(tuple, sampler.epoch_order(0))) == sorted(map(tuple, rows))
    assert sampler.epoch_order(0) == TokenBudgetBatchSampler(LENGTHS, 1024, seed=3, packing=True).epoch_order(0)
    assert sampler.epoch_order(0) != sampler.epoch_order(1)  # a new order per epoch, same rows
    full = list(sampler)
    sampler.skip = 2  # resumed after 2 rows of epoch 0
    assert list(sampler) == full[2:]
    assert list(sampler) == full  # the skip applies once
    shards = [TokenBudgetBatchSampler(LENGTHS, 1024, seed=3, rank=r, world_size=2, packing=True) for r in (0, 1)]
    orders = [s.epoch_order(1) for s in shards]
    assert len(orders[0]) == len(orders[1]) == len(shards[0]) == len(rows) // 2
    mine = [{tuple(row) for row in order} for order in orders]
    assert not mine[0] & mine[1]
    assert mine[0] | mine[1] <= {tuple(row) for row in rows}


def segment_dense_attention(q, keys, values, starts):
    """The dense TTT attention with the causal part kept inside each query's sample."""
    bsz, hq, seq, dim = q.shape
    groups = hq // keys[0].shape[1]
    k_all = torch.cat([k.repeat_interleave(groups, 1) for k in keys], dim=2)
    v_all = torch.cat([v.repeat_interleave(groups, 1) for v in values], dim=2)
    t = torch.arange(seq)
    masks = []
    for b in range(bsz):
        causal = (t[None, :] <= t[:, None]) & (t[None, :] >= starts[b][:, None])
        masks.append(torch.cat([causal] + [t[None, :] == t[:, None]] * (len(keys) - 1), dim=1))
    scores = (q @ k_all.transpose(-1, -2) / math.sqrt(dim)).masked_fill(~torch.stack(masks)[:, None], float("-inf"))
    return torch.softmax(scores, -1) @ v_all


@pytest.mark.parametrize("steps,block", [(1, 4), (3, 5), (2, 64)])
def test_packed_attention_matches_a_dense_per_sample_reference_and_sees_no_other_sample(steps, block):
    torch.manual_seed(steps + block)
    rows = [[5, 9, 1, 8], [12, 11]]  # two rows of 23 tokens, samples straddling the blocks
    starts = torch.stack([torch.arange(23) - row_layout(r)["positions"] for r in rows])
    q = torch.randn(2, 4, 23, 8, requires_grad=True)
    keys = [torch.randn(2, 2, 23, 8, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(2, 2, 23, 8, requires_grad=True) for _ in range(steps)]
    fast = ttt_attention(q, keys, values, block, starts)
    ref = segment_dense_attention(q, keys, values, starts)
    assert torch.allclose(fast, ref, atol=1e-5, rtol=0)
    weights = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((fast * weights).sum(), [q, *keys, *values]),
                    torch.autograd.grad((ref * weights).sum(), [q, *keys, *values])):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    # The first sample of row 0 (tokens 0..4) changed: the other samples' outputs are bit for bit the same.
    bumped = [k.detach().clone() for k in keys]
    bumped[0][0, :, :5] += 100.0
    again = ttt_attention(q.detach(), bumped, [v.detach() for v in values], block, starts)
    assert torch.equal(again[0, :, 5:], fast.detach()[0, :, 5:])
    assert torch.equal(again[1], fast.detach()[1])


def test_one_sample_per_packed_row_is_the_unpacked_step_bit_for_bit():
    draft, head = tiny_draft(4)
    torch.manual_seed(5)
    s = _sample(13, 0)
    batch = collate_packed([s])
    teacher = teacher_targets(batch["final"], head, draft.draft_ids())
    kw = dict(steps=3, decay=0.8, out_of_vocab="mask", block_size=4)
    plain = ttt_forward(draft, batch["aux"], batch["input_ids"], batch["loss_mask"], batch["lengths"], teacher, **kw)
    packed = ttt_forward(draft, batch["aux"], batch["input_ids"], batch["loss_mask"], batch["lengths"], teacher,
                         positions=batch["positions"], segment_ends=batch["segment_ends"], **kw)
    assert torch.equal(plain.loss, packed.loss)
    assert torch.equal(plain.counted, packed.counted) and torch.equal(plain.correct, packed.correct)


def naive_sample_terms(draft, s, head, steps):
    """One sample alone, token by token: per step the loss sum (with its graph), loss tokens, correct, counted."""
    n = len(s["input_ids"])
    ids, mask, aux = s["input_ids"][None], s["loss_mask"], s["aux"][None]
    teacher = teacher_targets(s["final"][None], head, draft.draft_ids())
    hidden = draft.project(aux)
    attends, terms = dense_attends(draft.geometry.num_layers), []
    for k in range(steps):
        tokens = torch.zeros_like(ids)
        tokens[:, :max(n - 1 - k, 0)] = ids[:, 1 + k:]
        state = draft.step(hidden, tokens, torch.arange(n) + k, attends)
        logq = torch.log_softmax(draft.logits(state), -1)[0]
        loss, n_loss, correct, counted = 0.0, 0, 0, 0
        for t in range(n):
            j = t + k + 2
            if j < n and mask[j]:
                counted += 1
                target = int(teacher.argmax[0, t + 1 + k])
                correct += int(target >= 0 and int(logq[t].argmax()) == target)
                if target >= 0:
                    p = teacher.at(0, t + 1 + k)
                    loss = loss + (torch.xlogy(p, p) - p * logq[t]).sum()
                    n_loss += 1
        terms.append((loss, n_loss, correct, counted))
        hidden = state
    return terms


def _run_packed(draft, head, samples, steps, **kw):
    batch = collate_packed(samples)
    layout = {key: batch[key] for key in ("positions", "segment_ends")}
    needed = teacher_positions(batch["loss_mask"], batch["lengths"], **layout)
    teacher = teacher_targets(batch["final"], head, draft.draft_ids(), needed=needed)
    return ttt_forward(draft, batch["aux"], batch["input_ids"], batch["loss_mask"], batch["lengths"], teacher,
                       steps=steps, decay=0.8, out_of_vocab="mask", block_size=4, **layout, **kw), needed


@pytest.mark.parametrize("num_layers", [1, 2])
def test_a_packed_row_trains_as_its_samples_each_alone(num_layers):
    """A|B|C in one row: the loss, per-step correct / counted / loss tokens and every gradient of the
    samples run alone (token by token), pooled as a batch pools them; with a deeper draft too."""
    draft, head = tiny_draft(6, num_layers)
    samples = [_sample(n, 10 + i) for i, n in enumerate([11, 6, 9])]
    steps = 4
    params = [p for p in draft.parameters() if p.requires_grad]
    out, needed = _run_packed(draft, head, samples, steps)
    got = torch.autograd.grad(out.loss, params)
    alone = [naive_sample_terms(draft, s, head, steps) for s in samples]
    ref_loss = 0.0
    for k in range(steps):
        n_loss = sum(a[k][1] for a in alone)
        ref_loss = ref_loss + 0.8 ** k * sum(a[k][0] for a in alone) / max(n_loss, 1)
        assert int(out.loss_tokens[k]) == n_loss
        assert int(out.correct[k]) == sum(a[k][2] for a in alone)
        assert int(out.counted[k]) == sum(a[k][3] for a in alone)
    assert out.loss.item() == pytest.approx(float(ref_loss.detach()), abs=1e-5)
    want = torch.autograd.grad(ref_loss, params)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    # The teacher rows computed are exactly those a loss reads: each sample's own needed positions.
    alone_needed = [teacher_positions(s["loss_mask"][None], torch.tensor([len(s["input_ids"])]))[0] for s in samples]
    assert torch.equal(needed[0], torch.cat(alone_needed))


def test_a_packed_row_pools_the_production_step_of_its_samples_alone():
    """The same, against the production step run per sample (unpacked, no padding): pooled counts and loss sums."""
    draft, head = tiny_draft(7)
    samples = [_sample(n, 20 + i) for i, n in enumerate([14, 3, 8, 10])]
    packed, _ = _run_packed(draft, head, samples, 5)
    sums, tokens, correct, counted = 0.0, 0, 0, 0
    for s in samples:
        batch = collate_padded([s])
        teacher = teacher_targets(batch["final"], head, draft.draft_ids())
        o = ttt_forward(draft, batch["aux"], batch["input_ids"], batch["loss_mask"], batch["lengths"], teacher,
                        steps=5, decay=0.8, out_of_vocab="mask", block_size=4)
        n = len(o.step_loss)
        pad = lambda x: torch.nn.functional.pad(x, (0, 5 - n))  # noqa: E731 - a 3-token sample has 2 steps
        sums, tokens = sums + pad(o.step_loss * o.loss_tokens), tokens + pad(o.loss_tokens)
        correct, counted = correct + pad(o.correct), counted + pad(o.counted)
    assert torch.equal(packed.correct, correct) and torch.equal(packed.counted, counted)
    assert torch.equal(packed.loss_tokens, tokens)
    assert torch.allclose(packed.step_loss * packed.loss_tokens, sums, atol=1e-5)


def test_no_attention_across_samples_changing_one_sample_leaves_the_others_states():
    draft, head = tiny_draft(8)
    samples = [_sample(n, 30 + i) for i, n in enumerate([7, 9, 6])]
    states: list[torch.Tensor] = []
    hook = draft.midlayer.register_forward_hook(lambda mod, args, out: states.append(out.detach()))
    try:
        _run_packed(draft, head, samples, 3)
        before, states[:] = list(states), []
        changed = [dict(samples[0], aux=samples[0]["aux"] * 5 + 1, final=samples[0]["final"] * 3), *samples[1:]]
        _run_packed(draft, head, changed, 3)
    finally:
        hook.remove()
    assert len(before) == len(states) == 3
    for k, (a, b) in enumerate(zip(before, states)):
        assert not torch.allclose(a[0, :7], b[0, :7]), k  # A's own states did change
        assert torch.equal(a[0, 7:], b[0, 7:]), k  # B's and C's did not, bit for bit


def test_no_token_of_the_next_sample_reaches_a_sample_and_rope_positions_restart(monkeypatch):
    """A sample's last positions would read the next sample's tokens (t+1+k); they read 0, as alone.
    Rope positions restart per sample (attention scores alone would not show it: rope is relative)."""
    draft, head = tiny_draft(9)
    samples = [_sample(n, 40 + i) for i, n in enumerate([7, 9])]
    states: list[torch.Tensor] = []
    seen: list[torch.Tensor] = []
    import eagle3.draft.model as model_mod

    rope = model_mod.rope_cos_sin  # each attention builds its rope tables from the positions it is given
    monkeypatch.setattr(model_mod, "rope_cos_sin", lambda positions, *a: (seen.append(positions), rope(positions, *a))[1])
    hook = draft.midlayer.register_forward_hook(lambda mod, args, out: states.append(out.detach()))
    try:
        _run_packed(draft, head, samples, 3)
        before, states[:] = list(states), []
        _run_packed(draft, head, [samples[0], dict(samples[1], input_ids=(samples[1]["input_ids"] + 1) % 12)], 3)
    finally:
        hook.remove()
    for a, b in zip(before, states):
        assert torch.equal(a[0, :7], b[0, :7])
    assert [p[0].tolist() for p in seen[:3]] == [[k + i for i in range(7)] + [k + i for i in range(9)] for k in range(3)]
