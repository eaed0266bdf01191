"""Attention of the draft: the training-time-test pattern in linear memory, and a KV cache.

Training-time test (docs/design.md, 'Training-time test'): at step k the query of position t
attends to the step-0 keys of positions <= t (causal) and to the keys that steps 1..k produced at the same
position t. Written as one mask this is an L x (k+1)L matrix; here the causal part is computed
one query block at a time and the diagonal part as per-position dot products, both inside one
softmax, and every block is recomputed in backward (activation checkpointing), so neither
forward nor backward ever holds more than `block_size x L` scores per head.

Packed rows (`train.packing`, `eagle3.draft.packing`) hold several samples: there the causal part
also requires the key to lie in the query's own sample (at or after its start), and a block reads
no key before the earliest sample start among its queries, so its scores are `block_size x
(block_size + the longest sample)`: compute and memory follow the samples' lengths, not the row's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer positions `[...]` -> cos, sin `[..., head_dim]` (Llama layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = torch.cat([angles, angles], dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, heads, T, D]`, cos/sin `[T, D]` or `[B, 1, T, D]`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rope_cos_sin_interleaved(positions: torch.Tensor, rope_dim: int, theta: float,
                             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for the pairwise (GPT-J) layout DeepSeek's MLA uses -> cos, sin `[..., rope_dim]`.

    Dims 2i and 2i+1 form one rotating pair at frequency i (vLLM's `is_neox_style=False`,
    transformers' `rope_interleave`), where the Llama layout pairs i with i + D/2. The two give the
    same scores only after a fixed permutation of the weights, so a draft trained on one and
    served with the other accepts nothing.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, device=positions.device, dtype=torch.float32) / rope_dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = angles.repeat_interleave(2, dim=-1)  # [..., D]: f0 f0 f1 f1 ...
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, heads, T, D]` rotated pairwise: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., D/2, 2]
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # [..., D]
    return x * cos + rotated * sin


def _block_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor,
                     start: int, scale: float, starts: torch.Tensor | None = None) -> torch.Tensor:
    """One query block against its causal prefix and its own diagonal keys.

    Shapes (G = query heads per kv head, b = block length, e = start + b - first key, S = diagonal
    steps, Dv = value width, D for llama, MLA's v_head_dim): q `[B, Hkv, G, b, D]`, k0 `[B, Hkv, 1, e, D]`,
    v0 `[B, Hkv, 1, e, Dv]`, kd `[B, Hkv, 1, b, S, D]`, vd `[B, Hkv, 1, b, S, Dv]`.
    Packed rows: `starts` `[B, b]` is where each query's sample starts, counted from the block's
    first key (the prefix need not start at 0); a query then sees the keys of its own sample only.
    The mask is built here, so backward recomputes it instead of keeping `b x e` per block.
    """
    b, e = q.shape[-2], k0.shape[-2]
    causal = (q.new_ones(b, e, dtype=torch.bool)).tril(diagonal=start)  # query i sees keys <= start + i
    if starts is not None:  # and keys >= the start of its sample
        causal = causal & (torch.arange(e, device=q.device) >= starts.unsqueeze(-1))[:, None, None]  # [B,1,1,b,e]
    s0 = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [B, Hkv, G, b, e]
    s0 = s0.masked_fill(~causal, float("-inf"))
    sd = (q.unsqueeze(-2) * kd).sum(-1) * scale  # [B, Hkv, G, b, S]
    # In q's dtype: torch's bf16 softmax accumulates in float32 (CPU and CUDA), and casting the scores to
    # float32 and back cost two passes over them in forward, recompute and backward.
    probs = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
    out = torch.matmul(probs[..., :e], v0)  # [B, Hkv, G, b, Dv]
    return out + (probs[..., e:].unsqueeze(-1) * vd).sum(-2)


def ttt_attention(q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                  block_size: int, starts: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of step k = len(keys) - 1 of the training-time test.

    Args:
        q: Queries of step k, `[B, Hq, T, D]`, rope already applied.
        keys / values: Per step 0..k, `[B, Hkv, T, D]` / `[B, Hkv, T, Dv]` each (rope applied to keys;
            Dv differs from D in MLA).
        block_size: Query rows per block; peak score memory is `B * Hq * block_size * T`.
        starts: Packed rows: `[B, T]` row index of the first token of each position's sample; a
            query attends to the step-0 keys of its own sample only. None: one sample per row.

    Returns:
        `[B, Hq, T, Dv]`.
    """
    bsz, hq, seq, dim = q.shape
    hkv, value_dim = keys[0].shape[1], values[0].shape[-1]
    groups = hq // hkv
    scale = 1.0 / math.sqrt(dim)
    qg = q.view(bsz, hkv, groups, seq, dim)
    k0, v0 = keys[0].unsqueeze(2), values[0].unsqueeze(2)  # [B, Hkv, 1, T, D]
    if len(keys) > 1:
        kd = torch.stack(list(keys[1:]), dim=-2).unsqueeze(2)  # [B, Hkv, 1, T, S, D]
        vd = torch.stack(list(values[1:]), dim=-2).unsqueeze(2)
    else:
        kd = q.new_zeros(bsz, hkv, 1, seq, 0, dim)
        vd = q.new_zeros(bsz, hkv, 1, seq, 0, value_dim)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, *keys, *values))
    blocks = range(0, seq, block_size)
    if starts is not None:  # each block's first key: the earliest sample start among its queries
        firsts = starts[:, ::block_size].amin(0).tolist()  # a row's starts never decrease
    outs = []
    for number, start in enumerate(blocks):
        end = min(seq, start + block_size)
        first = firsts[number] if starts is not None else 0
        own = starts[:, start:end] - first if starts is not None else None  # [B, b]
        args = (qg[..., start:end, :], k0[..., first:end, :], v0[..., first:end, :], kd[..., start:end, :, :],
                vd[..., start:end, :, :], start - first, scale, own)
        outs.append(checkpoint(_block_attention, *args, use_reentrant=False) if grad else _block_attention(*args))
    return torch.cat(outs, dim=-2).view(bsz, hq, seq, value_dim)


class TTTAttention:
    """The attention patterns of one TTT unroll: per draft layer, the keys/values of steps 0..k.

    `attends[i]` is layer i's pattern for `Eagle3Draft.step`: it appends the step's keys to that
    layer's list and attends over them (`ttt_attention`, with the packed rows' sample `starts`), so
    every layer sees only its own keys.
    """

    def __init__(self, num_layers: int, block_size: int, starts: torch.Tensor | None = None) -> None:
        self.block_size, self.starts = block_size, starts
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.values: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.attends = [partial(self._attend, layer) for layer in range(num_layers)]

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys[layer].append(k)
        self.values[layer].append(v)
        return ttt_attention(q, self.keys[layer], self.values[layer], self.block_size, self.starts)


class DraftKVCache:
    """Keys/values of one draft layer's attention for decoding, `[B, Hkv, len, D]`.

    Speculative decoding appends drafted positions and rolls them back after verification
    (`crop`), exactly like the target's cache.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def crop(self, length: int) -> None:
        if self.keys is not None and self.values is not None:  # both are set together (attend)
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append `k`, `v` (`[B, Hkv, n, D]`) and attend causally from the n new queries `[B, Hq, n, D]`."""
        past = len(self)
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=-2)
        n, total = q.shape[-2], self.keys.shape[-2]
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=past)
        groups = q.shape[1] // k.shape[1]
        keys = self.keys.repeat_interleave(groups, dim=1) if groups > 1 else self.keys
        values = self.values.repeat_interleave(groups, dim=1) if groups > 1 else self.values
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
