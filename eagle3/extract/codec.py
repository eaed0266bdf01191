"""Encoding one sample's hidden states into a storage format and back (`eagle3.extract.formats`).

fp8 is float8_e4m3fn with one float32 scale per token and per H-wide block; bf16 and fp32 are
casts. Every encode also measures its own relative error, which the store keeps in its index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.extract.formats import check_format

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
IDS_DTYPE = torch.int32
_STORED = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Encoded:
    """One sample ready for a shard: tensor suffix -> tensor, and its measured error.

    `rel_err_max` / `rel_err_sum` are per-token relative L2 errors ||x - x'|| / ||x|| of the
    stored values against the computed ones, for `aux` and `final` (sum over tokens, for means).
    """

    tensors: dict[str, torch.Tensor]
    rel_err_max: tuple[float, float]
    rel_err_sum: tuple[float, float]


def quantize_fp8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-block float8_e4m3fn quantisation.

    Args:
        x: `[T, D]` with D a multiple of `block`.
        block: Values sharing one scale (the hidden size: one scale per layer block).

    Returns:
        (`q [T, D]` float8_e4m3fn, `scale [T, D // block]` float32) with x ~= q * scale.
    """
    t, d = x.shape
    xb = x.float().reshape(t, d // block, block)  # [T, nb, block]
    amax = xb.abs().amax(dim=-1)  # [T, nb]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # [T, nb]
    # Clamp: amax/scale can round a hair above 448, which float8_e4m3fn cannot hold.
    q = (xb / scale[..., None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [T, nb, block]
    return q.reshape(t, d), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`: `[T, D]` fp8 and `[T, nb]` scales -> `[T, D]` float."""
    t, d = q.shape
    nb = scale.shape[-1]
    x = q.float().reshape(t, nb, d // nb) * scale.float()[..., None]  # [T, nb, block]
    return x.reshape(t, d).to(dtype)


def _rel_err(x: torch.Tensor, y: torch.Tensor, block: int) -> torch.Tensor:
    """Per-token, per-block relative L2 error `[T, nb]` of y against x (0 where x is 0)."""
    t, d = x.shape
    xb = x.float().reshape(t, d // block, block)
    yb = y.float().reshape(t, d // block, block)
    num = (xb - yb).norm(dim=-1)  # [T, nb]
    den = xb.norm(dim=-1)  # [T, nb]
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float32).tiny), num)


def _err_stats(err: torch.Tensor) -> tuple[float, float]:
    per_token = err.amax(dim=-1) if err.numel() else err.new_zeros(0)  # worst block per token [T]
    if per_token.numel() == 0:
        return 0.0, 0.0
    return float(per_token.max()), float(per_token.sum())


def encode(aux: torch.Tensor, final: torch.Tensor, input_ids: torch.Tensor, fmt: str) -> Encoded:
    """Encode one sample's computed states (any float dtype) for `fmt`.

    Args:
        aux: `[T, C*H]` captured layers, concatenated in capture order.
        final: `[T, H]` final normed hidden state.
        input_ids: `[T]` token ids the states were computed from.
        fmt: One of FORMATS.

    Returns:
        Fresh tensors (never views of the batch: safetensors refuses shared storage).
    """
    check_format(fmt)
    hidden = final.shape[-1]
    ids = input_ids.to(IDS_DTYPE, copy=True)
    if fmt == "fp8":
        qa, sa = quantize_fp8(aux, hidden)
        qf, sf = quantize_fp8(final, hidden)
        tensors = {"aux": qa, "aux_scale": sa, "final": qf, "final_scale": sf, "ids": ids}
        ra, rf = dequantize_fp8(qa, sa), dequantize_fp8(qf, sf)
    else:
        dtype = _STORED[fmt]
        sa, sf = aux.to(dtype, copy=True), final.to(dtype, copy=True)
        tensors = {"aux": sa, "final": sf, "ids": ids}
        ra, rf = sa, sf
    ea, ef = _err_stats(_rel_err(aux, ra, hidden)), _err_stats(_rel_err(final, rf, hidden))
    return Encoded(tensors=tensors, rel_err_max=(ea[0], ef[0]), rel_err_sum=(ea[1], ef[1]))


def decode(tensors: dict[str, torch.Tensor], fmt: str,
           dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stored tensors -> (`aux [T, C*H]`, `final [T, H]`, `input_ids [T]` int64).

    Args:
        dtype: Float dtype of the result; None keeps the stored one (fp8 becomes float32).
    """
    check_format(fmt)
    ids = tensors["ids"].long()
    if fmt == "fp8":
        out = dtype or torch.float32
        aux = dequantize_fp8(tensors["aux"], tensors["aux_scale"], out)
        final = dequantize_fp8(tensors["final"], tensors["final_scale"], out)
    else:
        aux, final = tensors["aux"], tensors["final"]
        if dtype is not None:
            aux, final = aux.to(dtype), final.to(dtype)
    return aux, final, ids
