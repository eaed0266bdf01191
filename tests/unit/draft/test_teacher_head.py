"""The screened teacher head against a naive float32 full-vocab product: same argmax, same probabilities."""

from __future__ import annotations

import pytest
import torch

from eagle3.config.schema import TrainConfig
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.lightning_module import DraftModule
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.teacher_head import TeacherHead

VOCAB, HIDDEN, DRAFT_VOCAB = 3000, 48, 1000


def naive(states: torch.Tensor, head: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 logits over the whole vocab: (softmax over the draft vocab, full argmax as a draft id or -1)."""
    logits = states.double() @ head.double().T
    to_draft = torch.full((head.shape[0],), -1, dtype=torch.long)
    to_draft[draft_ids] = torch.arange(len(draft_ids))
    return torch.softmax(logits[:, draft_ids], -1).float(), to_draft[logits.argmax(-1)]


def near_ties(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float32 head (not bf16-exact), states at logit scale ~30, and out-of-vocab rows planted a hair
    above or below each row's best in-vocab logit: the cases a bf16-only argmax gets wrong."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, HIDDEN, generator=gen) * 0.3
    draft_ids = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[draft_ids] = False
    oov = outside.nonzero().squeeze(1)
    states = torch.randn(64, HIDDEN, generator=gen) * 6
    best_in = draft_ids[(states @ head[draft_ids].T).argmax(-1)]
    for row in range(len(states)):  # row r gets its own planted rival just above/below its winner
        rival, x = oov[row], states[row]
        shift = (1e-3 if row % 2 else -1e-3) * x / x.dot(x)  # moves the rival's logit by +-1e-3
        head[rival] = head[best_in[row]] + shift
    return states, head, draft_ids


@pytest.mark.parametrize("seed", [0, 1])
def test_screened_argmax_and_probs_equal_the_float32_product(seed):
    states, head, draft_ids = near_ties(seed)
    probs_ref, argmax_ref = naive(states, head, draft_ids)
    split = TeacherHead.build(head, draft_ids, screen=True)
    assert split.out_of_vocab is not None and split.out_of_vocab.dtype == torch.bfloat16
    logits, argmax = split.draft_logits(states)
    assert torch.equal(argmax, argmax_ref)
    torch.testing.assert_close(torch.softmax(logits, -1), probs_ref, rtol=1e-4, atol=1e-5)  # float32 vs float64
    assert 0 < int((argmax_ref < 0).sum()) < len(states)  # the planted rivals win about half the rows

    # the planted gaps are far below bf16's resolution at this scale: a bf16-only argmax is wrong somewhere
    bf16_logits = (states.bfloat16() @ head.bfloat16().T).float()
    assert not torch.equal(split.draft_id_of(bf16_logits.argmax(-1)), argmax_ref)


def test_the_bound_covers_the_bf16_error_of_every_row():
    gen = torch.Generator().manual_seed(3)
    head = torch.randn(VOCAB, HIDDEN, generator=gen) * torch.logspace(-2, 0.5, HIDDEN)  # uneven columns
    states = torch.randn(200, HIDDEN, generator=gen) * torch.logspace(0, 2, 200).unsqueeze(1)  # logits to ~1e3
    draft_ids = torch.arange(0, VOCAB, 3)
    split = TeacherHead.build(head, draft_ids, screen=True)
    hi, bound = split.out_of_vocab_max(states)
    assert split.out_of_vocab is not None
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[draft_ids] = False
    exact = (states.double() @ head[outside].double().T).max(-1).values
    assert bool(((hi.double() - exact).abs() <= bound.double()).all())
    assert float((bound / exact.abs()).median()) < 0.05  # and is tight enough to decide most rows


def test_teacher_targets_takes_a_split_head_or_a_plain_one_alike():
    states, head, draft_ids = near_ties(0)
    final = states.view(4, 16, HIDDEN)
    plain = teacher_targets(final, head, draft_ids, chunk_tokens=7)
    split = teacher_targets(final, TeacherHead.build(head, draft_ids, screen=True), draft_ids)
    unscreened = teacher_targets(final, TeacherHead.build(head, draft_ids, screen=False), draft_ids)
    for other in (split, unscreened):
        assert torch.equal(plain.argmax, other.argmax)
        # float32 summation order: the chunking and the CPU's GEMM blocking (it varies with the load) differ
        torch.testing.assert_close(plain.probs, other.probs, rtol=5e-5, atol=1e-7)
    with pytest.raises(ValueError, match="another draft vocab"):
        teacher_targets(final, TeacherHead.build(head, draft_ids[:-1]), draft_ids)


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("renormalise", [True, False])
def test_the_teacher_stays_float32_inside_a_bf16_autocast_region(screen, renormalise):
    """Lightning's bf16-mixed runs training_step under autocast: the teacher must not follow it to bf16
    (its logits would round at ~2^-9 relative, the probabilities by a few percent, the argmax flip)."""
    states, head, draft_ids = near_ties(0)
    final = states.view(4, 16, HIDDEN)
    split = TeacherHead.build(head, draft_ids, screen=screen)
    plain = teacher_targets(final, split if renormalise else head, draft_ids, renormalise=renormalise)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = teacher_targets(final, split if renormalise else head, draft_ids, renormalise=renormalise)
        logits, argmax = split.draft_logits(states)
    assert inside.probs.dtype == torch.float32 and logits.dtype == torch.float32
    assert torch.equal(plain.argmax, inside.argmax)
    torch.testing.assert_close(plain.probs, inside.probs, rtol=5e-5, atol=1e-7)
    probs_ref, argmax_ref = naive(states, head, draft_ids)
    assert torch.equal(argmax, argmax_ref)
    torch.testing.assert_close(torch.softmax(logits, -1), probs_ref, rtol=1e-4, atol=1e-5)


def test_a_draft_vocab_that_is_the_whole_vocab_needs_no_screen():
    states, head, _ = near_ties(1)
    every = torch.arange(VOCAB)
    split = TeacherHead.build(head, every, screen=True)
    assert split.out_of_vocab is None
    probs_ref, argmax_ref = naive(states, head, every)
    logits, argmax = split.draft_logits(states)
    assert torch.equal(argmax, argmax_ref) and bool((argmax >= 0).all())


def test_the_module_rebuilds_its_split_when_the_draft_vocab_changes():
    geometry = DraftGeometry(hidden_size=HIDDEN, num_attention_heads=2, num_key_value_heads=2, head_dim=24,
                             intermediate_size=64, fc_in_features=3 * HIDDEN, vocab_size=VOCAB,
                             draft_vocab_size=DRAFT_VOCAB, capture_layers=(0, 1, 2), target_num_layers=4)
    _, head, draft_ids = near_ties(0)
    module = DraftModule(geometry, head, TrainConfig(ttt_steps=2))
    first = module._split_head()
    assert module._split_head() is first  # built once, not per batch
    module.draft.d2t.copy_(draft_ids - torch.arange(DRAFT_VOCAB))  # what loading a checkpoint does
    second = module._split_head()
    assert second is not first and torch.equal(second.draft_ids, draft_ids)
