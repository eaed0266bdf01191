"""Merge sampling (nested, fixed eval, weighted, deduped) and the draft vocabulary mapping."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from eagle3.data.draft_vocab import VocabMapping, count_masked_tokens, coverage, select_draft_tokens
from eagle3.data.mixture import Candidate, split_mixture, token_hash


def pool(sizes: dict[str, int]) -> list[Candidate]:
    return [Candidate(source=s, id=f"{s}:{i}", token_hash=f"{s}-{i}", n_tokens=10 + i)
            for s, n in sizes.items() for i in range(n)]


def ids(cands):
    return [c.id for c in cands]


def test_train_sets_are_nested_across_scales_and_eval_is_fixed():
    cands = pool({"a": 300, "b": 200})
    weights = {"a": 1.0, "b": 2.0}
    splits = [split_mixture(cands, weights, scale, eval_size=20, seed=7) for scale in (10, 50, 120, None)]
    for small, large in zip(splits, splits[1:]):
        assert set(ids(small.train)) < set(ids(large.train))
        assert ids(large.train)[: len(small.train)] == ids(small.train)
        assert ids(small.eval) == ids(large.eval)
    for split in splits:
        assert not set(ids(split.train)) & set(ids(split.eval))
        assert len(split.train) + len(split.eval) + len(split.not_selected) == 500
    assert len(splits[-1].train) == 480


def test_weights_set_exact_proportions_until_a_source_runs_out():
    cands = pool({"a": 100, "b": 100})
    split = split_mixture(cands, {"a": 3.0, "b": 1.0}, 40, eval_size=0, seed=0)
    assert sorted(c.source for c in split.train).count("a") == 30
    small = pool({"a": 5, "b": 100})
    split = split_mixture(small, {"a": 1.0, "b": 1.0}, 50, eval_size=0, seed=0)
    assert [c.source for c in split.train].count("a") == 5 and len(split.train) == 50


def test_seed_changes_the_sample_but_not_its_size():
    cands = pool({"a": 100})
    one = split_mixture(cands, {"a": 1.0}, 10, 5, seed=1)
    two = split_mixture(cands, {"a": 1.0}, 10, 5, seed=2)
    assert ids(one.train) != ids(two.train) and len(two.train) == 10


def test_dedupe_across_sources_is_order_independent():
    cands = pool({"a": 20, "b": 20})
    dup = [Candidate("b", f"b:dup{i}", f"a-{i}", 10) for i in range(5)]  # same tokens as a:0..4
    first = split_mixture(cands + dup, {"a": 1, "b": 1}, None, 0, seed=3)
    shuffled = cands + dup
    random.Random(0).shuffle(shuffled)
    second = split_mixture(shuffled, {"a": 1, "b": 1}, None, 0, seed=3)
    assert len(first.duplicates) == 5
    assert sorted(ids(first.duplicates)) == sorted(ids(second.duplicates))
    assert sorted(ids(first.train)) == sorted(ids(second.train))


def test_zero_weight_sources_are_left_out():
    split = split_mixture(pool({"a": 10, "b": 10}), {"a": 1.0, "b": 0.0}, None, 2, seed=0)
    assert {c.source for c in split.train + split.eval} == {"a"} and len(split.zero_weight) == 10


def test_token_hash_distinguishes_sequences():
    assert token_hash([1, 2, 3]) == token_hash((1, 2, 3))
    assert token_hash([1, 2, 3]) != token_hash([1, 2, 3, 0])


def test_counts_only_masked_tokens():
    counts = count_masked_tokens([([1, 2, 2, 3], [0, 1, 1, 0]), ([3, 3, 5], [1, 1, 1])], 8)
    assert counts.tolist() == [0, 0, 2, 2, 0, 1, 0, 0]
    with pytest.raises(ValueError, match="outside the target vocab"):
        count_masked_tokens([([9], [1])], 8)


def test_selection_by_frequency_ties_by_id_and_fill_when_too_few_tokens():
    counts = np.array([0, 5, 3, 5, 0, 3, 1, 0])
    assert select_draft_tokens(counts, 3).tolist() == [1, 2, 3]  # 5,5 then the lower-id 3
    # Only 5 distinct tokens for a vocab of 7: two unseen ids fill in, lowest first.
    assert select_draft_tokens(counts, 7).tolist() == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError):
        select_draft_tokens(counts, 9)


def test_d2t_t2d_follow_the_engine_convention():
    mapping = VocabMapping.from_selected(np.array([1, 4, 6]), 8)
    assert mapping.d2t.dtype == torch.int64 and mapping.d2t.tolist() == [1, 3, 4]
    assert mapping.draft_to_target().tolist() == [1, 4, 6]
    assert mapping.t2d.dtype == torch.bool
    assert mapping.t2d.nonzero().flatten().tolist() == [1, 4, 6]
    counts = np.array([0, 6, 0, 0, 2, 0, 0, 2])
    assert coverage(counts, mapping.t2d) == pytest.approx(0.8)
