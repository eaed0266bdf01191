"""Muon for the draft's weight matrices, AdamW for the rest, as one optimizer.

One `torch.optim.Optimizer` (not a pair) so Lightning's automatic optimisation, the LR
scheduler, gradient clipping and `last.ckpt` resume treat it like AdamW. Muon orthogonalises
the momentum of each 2-D matrix (Newton-Schulz); vectors (norms) and the vocabulary matrices
(`lm_head`, `embed_tokens`: rows are tokens, not features) stay on AdamW, the usual Muon split.
Instantiated through `train.optimizer._target_` with named parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from eagle3.dtypes import cpu_has_native_bf16

#: Parameter names that stay on AdamW although they are matrices (rows are vocabulary entries).
ADAMW_NAME_HINTS = ("lm_head", "embed_tokens")
#: Quintic Newton-Schulz coefficients (the values torch.optim.Muon uses).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


#: A matrix at least this many times wider than tall (after transposing a tall one) iterates on its
#: Gram matrix (`_gram_newton_schulz`): ~1.65x fewer FLOPs for a draft MLP's hidden x 5.8 hidden, none
#: saved below ~1.7 (q_proj's 2:1 gains little, square ones cost more).
GRAM_MIN_ASPECT = 1.7
#: Gram-space iterations between two re-formings of the matrix and its Gram: the Gram product
#: squares the condition number, so in bfloat16 five iterations from one Gram blow small singular
#: values up to ~15 on a power-law spectrum; re-formed after three they stay as close to the exact
#: iteration as the direct one (tests/unit/draft/test_optim.py).
GRAM_RESTART_EVERY = 3


def orthogonalize(update: torch.Tensor, steps: int, eps: float = 1e-7,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximately U V^T of `update = U S V^T` (`[rows, cols]`), by Newton-Schulz iteration in `dtype`."""
    x = update.float()
    x = (x / x.norm().clamp(min=eps)).to(dtype)  # spectral norm <= 1
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # iterate on the wide side: [min, max]
    if x.shape[1] >= GRAM_MIN_ASPECT * x.shape[0]:
        x = _gram_newton_schulz(x, steps)
    else:
        x = _newton_schulz(x, steps)
    return (x.T if tall else x).to(update.dtype)


def _newton_schulz(x: torch.Tensor, steps: int) -> torch.Tensor:
    """X <- a X + (b A + c A^2) X with A = X X^T, on `x` [min, max]: 2 min^2 max + min^3 per step."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.T  # [min, min]
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def _gram_newton_schulz(x: torch.Tensor, steps: int) -> torch.Tensor:
    """The same iteration carried on [min, min] matrices: X_k = Q_k X_0, one [min, max] product per re-forming.

    With P = a I + b A + c A^2 (a polynomial in A, so symmetric and commuting with it), the step
    X' = P X gives A' = P A P = A P^2: the Gram and the accumulated Q evolve without touching X.
    """
    a, b, c = NS_COEFFICIENTS
    q: torch.Tensor | None = None
    gram = x @ x.T  # [min, min]
    for step in range(steps):
        if step and step % GRAM_RESTART_EVERY == 0:
            assert q is not None
            x, q = q @ x, None
            gram = x @ x.T
        poly = torch.add(b * gram, gram @ gram, alpha=c)
        poly.diagonal().add_(a)
        q = poly if q is None else poly @ q
        if step + 1 < steps and (step + 1) % GRAM_RESTART_EVERY:
            gram = gram @ (poly @ poly)
    return x if q is None else q @ x


def is_muon_param(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 2 and min(param.shape) > 1 and not any(h in name for h in ADAMW_NAME_HINTS)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on weight matrices, AdamW on vectors and vocabulary matrices.

    Args:
        params: `(name, tensor)` pairs (names decide the split; see `is_muon_param`).
        lr: AdamW learning rate; `muon_lr` (default: `lr`) is Muon's before its shape scaling.
        betas / eps / weight_decay: AdamW's. muon_momentum / muon_weight_decay / ns_steps: Muon's.
        Muon's update is scaled by `0.2 * sqrt(max(rows, cols))`, which gives it AdamW's
        update RMS, so one learning rate suits both groups.
        ns_dtype: Newton-Schulz precision: "auto" = bfloat16 on a GPU or a CPU with bf16 units (as
            torch.optim.Muon iterates; the iteration tolerates it and its matmuls were ~23 % of a
            SmolLM2-sized step in fp32), else float32; or "bfloat16" / "float32".
    """

    def __init__(self, params: Iterable[tuple[str, torch.Tensor]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 muon_lr: float | None = None, muon_momentum: float = 0.95, muon_weight_decay: float = 0.1,
                 ns_steps: int = 5, ns_dtype: str = "auto") -> None:
        muon: list[torch.Tensor] = []
        adamw: list[torch.Tensor] = []
        for item in params:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TypeError("MuonAdamW takes (name, parameter) pairs, e.g. module.named_parameters()")
            name, param = item
            (muon if is_muon_param(name, param) else adamw).append(param)
        groups = [{"params": muon, "muon": True, "lr": lr if muon_lr is None else muon_lr,
                   "momentum": muon_momentum, "weight_decay": muon_weight_decay},
                  {"params": adamw, "muon": False, "lr": lr, "weight_decay": weight_decay}]
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "momentum": muon_momentum, "ns_steps": ns_steps, "muon": False}
        super().__init__([g for g in groups if g["params"]], defaults)
        if ns_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"ns_dtype={ns_dtype!r}; valid: auto, bfloat16, float32")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["muon"]:
                    self._muon_update(p, group)
                else:
                    self._adamw_update(p, group)
        return loss

    def _muon_update(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
        grad = p.grad
        assert grad is not None  # step() updates only parameters that have a gradient
        buf.lerp_(grad, 1 - group["momentum"])
        update = orthogonalize(grad.lerp(buf, group["momentum"]), group["ns_steps"],  # Nesterov
                               dtype=self._ns_dtype(p))
        lr = group["lr"] * 0.2 * math.sqrt(max(p.shape))
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-lr)

    def _ns_dtype(self, p: torch.Tensor) -> torch.dtype:
        if self.ns_dtype == "auto":
            native = p.device.type == "cuda" or (p.device.type == "cpu" and cpu_has_native_bf16())
            return torch.bfloat16 if native else torch.float32
        return getattr(torch, self.ns_dtype)

    def _adamw_update(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = float(state["step"])
        p.mul_(1 - group["lr"] * group["weight_decay"])
        state["exp_avg"].lerp_(p.grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        denom = (state["exp_avg_sq"] / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
        p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** step))


__all__ = ["ADAMW_NAME_HINTS", "GRAM_MIN_ASPECT", "MuonAdamW", "is_muon_param", "orthogonalize"]
