"""The target's final norm as the extract path applies it, for each family's norm convention."""

from __future__ import annotations

import logging

import pytest
import torch

from eagle3.target.weights import load_final_norm, norm_adds_one, rms_norm


def _tiny_gemma3(path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.normal_(0.0, 0.5)  # far from both 0 and 1: either convention shows
    model.save_pretrained(path)
    return model


def test_a_gemma_targets_final_norm_is_applied_as_its_own_module_applies_it(tmp_path):
    model = _tiny_gemma3(tmp_path)
    scale, eps = load_final_norm(str(tmp_path))
    x = torch.randn(6, 32) * 4
    with torch.no_grad():
        expected = model.model.norm(x)
    torch.testing.assert_close(rms_norm(x, scale, eps), expected, atol=1e-5, rtol=1e-5)
    # what applying the stored weight would give: the silent error this guards against
    stored = model.model.norm.weight.detach()
    assert (rms_norm(x, stored, eps) - expected).abs().max() > 0.5


@pytest.mark.parametrize("model_type, adds_one", [
    ("llama", False), ("deepseek_v3", False), ("qwen2", False),
    ("gemma3_text", True), ("gemma2", True), ("qwen3_next", True),
])
def test_each_familys_norm_convention_comes_from_its_own_module(model_type, adds_one):
    config = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_hidden_layers": 3}
    assert norm_adds_one(config) is adds_one


def test_a_family_transformers_cannot_build_is_taken_as_the_common_convention_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="eagle3"):
        assert norm_adds_one({"model_type": "no_such_family", "hidden_size": 64}) is False
    assert "no_such_family" in caplog.text and "could not be checked" in caplog.text
    assert norm_adds_one({"hidden_size": 64}) is False  # no model_type: nothing to ask
