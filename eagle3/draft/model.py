"""The EAGLE-3 draft network: fc fusion, decoder layers over [embed; hidden], draft lm_head.

Parameter names are the serving engines' (docs/design.md, 'Facts: SGLang', draft checkpoint):
`fc`, `midlayer.*`, `layers.<i>.*` (i >= 1), `norm`, `lm_head`, `d2t`, `t2d`, `embed_tokens`, so
export is a rename-free copy (vLLM renames `midlayer.` to `layers.0.`). The layers follow the
engines' forward exactly, because a draft trained on a different residual convention loads
without error and then accepts nothing:

    hidden = fc(aux)                                                    # step 0 only
    residual = hidden
    x = cat(input_layernorm(embed(token)), hidden_norm(hidden))        # [.., 2H]   midlayer
    h = o_proj(attn(q/k/v_proj(x))) + residual
    out = mlp(post_attention_layernorm(h)) + h
    for layer i = 1 .. num_layers-1:                                    # vLLM's llama_eagle3
        h = o_proj(attn(q/k/v_proj(input_layernorm(out)))) + out       # q/k/v read H, not 2H
        out = mlp(post_attention_layernorm(h)) + h
    logits = lm_head(norm(out))                                         # out: next step's hidden

`model.draft.attention=mla` swaps q/k/v_proj for DeepSeek's latent attention at the target's MLA
geometry (`eagle3.draft.mla`, vLLM's and SGLang's `Eagle3DeepseekV2ForCausalLM`); the rest of the
layer is unchanged.

Only the first layer sees the token embedding; the later ones are plain Llama layers on the
residual stream, each with its own attention (its own keys in training-time test and its own
KV cache when decoding), which is what vLLM 0.32's `llama_eagle3.py` builds for
`num_hidden_layers > 1`. SGLang builds one layer only (`eagle3.draft.geometry` refuses more).

The layer variants vLLM also serves (`DraftGeometry` flags, `eagle3.draft.options`) change
three lines: `norm_before_fc` / `fc_norm` normalise aux (whole, or per captured layer) before
fc; `norm_before_residual` makes the residual `hidden_norm(hidden)`; `norm_output` feeds
`norm(out)` to the next step instead of `out` (`Eagle3Draft.carry`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from eagle3.draft.attention import apply_rope, rope_cos_sin
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.mla import MLADraftAttention
from eagle3.draft.norm import RMSNorm
from eagle3.draft.options import ATTENTION_LLAMA, ATTENTION_MLA

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DraftAttention(nn.Module):
    """q/k/v read `in_features` (2H in the first layer, H after); the pattern is the caller's."""

    def __init__(self, g: DraftGeometry, in_features: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = g.num_attention_heads, g.num_key_value_heads, g.head_dim
        self.theta = g.rope_theta
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        bsz, seq, _ = x.shape  # x [B, T, in_features]; positions [T] or [B, T]
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, x.dtype)  # [T, D] / [B, T, D]
        if positions.dim() == 2:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, D]
        q = self.q_proj(x).view(bsz, seq, self.heads, self.head_dim).transpose(1, 2)  # [B, Hq, T, D]
        k = self.k_proj(x).view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(x).view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, k, v)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.heads * self.head_dim))


#: The attention module of each `model.draft.attention` choice (eagle3.draft.options.ATTENTIONS).
ATTENTION_MODULES: dict[str, type[nn.Module]] = {ATTENTION_LLAMA: DraftAttention, ATTENTION_MLA: MLADraftAttention}


class DraftMLP(nn.Module):
    def __init__(self, g: DraftGeometry) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftDecoderLayer(nn.Module):
    """The first layer (`midlayer`): attention over cat(embedding, hidden)."""

    def __init__(self, g: DraftGeometry) -> None:
        super().__init__()
        self.norm_before_residual = g.norm_before_residual
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.hidden_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.self_attn = ATTENTION_MODULES[g.attention](g, 2 * g.hidden_size)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = DraftMLP(g)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        h = self.self_attn(x, positions, attend) + residual
        return self.mlp(self.post_attention_layernorm(h)) + h


