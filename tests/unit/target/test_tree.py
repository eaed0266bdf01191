"""Branch nodes scored in one forward against forwards of their explicit prefixes, on each decoder family."""

from __future__ import annotations

import pytest
import torch

from eagle3.paths import asset_path
from eagle3.target.decoder import load_target
from eagle3.target.tree import TreeScorer, _whole_branches, tree_mask


def _tiny_qwen2(path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).eval().save_pretrained(path)
    return path


def _tiny_gemma3(path, sliding_window: int = 64):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              sliding_window=sliding_window, layer_types=["sliding_attention"] * 2 + ["full_attention"])
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).eval().save_pretrained(path)
    return path


def _target(kind: str, tmp_path):
    if kind == "llama":
        return str(asset_path("demo_target"))
    if kind == "deepseek_v3":
        return str(asset_path("demo_kimi_target"))
    return str(_tiny_qwen2(tmp_path) if kind == "qwen2" else _tiny_gemma3(tmp_path))


def _branches(length: int, depths: dict[int, int], vocab: int, seed: int = 1):
    """Nodes of one branch per (branch point -> depth), consecutive, depth 0 first."""
    gen = torch.Generator().manual_seed(seed)
    at = torch.cat([torch.full((d,), p) for p, d in depths.items()])
    depth = torch.cat([torch.arange(d) for d in depths.values()])
    tokens = torch.randint(3, vocab, (len(at),), generator=gen)
    return at, tokens, depth


@pytest.mark.parametrize("kind", ["llama", "deepseek_v3", "qwen2", "gemma3"])
def test_each_node_gets_the_final_state_of_its_own_prefix(kind, tmp_path):
    parts = load_target(_target(kind, tmp_path), dtype="float32", trust_remote_code=False)
    vocab = parts.base.config.vocab_size
    sample = torch.randint(3, vocab, (14,), generator=torch.Generator().manual_seed(0))
    at, tokens, depth = _branches(len(sample), {0: 2, 7: 1, 12: 3}, vocab)
    got = TreeScorer(parts).final_states(sample, at, tokens, depth)  # [N, H]
    assert got.shape == (len(at), parts.hidden_size)
    with torch.no_grad():
        for n in range(len(at)):
            p, d = int(at[n]), int(depth[n])
            prefix = torch.cat([sample[:p + 1], tokens[n - d:n + 1]])  # the sample through p, its branch to n
            want = parts.base(input_ids=prefix[None]).last_hidden_state[0, -1]
            torch.testing.assert_close(got[n], want, atol=2e-4, rtol=1e-4)
    # another branch's token in a node's prefix would change its state: the mask keeps branches apart
    swapped = tokens.clone()
    swapped[0] = (swapped[0] + 1) % vocab
    again = TreeScorer(parts).final_states(sample, at, swapped, depth)
    assert not torch.allclose(again[1], got[1]) and torch.allclose(again[2:], got[2:], atol=1e-5)


def test_forwards_split_between_branches_give_the_same_states():
    parts = load_target(str(asset_path("demo_target")), dtype="float32", trust_remote_code=False)
    sample = torch.randint(3, 200, (10,), generator=torch.Generator().manual_seed(0))
    at, tokens, depth = _branches(len(sample), {1: 3, 4: 3, 6: 2, 8: 1}, 200)
    whole = TreeScorer(parts).final_states(sample, at, tokens, depth)
    split = TreeScorer(parts, nodes_per_forward=4).final_states(sample, at, tokens, depth)
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)
    assert _whole_branches(depth, 4) == [(0, 3), (3, 6), (6, 9)]  # no branch is cut


def test_mask_and_positions_of_a_small_tree():
    mask, positions = tree_mask(3, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))
    assert positions.tolist() == [0, 1, 2, 1, 2, 2]
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],  # branch at 0, depth 0
        [1, 0, 0, 1, 1, 0],  # its depth 1
        [1, 1, 0, 0, 0, 1],  # branch at 1, depth 0
    ]


def test_a_sample_longer_than_a_sliding_window_is_refused(tmp_path):
    parts = load_target(str(_tiny_gemma3(tmp_path, sliding_window=8)), dtype="float32", trust_remote_code=False)
    at, tokens, depth = _branches(12, {2: 2}, 96)
    with pytest.raises(ValueError, match=r"12 tokens is longer than the target's sliding window \(8\)"):
        TreeScorer(parts).final_states(torch.arange(3, 15), at, tokens, depth)
