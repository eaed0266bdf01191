"""Checkpoints leave the target's frozen embedding out and put it back, checked, at resume."""

from __future__ import annotations

import pytest
import torch

from eagle3.config.schema import TrainConfig
from eagle3.draft.checkpoint_io import FROZEN_EMBEDDING, EmbeddingMismatch
from eagle3.draft.lightning_module import DraftModule
from tests.unit.draft.test_ttt import tiny_geometry


def _module(embed: torch.Tensor, seed: int = 0) -> DraftModule:
    torch.manual_seed(seed)
    selected = torch.tensor([0, 2, 3, 7, 11])
    t2d = torch.zeros(12, dtype=torch.bool)
    t2d[selected] = True
    return DraftModule(tiny_geometry(), torch.randn(12, 8), TrainConfig(), embed=embed,
                       d2t=selected - torch.arange(5), t2d=t2d)


def test_a_saved_checkpoint_leaves_the_embedding_out_and_a_resume_puts_the_targets_back():
    embed = torch.randn(12, 8)
    trained = _module(embed)
    with torch.no_grad():
        trained.draft.fc.weight.add_(1.0)  # what training changed
    checkpoint = {"state_dict": dict(trained.state_dict())}
    trained.on_save_checkpoint(checkpoint)
    assert FROZEN_EMBEDDING not in checkpoint["state_dict"]

    resumed = _module(embed.clone(), seed=1)  # another init: the checkpoint's weights must win
    resumed.on_load_checkpoint(checkpoint)
    resumed.load_state_dict(checkpoint["state_dict"], strict=True)
    for name, value in trained.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


def test_resuming_with_another_embedding_is_refused_in_one_line():
    trained = _module(torch.randn(12, 8))
    checkpoint = {"state_dict": dict(trained.state_dict())}
    trained.on_save_checkpoint(checkpoint)
    other = _module(torch.randn(12, 8))
    with pytest.raises(EmbeddingMismatch) as info:
        other.on_load_checkpoint(checkpoint)
    assert "another token embedding" in str(info.value) and "model.path" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_checkpoint_that_holds_the_embedding_keeps_its_own():
    """Written before the embedding was left out: it resumes as it did."""
    old = _module(torch.randn(12, 8))
    checkpoint = {"state_dict": dict(old.state_dict())}
    other = _module(torch.randn(12, 8))
    other.on_load_checkpoint(checkpoint)
    assert torch.equal(checkpoint["state_dict"][FROZEN_EMBEDDING], old.draft.embed_tokens.weight)
