"""The steps after the first run on each row's live window: the same loss, metrics and gradients
as the unroll over every position, on rows whose prompts are long enough to be cut."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.attention import ttt_attention
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.ttt import ttt_forward
from eagle3.draft.window import LiveWindow
from tests.unit.draft.test_mla import tiny_mla_draft
from tests.unit.draft.test_ttt import dense_ttt_attention, naive_ttt_loss, tiny_draft


def test_the_window_starts_steps_plus_one_before_each_rows_first_loss_token():
    mask = torch.tensor([[0] * 9 + [1] * 5 + [0] * 2,   # first loss token 9, length 14
                         [0] * 3 + [1] * 10 + [0] * 3,  # 3: nothing to cut, length 13
                         [0] * 12 + [1, 0, 1, 0],       # 12, length 15 (a hole in the answer)
                         [0] * 16])                     # no loss token at all: its length
    lengths = torch.tensor([14, 13, 15, 6])
    window = LiveWindow.of(mask, lengths, steps=3)
    assert window is not None
    assert window.starts.tolist() == [5, 0, 8, 2]
    assert window.width == 13  # row 1 keeps its 13 positions: one width for the batch
    assert window.cols[2].tolist() == list(range(8, 21))
    assert LiveWindow.of(mask[1:2, :13], lengths[1:2], steps=3) is None  # nothing would be cut
    full_row = torch.cat([mask, torch.tensor([[0] * 2 + [1] * 14])])  # a row as long as the batch, barely cut
    assert LiveWindow.of(full_row, torch.cat([lengths, torch.tensor([16])]), steps=3) is None
    rows = torch.arange(4 * 16).view(4, 16)
    assert window.gather(rows)[0, :3].tolist() == [5, 6, 7]
    assert window.gather(rows)[2, -1].item() == rows[2, 15].item()  # past the row: its last column
    states = torch.randn(4, 16, 3)
    assert torch.equal(window.gather(states)[3, 4], states[3, 6])


@pytest.mark.parametrize("block", [2, 5, 64])
def test_windowed_queries_attend_as_the_full_rows_queries_do(block):
    """Queries at window columns, step-0 keys over the whole row: the full rows' outputs at those
    positions, values and gradients."""
    torch.manual_seed(0)
    bsz, heads, kv_heads, seq, dim = 3, 4, 2, 12, 4
    offsets = torch.tensor([5, 0, 3])
    width = 7
    cols = offsets.unsqueeze(1) + torch.arange(width)  # [B, W] (row 1's last columns run past nothing)
    q = torch.randn(bsz, heads, seq, dim, requires_grad=True)
    keys = [torch.randn(bsz, kv_heads, seq, dim, requires_grad=True) for _ in range(3)]
    values = [torch.randn(bsz, kv_heads, seq, dim, requires_grad=True) for _ in range(3)]

    def rows(x):  # [B, H, T, D] -> [B, H, W, D]
        return x.gather(2, cols.view(bsz, 1, width, 1).expand(-1, x.shape[1], -1, x.shape[3]))

    dense = rows(dense_ttt_attention(q, keys, values))
    fast = ttt_attention(rows(q), [keys[0], *map(rows, keys[1:])], [values[0], *map(rows, values[1:])],
                         block, offsets=offsets)
    torch.testing.assert_close(fast, dense, atol=1e-6, rtol=1e-5)
    weights = torch.randn_like(dense)
    for a, b in zip(torch.autograd.grad((fast * weights).sum(), [q, *keys, *values]),
                    torch.autograd.grad((dense * weights).sum(), [q, *keys, *values]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="packed"):
        ttt_attention(rows(q), keys, values, block, starts=torch.zeros(bsz, width, dtype=torch.long),
                      offsets=offsets)


def _long_prompt_batch(seed: int = 3):
    """Three right-padded rows whose prompts (10, 2 and 13 tokens) outrun a 4-step chain, one with
    a hole in its answer, one shorter than the batch."""
    torch.manual_seed(seed)
    seq = 22
    ids = torch.randint(0, 12, (3, seq))
    mask = torch.zeros(3, seq, dtype=torch.long)
    mask[0, 10:22] = 1
    mask[0, 15] = 0
    mask[1, 2:17] = 1
    mask[2, 13:19] = 1
    lengths = torch.tensor([22, 17, 19])
    return torch.randn(3, seq, 24, dtype=torch.float64), ids, mask, lengths, torch.randn(3, seq, 8, dtype=torch.float64)


def _unroll(draft, batch, teacher, live_window, **kw):
    aux, ids, mask, lengths, _ = batch
    out = ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=4, decay=0.8, out_of_vocab="mask",
                      block_size=3, live_window=live_window, **kw)
    grads = torch.autograd.grad(out.loss, [p for p in draft.parameters() if p.requires_grad])
    return out, grads


@pytest.mark.parametrize("variant", [
    dict(), dict(num_layers=2), dict(mla=True), dict(ttt_chains="on_policy"), dict(step_weights="dpace"),
    dict(loss="lk"), dict(logits_budget_bytes=0)])
def test_the_windowed_unroll_equals_the_full_one(variant):
    """In float64 (the attention's softmax still runs in float32: the two key ranges round alike to
    ~1e-8), so a real difference, O(1) where a column or a key is wrong, cannot hide in rounding."""
    variant = dict(variant)
    num_layers, mla = variant.pop("num_layers", 1), variant.pop("mla", False)
    draft, head = tiny_mla_draft(5, num_layers) if mla else tiny_draft(5, num_layers)
    draft, head = draft.double(), head.double()
    batch = _long_prompt_batch()
    _, _, mask, lengths, final = batch
    window = LiveWindow.of(mask, lengths, steps=4)
    assert window is not None and window.width < mask.shape[1]  # the batch is one the window cuts
    teacher = teacher_targets(final, head, draft.draft_ids())
    full, full_grads = _unroll(draft, batch, teacher, False, **variant)
    cut, cut_grads = _unroll(draft, batch, teacher, True, **variant)
    assert cut.loss.item() == pytest.approx(full.loss.item(), rel=1e-7)
    for name in ("correct", "counted", "loss_tokens", "chain_correct"):
        assert getattr(cut, name).tolist() == getattr(full, name).tolist(), name
    torch.testing.assert_close(cut.step_loss, full.step_loss, rtol=1e-7, atol=1e-9)
    assert min(full.counted.tolist()) > 0
    for a, b in zip(cut_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))


def test_the_windowed_unroll_matches_the_token_by_token_reference():
    """One row with a 9-token prompt: the reference runs every step at every position."""
    draft, head = tiny_draft(7)
    torch.manual_seed(8)
    seq = 18
    ids = torch.randint(0, 12, (1, seq))
    mask = torch.tensor([[0] * 9 + [1] * 9])
    aux, final = torch.randn(1, seq, 24), torch.randn(1, seq, 8)
    assert LiveWindow.of(mask, torch.tensor([seq]), steps=3) is not None
    teacher = teacher_targets(final, head, draft.draft_ids())
    fast = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, steps=3, decay=0.8,
                       out_of_vocab="mask", block_size=4)
    ref = naive_ttt_loss(draft, aux, ids, mask, teacher, steps=3, decay=0.8)
    assert fast.loss.item() == pytest.approx(float(ref.detach()), abs=1e-5)
    (g_fast,) = torch.autograd.grad(fast.loss, draft.midlayer.mlp.up_proj.weight)
    (g_ref,) = torch.autograd.grad(naive_ttt_loss(draft, aux, ids, mask, teacher, 3, 0.8),
                                   draft.midlayer.mlp.up_proj.weight)
    torch.testing.assert_close(g_fast, g_ref, atol=1e-5, rtol=1e-4)


def test_rescored_chains_run_on_the_window_too(target):
    """train.ttt_chains=rescored reads the drafted tokens and their teachers at the window's columns."""
    from eagle3.draft.rescoring import rescore
    from eagle3.target.decoder import find_decoder
    from eagle3.target.tree import TreeScorer
    from tests.unit.draft.test_rescoring import CAPTURE, make_draft

    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([16, 12])
    ids = torch.zeros(2, 16, dtype=torch.long)
    mask = torch.zeros(2, 16, dtype=torch.long)
    for b, (n, prompt) in enumerate(zip(lengths.tolist(), (9, 6), strict=True)):
        ids[b, :n] = torch.randint(10, 512, (n,), generator=gen)
        mask[b, prompt:n] = 1
    aux = torch.zeros(2, 16, len(CAPTURE) * target.config.hidden_size)
    final = torch.zeros(2, 16, target.config.hidden_size)
    with torch.no_grad():
        for b, n in enumerate(lengths.tolist()):
            out = target.model(input_ids=ids[b:b + 1, :n], output_hidden_states=True)
            aux[b, :n] = torch.cat([out.hidden_states[i][0] for i in CAPTURE], -1)
            final[b, :n] = out.last_hidden_state[0]
    assert LiveWindow.of(mask, lengths, steps=3) is not None
    draft = make_draft(target, 2)
    head = target.get_output_embeddings().weight.detach()
    teacher = teacher_targets(final, head, draft.draft_ids())
    rollout = rescore(draft, TreeScorer(find_decoder(target)), head, aux, ids, mask, lengths, steps=3, block_size=4)
    outs = [ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=3, decay=0.8, out_of_vocab="mask",
                        block_size=4, ttt_chains="rescored", rollout=rollout, live_window=live)
            for live in (False, True)]
    assert outs[1].loss.item() == pytest.approx(outs[0].loss.item(), rel=1e-5)
    assert outs[1].loss_tokens.tolist() == outs[0].loss_tokens.tolist() and min(outs[0].loss_tokens.tolist()) > 0
    weights = [draft.fc.weight, draft.midlayer.mlp.down_proj.weight]
    for a, b in zip(torch.autograd.grad(outs[1].loss, weights), torch.autograd.grad(outs[0].loss, weights),
                    strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_share_script_counts_the_columns_each_step_runs_on():
    """scripts/live_window_share.py, which BENCHMARKS quotes: step 0 on B x T, later steps on B x W."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "live_window_share.py"
    spec = importlib.util.spec_from_file_location("live_window_share", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    masks = [[0] * 10 + [1] * 6, [0] * 12 + [1] * 4]  # starts 6 and 8 at 3 steps: widths 10 and 8
    assert module.column_steps(masks, batch_tokens=64, steps=3) == (2 * 16 * 3, 2 * (16 + 10 * 2))
    assert module.column_steps(masks, batch_tokens=16, steps=3) == (2 * 16 * 3, 16 + 10 * 2 + 16 + 8 * 2)
