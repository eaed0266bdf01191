"""The MLA draft layer's attention: DeepSeek's multi-head latent attention, as the engines serve it.

Kimi-K2.5's best public drafts use the target's own attention (vLLM's and SGLang's
`Eagle3DeepseekV2ForCausalLM`, docs/design.md 'Facts: vLLM'). Their layer computes, per token of
input x (`[.., 2H]` in the first layer, `[.., H]` after):

    q        = q_b_proj(q_a_layernorm(q_a_proj(x)))            # [.., heads, nope + rope]
    c, k_pe  = split(kv_a_proj_with_mqa(x), [kv_lora, rope])   # the latent and one shared rope key
    k_nope,v = split(kv_b_proj(kv_a_layernorm(c)), [nope, v])  # per head
    q_pe, k_pe rotated pairwise (GPT-J layout, vLLM's is_neox_style=False)
    out      = o_proj(softmax([q_nope|q_pe] . [k_nope|k_pe] / sqrt(nope + rope)) v)

Training expands the latent into per-head keys and values (the engines' prefill form), so the
training-time test runs through the same `attend` patterns as the Llama layer: keys `[B, heads, T,
nope + rope]`, values `[B, heads, T, v]`, linear memory in T (`eagle3.draft.attention`). Serving
engines absorb kv_b_proj into the queries instead (decode form); that is algebra on the same
weights, not another model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from eagle3.draft.attention import apply_rope_interleaved, rope_cos_sin_interleaved
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.norm import RMSNorm

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class MLADraftAttention(nn.Module):
    """Latent attention reading `in_features` (2H in the first layer, H after); the pattern is the caller's."""

    def __init__(self, g: DraftGeometry, in_features: int) -> None:
        super().__init__()
        self.heads, self.theta = g.num_attention_heads, g.rope_theta
        self.nope, self.rope, self.value = g.qk_nope_head_dim, g.qk_rope_head_dim, g.v_head_dim
        self.kv_lora = g.kv_lora_rank
        self.q_a_proj = nn.Linear(in_features, g.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(g.q_lora_rank, g.rms_norm_eps)
        self.q_b_proj = nn.Linear(g.q_lora_rank, self.heads * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(in_features, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, g.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.heads * (self.nope + self.value), bias=False)
        self.o_proj = nn.Linear(self.heads * self.value, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        bsz, seq, _ = x.shape  # x [B, T, in_features]; positions [T] or [B, T]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(bsz, seq, self.heads, self.nope + self.rope).transpose(1, 2)  # [B, n, T, nope + rope]
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)  # [B, T, c], [B, T, r]
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        kv = kv.view(bsz, seq, self.heads, self.nope + self.value).transpose(1, 2)  # [B, n, T, nope + v]
        k_nope, v = kv.split([self.nope, self.value], dim=-1)
        cos, sin = rope_cos_sin_interleaved(positions, self.rope, self.theta, x.dtype)  # [T, r] / [B, T, r]
        if positions.dim() == 2:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, r]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, apply_rope_interleaved(q_pe, cos, sin)], dim=-1)
        k_pe = apply_rope_interleaved(k_pe.unsqueeze(1), cos, sin)  # [B, 1, T, r]: one rope key for all heads
        k = torch.cat([k_nope, k_pe.expand(bsz, self.heads, seq, self.rope)], dim=-1)  # [B, n, T, nope + r]
        out = attend(q, k, v)  # [B, n, T, v]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.heads * self.value))
