"""The MLA draft layer (`model.draft.attention=mla`) against references: transformers' DeepSeek-V3
attention, the dense TTT mask, the token-by-token TTT loss, and decoding with a KV cache."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft.attention import DraftKVCache, TTTAttention, ttt_attention
from eagle3.draft.geometry import geometry_from_target
from eagle3.draft.mla import MLADraftAttention
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.ttt import ttt_forward
from tests.unit.draft.test_ttt import dense_ttt_attention, naive_ttt_loss, tiny_geometry

MLA = dict(attention="mla", num_key_value_heads=2, q_lora_rank=6, kv_lora_rank=10, qk_nope_head_dim=4,
           qk_rope_head_dim=6, v_head_dim=3)


def tiny_mla_draft(seed: int, num_layers: int) -> tuple[Eagle3Draft, torch.Tensor]:
    torch.manual_seed(seed)
    draft = Eagle3Draft(tiny_geometry(num_layers=num_layers, **MLA))
    selected = torch.tensor([0, 2, 3, 7, 11])
    t2d = torch.zeros(12, dtype=torch.bool)
    t2d[selected] = True
    head = torch.randn(12, 8)
    draft.init_from_target(torch.randn(12, 8), head, selected - torch.arange(5), t2d)
    return draft, head


def test_mla_attention_equals_transformers_deepseek_v3_attention():
    """Same weights, same tokens: the draft's MLA is DeepSeek-V3's (pairwise rope, the latent split,
    the shared rope key, 1/sqrt(nope + rope)), which is what vLLM and SGLang serve."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    cfg = DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12,
                           kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=6,
                           intermediate_size=64, num_hidden_layers=4, vocab_size=50, rope_interleave=True,
                           attention_bias=False)
    cfg._attn_implementation = "eager"
    g = geometry_from_target(cfg.to_dict(), [1, 2, 3], 20, {"attention": "mla"})
    assert (g.q_lora_rank, g.kv_lora_rank, g.qk_nope_head_dim, g.qk_rope_head_dim, g.v_head_dim) == (12, 16, 8, 8, 6)
    torch.manual_seed(0)
    ours = MLADraftAttention(g, g.hidden_size)
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.3)
    theirs = DeepseekV3Attention(cfg, layer_idx=0)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and not [m for m in missing if "bias" not in m]
    seq = 9
    x = torch.randn(2, seq, g.hidden_size)
    positions = torch.arange(3, 3 + seq)  # not from 0: the rope must follow the position ids
    cos, sin = DeepseekV3RotaryEmbedding(cfg)(x, positions[None].expand(2, -1))
    mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    ref = theirs(x, position_embeddings=(cos, sin), attention_mask=mask)[0]
    got = ours(x, positions, lambda q, k, v: DraftKVCache().attend(q, k, v))
    assert got.shape == ref.shape == (2, seq, g.hidden_size)
    assert torch.allclose(got, ref, atol=1e-5), (got - ref).abs().max()


