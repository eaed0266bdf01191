"""RMSNorm as transformers' Llama/DeepSeek and the engines compute it: normalise in float32, scale in x's dtype.

The scale is applied in x's dtype with the weight rounded to it, as a model held in that dtype
(transformers' bf16 checkpoints, vLLM and SGLang serving one) computes it. Under bf16 autocast the
layer's inputs are the bf16 outputs of its linears, so the norms hand bf16 on and the next linear
needs no cast: multiplying by the float32 weight instead promoted every norm output to float32,
and the casts back and forth (each linear's input forward, its gradient backward) were ~18 % of
the demo's training step on a CPU (BENCHMARKS.md, "Activations in the autocast dtype").
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        normed = x.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(dtype) * normed.to(dtype)
