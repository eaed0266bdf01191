"""Every tensor of a draft and its shape, and what the draft costs: torch-free, from the geometry alone.

The export checks files against `expected_shapes` (`eagle3.draft.export_format`), and `stage=plan`
counts a Kimi-sized draft's parameters and per-token FLOPs from it (`draft_cost`) without
allocating its 163840 x 7168 embedding or importing torch.
"""

from __future__ import annotations

from eagle3.draft.geometry import DraftGeometry

EMBED_KEY = "embed_tokens.weight"
#: Tensors that are not trained weights: the target's frozen embedding and the vocabulary maps.
_NOT_TRAINED = (EMBED_KEY, "d2t", "t2d")


def target_hidden(g: DraftGeometry) -> int:
    return g.fc_in_features // max(len(g.capture_layers), 1)


def expected_shapes(g: DraftGeometry) -> dict[str, tuple[int, ...]]:
    """Every tensor an export may hold and its shape; `embed_tokens.weight` is optional.

    Written out rather than read off `Eagle3Draft(g)`, so a Kimi-sized geometry is checked
    without allocating its 163840 x 7168 embedding, and so the model's names are pinned.
    """
    h = g.hidden_size
    shapes = {
        EMBED_KEY: (g.vocab_size, h),
        "fc.weight": (h, g.fc_in_features),  # [H, C * H_target]
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        **attention_shapes(g, "midlayer.", 2 * h),  # reads cat(embed, hidden) [.., 2H]
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (g.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (g.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, g.intermediate_size),
        "norm.weight": (h,),
        "lm_head.weight": (g.draft_vocab_size, h),
        "d2t": (g.draft_vocab_size,),  # offsets: target id = i + d2t[i]
        "t2d": (g.vocab_size,),  # bool: target id in the draft vocab
    }
    for i in range(1, g.num_layers):  # later layers: plain layers on the residual stream, attention reads H
        shapes.update({
            f"layers.{i}.input_layernorm.weight": (h,),
            **attention_shapes(g, f"layers.{i}.", h),
            f"layers.{i}.post_attention_layernorm.weight": (h,),
            f"layers.{i}.mlp.gate_proj.weight": (g.intermediate_size, h),
            f"layers.{i}.mlp.up_proj.weight": (g.intermediate_size, h),
            f"layers.{i}.mlp.down_proj.weight": (h, g.intermediate_size),
        })
    if g.norm_before_fc:
        shapes["input_norm.weight"] = (g.fc_in_features,)  # one norm over the C * H_target input
    if g.fc_norm:
        shapes.update({f"fc_norm.{i}.weight": (target_hidden(g),) for i in range(len(g.capture_layers))})
    return shapes


def attention_shapes(g: DraftGeometry, prefix: str, reads: int) -> dict[str, tuple[int, ...]]:
    """The attention tensors of one layer reading `reads` features (llama: q/k/v/o; mla: DeepSeek's names)."""
    a, h, heads = f"{prefix}self_attn.", g.hidden_size, g.num_attention_heads
    if g.is_mla:
        return {
            f"{a}q_a_proj.weight": (g.q_lora_rank, reads),
            f"{a}q_a_layernorm.weight": (g.q_lora_rank,),
            f"{a}q_b_proj.weight": (heads * g.qk_head_dim, g.q_lora_rank),
            f"{a}kv_a_proj_with_mqa.weight": (g.kv_lora_rank + g.qk_rope_head_dim, reads),
            f"{a}kv_a_layernorm.weight": (g.kv_lora_rank,),
            f"{a}kv_b_proj.weight": (heads * (g.qk_nope_head_dim + g.v_head_dim), g.kv_lora_rank),
            f"{a}o_proj.weight": (h, heads * g.v_head_dim),
        }
    q, kv = heads * g.head_dim, g.num_key_value_heads * g.head_dim
    return {f"{a}q_proj.weight": (q, reads), f"{a}k_proj.weight": (kv, reads), f"{a}v_proj.weight": (kv, reads),
            f"{a}o_proj.weight": (h, q)}


def draft_cost(g: DraftGeometry) -> dict[str, int]:
    """Trainable parameters and the FLOPs of one drafted token (a multiply-add = 2 FLOPs).

    `step_flops` is one draft step for one token: every layer's weights and the draft lm_head (the
    fc projection runs once per verified token, `fc_flops`). Attention over the context adds
    `attention_flops_per_context_token` per token already in the draft's KV cache: 2 x heads x (qk +
    v width) for llama and for MLA as trained (keys expanded per head); engines absorb MLA's
    kv_b_proj at decode, reading the kv_lora_rank + rope latent instead.
    """
    shapes = expected_shapes(g)
    trained = {k: v for k, v in shapes.items() if k not in _NOT_TRAINED}
    params = sum(_numel(v) for v in trained.values())
    matrices = {k: v for k, v in trained.items() if len(v) == 2}
    fc = 2 * _numel(matrices.pop("fc.weight"))
    step = 2 * sum(_numel(v) for v in matrices.values())
    if g.is_mla:
        per_context = 2 * g.num_attention_heads * (g.qk_head_dim + g.v_head_dim)
        absorbed = 2 * g.num_attention_heads * (2 * g.kv_lora_rank + g.qk_rope_head_dim)
    else:
        per_context = absorbed = 2 * g.num_attention_heads * 2 * g.head_dim
    return {"trainable_parameters": params, "step_flops": step, "fc_flops": fc,
            "attention_flops_per_context_token": per_context * g.num_layers,
            "absorbed_attention_flops_per_context_token": absorbed * g.num_layers}


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for size in shape:
        out *= size
    return out