def test_ttt_attention_with_values_narrower_than_keys_matches_dense_reference():
    torch.manual_seed(2)
    q = torch.randn(2, 3, 13, 10, requires_grad=True)
    keys = [torch.randn(2, 3, 13, 10, requires_grad=True) for _ in range(3)]
    values = [torch.randn(2, 3, 13, 4, requires_grad=True) for _ in range(3)]  # MLA: v_head_dim != nope + rope
    fast = ttt_attention(q, keys, values, block_size=4)
    ref = dense_ttt_attention(q, keys, values)
    assert fast.shape == (2, 3, 13, 4)
    assert torch.allclose(fast, ref, atol=1e-5)
    w = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((fast * w).sum(), [q, *keys, *values]),
                    torch.autograd.grad((ref * w).sum(), [q, *keys, *values]), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_mla_ttt_forward_matches_token_by_token_reference(num_layers):
    """TTT over the MLA keys (the expanded latent) in linear memory equals the dense reference, gradients too."""
    draft, head = tiny_mla_draft(3, num_layers)
    torch.manual_seed(1)
    seq = 11
    ids = torch.randint(0, 12, (1, seq))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]])
    aux = torch.randn(1, seq, 24)
    teacher = teacher_targets(torch.randn(1, seq, 8), head, draft.draft_ids())
    fast = ttt_forward(draft, aux, ids, mask, torch.tensor([seq]), teacher, steps=4, decay=0.8,
                       out_of_vocab="mask", block_size=3)
    ref = naive_ttt_loss(draft, aux, ids, mask, teacher, steps=4, decay=0.8)
    assert fast.loss.item() == pytest.approx(float(ref.detach()), abs=1e-5)
    weights = [draft.midlayer.self_attn.kv_b_proj.weight,
               *(layer.self_attn.q_a_proj.weight for layer in draft.layers.values())]
    for a, b in zip(torch.autograd.grad(fast.loss, weights),
                    torch.autograd.grad(naive_ttt_loss(draft, aux, ids, mask, teacher, 4, 0.8), weights), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
        assert a.abs().max() > 0


def test_mla_decoding_with_a_cache_equals_the_training_pattern():
    """A drafted token's state from the KV cache (how eval decodes) is the TTT step's state at that position."""
    draft, _ = tiny_mla_draft(5, 2)
    torch.manual_seed(4)
    seq = 7
    hidden, ids = torch.randn(1, seq, 8), torch.randint(0, 12, (1, seq))
    with torch.no_grad():
        ttt = TTTAttention(2, block_size=4)
        first = draft.step(hidden, ids, torch.arange(seq), ttt.attends)
        caches = [DraftKVCache() for _ in range(2)]
        prefill = draft.step(hidden, ids, torch.arange(seq), [c.attend for c in caches])
        assert torch.allclose(prefill, first, atol=1e-5)
        nxt = torch.randint(0, 12, (1, seq))
        second = draft.step(first, nxt, torch.arange(seq) + 1, ttt.attends)
        last = draft.step(first[:, -1:], nxt[:, -1:], torch.tensor([seq]), [c.attend for c in caches])
    assert torch.allclose(last[0, 0], second[0, -1], atol=1e-5)


def test_mla_draft_asked_of_a_target_without_mla_is_refused_naming_the_key():
    llama_target = {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 5, "vocab_size": 12}
    with pytest.raises(ValueError, match=r"^model\.draft\.attention: found 'mla' for a target without MLA geometry"):
        geometry_from_target(llama_target, [1, 2, 3], 5, {"attention": "mla"})
    with pytest.raises(ValueError, match=r"model\.draft\.attention: found 'gqa', valid: llama, mla"):
        geometry_from_target(llama_target, [1, 2, 3], 5, {"attention": "gqa"})
    g = geometry_from_target(llama_target, [1, 2, 3], 5, {"attention": "mla", **{k: v for k, v in MLA.items()
                                                                                  if k != "attention"}})
    assert g.is_mla and g.num_key_value_heads == g.num_attention_heads  # kv_b_proj: keys per head


# ------------------------------------------------------------------------------------------
# Export: what vLLM's deepseek_eagle3.py and SGLang's kimi_k25_eagle3.py load


def _mla_export(tmp_path, engine: str, num_layers: int = 1):
    from eagle3.draft.export import export_draft

    draft, _ = tiny_mla_draft(7, num_layers)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.normal_(0, 0.2)
    return draft, export_draft(draft, tmp_path / engine, engine)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_mla_export_names_the_deepseek_eagle3_class_with_the_fields_and_tensors_the_engines_read(tmp_path, engine):
    import json

    from safetensors import safe_open

    from eagle3.draft.export import load_exported, validate_export

    draft, out = _mla_export(tmp_path, engine)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert cfg["model_type"] == "deepseek_v2"  # deepseek_v3 would be vLLM's MTP draft, which it refuses
    mla = {k: cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    assert mla == {"q_lora_rank": 6, "kv_lora_rank": 10, "qk_nope_head_dim": 4, "qk_rope_head_dim": 6, "v_head_dim": 3}
    assert cfg["num_attention_heads"] == cfg["num_key_value_heads"] == 2 and "head_dim" not in cfg
    assert (cfg["target_hidden_size"], cfg["draft_vocab_size"], cfg["num_hidden_layers"]) == (8, 5, 1)
    if engine == "vllm":
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["num_aux_hidden_states"] == 3
    else:
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    attn = {n.removeprefix("midlayer.self_attn.") for n in names if n.startswith("midlayer.self_attn.")}
    assert attn == {f"{m}.weight" for m in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                                            "kv_a_layernorm", "kv_b_proj", "o_proj")}
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # q_a and kv_a read cat(embed, hidden): 2H
        assert f.get_slice("midlayer.self_attn.q_a_proj.weight").get_shape() == [6, 16]
        assert f.get_slice("midlayer.self_attn.kv_a_proj_with_mqa.weight").get_shape() == [16, 16]
    assert not any(n.startswith("model.") for n in names)  # both engines add the prefix themselves
    assert validate_export(out, engine).geometry == draft.geometry
    g, _, loaded = load_exported(out)
    assert g.is_mla and type(loaded.midlayer.self_attn).__name__ == "MLADraftAttention"


def test_transformers_parses_the_mla_export_as_deepseek_v2_keeping_every_field(tmp_path):
    """vLLM and SGLang read the draft config through transformers' DeepseekV2Config."""
    from transformers import AutoConfig

    _, out = _mla_export(tmp_path, "vllm")
    cfg = AutoConfig.from_pretrained(out)
    assert type(cfg).__name__ == "DeepseekV2Config" and cfg.architectures == ["Eagle3DeepseekV2ForCausalLM"]
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) == (
        6, 10, 4, 6, 3)
    assert cfg.eagle_aux_hidden_state_layer_ids == [1, 2, 3] and cfg.target_hidden_size == 8
    assert cfg.draft_vocab_size == 5 and cfg.intermediate_size == 16


def test_mla_norm_before_fc_is_refused_for_every_engine(tmp_path):
    from eagle3.draft.export import ExportError, export_draft

    torch.manual_seed(0)
    draft = Eagle3Draft(tiny_geometry(norm_before_fc=True, **MLA))
    for engine in ("vllm", "sglang"):
        with pytest.raises(ExportError, match=r"eagle3\.geometry\.norm_before_fc: found true with attention mla"):
            export_draft(draft, tmp_path / engine, engine)


def test_config_validation_refuses_an_mla_draft_for_a_target_without_mla_in_one_line():
    from eagle3.cli import check_config
    from tests.conftest import compose_config

    errors = check_config(compose_config(["model=demo", "model.draft.attention=mla"]))
    assert [e for e in errors if e.startswith("model.draft.attention")] == [
        f"model.draft.attention: 'mla' -- the target {compose_config([]).model.path} has no MLA geometry (its "
        "config.json lacks q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim); valid: "
        "llama, or mla with model.draft.{q_lora_rank,kv_lora_rank,qk_nope_head_dim,qk_rope_head_dim,v_head_dim} set"]
    assert [e for e in check_config(compose_config(["model=demo", "model.draft.attention=gqa"]))
            if e.startswith("model.draft.attention")] == ["model.draft.attention: 'gqa' -- not a known choice; valid: "
                                                           "llama, mla"]
    assert check_config(compose_config(["model=demo_kimi", "model.draft.attention=mla"])) == []
