"""Muon's Newton-Schulz: the Gram-space form against the direct iteration it replaces on wide matrices."""

import pytest
import torch

from eagle3.draft import optim
from eagle3.draft.optim import orthogonalize


def _with_spectrum(rows: int, cols: int, spectrum: str) -> torch.Tensor:
    """A [rows, cols] matrix with random singular vectors and a gradient-like decaying spectrum."""
    generator = torch.Generator().manual_seed(0)
    k = min(rows, cols)
    left, _ = torch.linalg.qr(torch.randn(rows, k, dtype=torch.float64, generator=generator))
    right, _ = torch.linalg.qr(torch.randn(cols, k, dtype=torch.float64, generator=generator))
    i = torch.arange(1, k + 1, dtype=torch.float64)
    values = {"power": 1 / i, "exponential": torch.exp(-30 * i / k)}[spectrum]
    matrix = (left * values) @ right.T
    return (matrix / matrix.norm()).float()


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 7])
def test_gram_space_iteration_is_the_direct_iteration_in_exact_arithmetic(steps):
    x = _with_spectrum(24, 96, "power").double()
    assert torch.allclose(optim._gram_newton_schulz(x, steps), optim._newton_schulz(x, steps), atol=1e-10)


@pytest.mark.parametrize("spectrum", ["power", "exponential"])
def test_gram_space_iteration_in_bfloat16_stays_as_close_to_exact_as_the_direct_one(spectrum):
    """Without re-forming the Gram every few steps, bf16 rounding blows singular values up ~100x here."""
    x = _with_spectrum(256, 1024, spectrum)
    exact = optim._newton_schulz(x.double(), 5)
    direct = optim._newton_schulz(x.bfloat16(), 5)
    gram = optim._gram_newton_schulz(x.bfloat16(), 5)
    assert _relative_error(gram, exact) < 2 * _relative_error(direct, exact)
    assert float(torch.linalg.svdvals(gram.double()).max()) < 1.3  # the direct iteration's ceiling (~1.2)


@pytest.mark.parametrize("shape, gram_used", [((64, 256), True), ((256, 64), True), ((64, 96), False),
                                              ((64, 64), False)])
def test_orthogonalize_takes_the_gram_form_only_where_it_saves_work(monkeypatch, shape, gram_used):
    calls = []
    real = optim._gram_newton_schulz
    monkeypatch.setattr(optim, "_gram_newton_schulz", lambda x, steps: calls.append(x.shape) or real(x, steps))
    update = _with_spectrum(*shape, "power") * 3
    got = orthogonalize(update, steps=5, dtype=torch.float64)
    assert bool(calls) == gram_used
    assert got.shape == update.shape and got.dtype == update.dtype
    want = optim._newton_schulz((update / update.norm()).double().reshape(shape), 5)
    assert torch.allclose(got.double(), want, atol=1e-5)
