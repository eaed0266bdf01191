"""Encoding one sample's hidden states into a storage format and back (`eagle3.states.formats`).

fp8 is float8_e4m3fn with one float32 scale per token and per H-wide block; bf16 and fp32 are
casts; compact is int8 with one bf16 scale per group of values, and the teacher as the top k of
the target's log-probabilities. Every encode also measures its own loss of precision, which the
store keeps in its index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3.states.formats import COMPACT_GROUP, COMPACT_TOPK, check_format

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
IDS_DTYPE = torch.int32
INT8_MAX = 127.0
SCALE_DTYPE = torch.bfloat16  # compact's group scales: range matters (outlier channels), not digits
TEACHER_IDS_DTYPE = torch.int32
LOGPROB_DTYPE = torch.float16
#: Full-vocab logit rows worked on at once when taking the teacher's top k (4096 x 163840 x 4 B = 2.5 GiB).
TEACHER_CHUNK_TOKENS = 1024
_STORED = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Encoded:
    """One sample ready for a shard: tensor suffix -> tensor, and its measured error.

    `rel_err_max` / `rel_err_sum` are per-token relative L2 errors ||x - x'|| / ||x|| of the
    stored values against the computed ones, for `aux` and `final` (sum over tokens, for means).
    In `compact` the second is the teacher's probability mass outside the stored top k.
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


def quantize_int8_groups(x: torch.Tensor, group: int = COMPACT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group absmax int8 quantisation.

    Args:
        x: `[T, D]`; D need not be a multiple of `group` (the last group is shorter).
        group: Values sharing one scale.

    Returns:
        (`q [T, D]` int8, `scale [T, ceil(D / group)]` bfloat16) with x ~= q * scale.
    """
    t, d = x.shape
    groups = -(-d // group)
    xg = torch.nn.functional.pad(x.float(), (0, groups * group - d)).reshape(t, groups, group)  # [T, G, group]
    amax = xg.abs().amax(dim=-1)  # [T, G]
    # The scale is rounded to its stored dtype *before* quantising, so q * scale is the decode exactly.
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).to(SCALE_DTYPE)  # [T, G]
    q = torch.round(xg / scale.float()[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)  # [T, G, group]
    return q.reshape(t, groups * group)[:, :d].contiguous(), scale


def dequantize_int8_groups(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
                           group: int = COMPACT_GROUP) -> torch.Tensor:
    """Inverse of :func:`quantize_int8_groups`: `[T, D]` int8 and `[T, G]` scales -> `[T, D]` float."""
    t, d = q.shape
    groups = scale.shape[-1]
    if groups != -(-d // group):
        raise ValueError(f"{groups} scales for {d} values do not match groups of {group}")
    qg = torch.nn.functional.pad(q.float(), (0, groups * group - d)).reshape(t, groups, group)  # [T, G, group]
    return (qg * scale.float()[..., None]).reshape(t, groups * group)[:, :d].to(dtype)


@torch.no_grad()
def teacher_topk(final: torch.Tensor, head: torch.Tensor, k: int = COMPACT_TOPK,
                 chunk_tokens: int = TEACHER_CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's k most likely next tokens at each position, as the trainer's teacher reads them.

    The logits are `final @ head.T` in float32, as `eagle3.draft.teacher.teacher_targets` computes
    them from a stored final state, so a compact store's teacher is that teacher cut to its top k.

    Args:
        final: `[T, H]` final normed hidden states. head: `[V, H]` target lm_head.

    Returns:
        (`ids [T, min(k, V)]` int32, most likely first; `logprob [T, min(k, V)]` float16,
        log-softmax over the full vocab).
    """
    k = min(k, head.shape[0])
    head32 = head.float()
    ids, logprobs = [], []
    for start in range(0, final.shape[0], chunk_tokens):
        logp = torch.log_softmax(final[start:start + chunk_tokens].float() @ head32.T, dim=-1)  # [n, V]
        top = logp.topk(k, dim=-1)  # sorted, most likely first
        ids.append(top.indices.to(TEACHER_IDS_DTYPE))
        logprobs.append(top.values.to(LOGPROB_DTYPE))
    if not ids:
        return final.new_zeros(0, k, dtype=TEACHER_IDS_DTYPE), final.new_zeros(0, k, dtype=LOGPROB_DTYPE)
    return torch.cat(ids), torch.cat(logprobs)


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


def encode(aux: torch.Tensor, final: torch.Tensor, input_ids: torch.Tensor, fmt: str,
           head: torch.Tensor | None = None) -> Encoded:
    """Encode one sample's computed states (any float dtype) for `fmt`.

    Args:
        aux: `[T, C*H]` captured layers, concatenated in capture order.
        final: `[T, H]` final normed hidden state.
        input_ids: `[T]` token ids the states were computed from.
        fmt: One of FORMATS.
        head: `[V, H]` target lm_head; `compact` only (its teacher is the top k of final @ head.T).

    Returns:
        Fresh tensors (never views of the batch: safetensors refuses shared storage).
    """
    check_format(fmt)
    hidden = final.shape[-1]
    ids = input_ids.to(IDS_DTYPE, copy=True)
    if fmt == "compact":
        if head is None:
            raise ValueError("the compact storage format needs the target lm_head to store the teacher's top k")
        qa, sa = quantize_int8_groups(aux)
        top_ids, top_logp = teacher_topk(final, head)
        tail = (1.0 - top_logp.float().exp().sum(-1)).clamp_min(0.0)  # [T] teacher mass left out
        tensors = {"aux": qa, "aux_scale": sa, "teacher_ids": top_ids, "teacher_logprob": top_logp, "ids": ids}
        ea = _err_stats(_rel_err(aux, dequantize_int8_groups(qa, sa), hidden))
        ef = (float(tail.max()), float(tail.sum())) if tail.numel() else (0.0, 0.0)
        return Encoded(tensors=tensors, rel_err_max=(ea[0], ef[0]), rel_err_sum=(ea[1], ef[1]))
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


def decode_item(tensors: dict[str, torch.Tensor], fmt: str,
                dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Stored tensors -> what training reads: `aux [T, C*H]`, `input_ids [T]` int64, and the teacher:
    `final [T, H]`, or in `compact` `teacher_ids [T, k]` int64 and `teacher_logprob [T, k]` float32.

    Args:
        dtype: Float dtype of the states; None keeps the stored one (fp8 and compact become float32).
    """
    if check_format(fmt) == "compact":
        return {"aux": dequantize_int8_groups(tensors["aux"], tensors["aux_scale"], dtype or torch.float32),
                "input_ids": tensors["ids"].long(), "teacher_ids": tensors["teacher_ids"].long(),
                "teacher_logprob": tensors["teacher_logprob"].float()}
    aux, final, ids = decode(tensors, fmt, dtype)
    return {"aux": aux, "final": final, "input_ids": ids}


def decode(tensors: dict[str, torch.Tensor], fmt: str,
           dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stored tensors -> (`aux [T, C*H]`, `final [T, H]`, `input_ids [T]` int64).

    Args:
        dtype: Float dtype of the result; None keeps the stored one (fp8 becomes float32).

    Raises:
        ValueError: `compact`, which keeps no final state (read it with :func:`decode_item`).
    """
    if check_format(fmt) == "compact":
        raise ValueError("a compact store keeps the teacher's top k, not the final state; read it with decode_item")
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