class DraftStackLayer(nn.Module):
    """A later layer (`layers.<i>`, i >= 1): a plain pre-norm Llama layer on the residual stream."""

    def __init__(self, g: DraftGeometry) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.self_attn = ATTENTION_MODULES[g.attention](g, g.hidden_size)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = DraftMLP(g)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), positions, attend) + x  # x [B, T, H]
        return self.mlp(self.post_attention_layernorm(h)) + h


class Eagle3Draft(nn.Module):
    """The draft model. `embed_tokens` is the target's, frozen; `d2t`/`t2d` map vocabularies.

    `d2t[i]` is an offset: draft id i predicts target id `i + d2t[i]`; `t2d[j]` says whether
    target id j is in the draft vocab.
    """

    d2t: torch.Tensor  # buffers (register_buffer), declared for the type checker
    t2d: torch.Tensor

    def __init__(self, g: DraftGeometry) -> None:
        super().__init__()
        self.geometry = g
        self.embed_tokens = nn.Embedding(g.vocab_size, g.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(g.fc_in_features, g.hidden_size, bias=False)
        captures = max(len(g.capture_layers), 1)
        self.input_norm = RMSNorm(g.fc_in_features, g.rms_norm_eps) if g.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(g.fc_in_features // captures, g.rms_norm_eps)
                                     for _ in range(captures)) if g.fc_norm else None
        self.midlayer = DraftDecoderLayer(g)
        # Keyed "1", "2", ...: the state dict says `layers.1.*`, the name vLLM loads layer 1 from.
        self.layers = nn.ModuleDict({str(i): DraftStackLayer(g) for i in range(1, g.num_layers)})
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.lm_head = nn.Linear(g.hidden_size, g.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(g.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(g.vocab_size, dtype=torch.bool))

    @torch.no_grad()
    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor,
                         t2d: torch.Tensor) -> None:
        """Copy the target's embedding and the draft-vocab rows of its lm_head; set the maps.

        Args:
            embed: Target input embedding `[V, H_target]`.
            lm_head: Target output head `[V, H_target]`.
            d2t: `[draft_vocab]` offsets; t2d: `[V]` bool.
        """
        g = self.geometry
        if embed.shape != (g.vocab_size, g.hidden_size):
            raise ValueError(f"target embedding {tuple(embed.shape)} does not match the draft geometry "
                             f"(vocab {g.vocab_size}, hidden {g.hidden_size})")
        if d2t.shape != (g.draft_vocab_size,) or t2d.shape != (g.vocab_size,):
            raise ValueError(f"d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not match draft vocab "
                             f"{g.draft_vocab_size} / target vocab {g.vocab_size}")
        self.embed_tokens.weight.copy_(embed)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        if lm_head.shape[1] == g.hidden_size:
            self.lm_head.weight.copy_(lm_head[self.draft_ids()])

    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id, `[draft_vocab]`."""
        return torch.arange(self.geometry.draft_vocab_size, device=self.d2t.device) + self.d2t

    def step(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
             attends: Sequence[Attend]) -> torch.Tensor:
        """One draft step: hidden `[B, T, H]` (fc output or previous step), ids `[B, T]` -> `[B, T, H]`.

        `attends` holds one attention pattern per layer (`geometry.num_layers`, layer order): each
        layer attends over its own keys.
        """
        if len(attends) != self.geometry.num_layers:
            raise ValueError(f"{len(attends)} attention patterns for a {self.geometry.num_layers}-layer draft")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        out = self.midlayer(embeds, hidden, positions, attends[0])
        for layer, attend in zip(self.layers.values(), attends[1:], strict=True):
            out = layer(out, positions, attend)
        return out

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits `[..., draft_vocab]` of step output states `[..., H]`."""
        return self.lm_head(self.norm(state))

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """Fuse the captured target states `[..., C*H_t]` into the draft's hidden `[..., H]`."""
        aux = aux.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)  # C x [..., H_t]
            aux = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    def carry(self, state: torch.Tensor) -> torch.Tensor:
        """What the next draft step reads of this step's output `[..., H]` (`norm_output`: normed)."""
        return self.norm(state) if self.geometry.norm_output else state

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def greedy_draft_token(model: Eagle3Draft, state: torch.Tensor) -> torch.Tensor:
    """Target ids of the draft's argmax for states `[..., H]`."""
    return model.draft_ids()[model.logits(state).argmax(-1)]


__all__ = ["Eagle3Draft", "RMSNorm", "count_trainable", "greedy_draft_token"]
