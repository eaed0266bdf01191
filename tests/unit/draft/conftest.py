"""Fixtures the draft's tests share: the demo target in float32, one intra-op thread for batch-1 decoding."""

from __future__ import annotations

import pytest
import torch

from eagle3.demo.corpus import DEMO_TARGET_PATH


@pytest.fixture(scope="module")
def one_thread():
    """Batch-1 decoding of a 256-wide model gains nothing from intra-op threads, and on a shared
    CPU their spin-waits make it dozens of times slower. A module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    """The demo target (Llama-shaped), float32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(DEMO_TARGET_PATH, dtype=torch.float32).eval()
