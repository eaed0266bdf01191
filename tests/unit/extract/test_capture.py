"""The capture convention: hooked states equal transformers' `output_hidden_states[i]` bit for bit
(demo target, a DeepSeek-V3-style MoE/MLA miniature of Kimi, a Kimi-like multimodal wrapper),
the decoder is found generically, and batches are planned within the token budget."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import nn

import eagle3
from eagle3.extract.capture import LayerCapture, capture_samples, pad_batch, plan_batches
from eagle3.target.decoder import find_decoder, load_target
from eagle3.target_info import FULL_HASH_LIMIT, target_identity

DEMO_TARGET = Path(eagle3.__file__).parent / "assets" / "demo_target"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # 2 shared cores: 2 OpenMP threads mostly wait on each other


def tiny_llama(layers=6, hidden=64, vocab=512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256)).eval()


def tiny_deepseek_v3():
    """Kimi-K2.5's text architecture in miniature: MLA attention, layer 0 dense, then MoE layers."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                              num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4,
                              n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                              first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=16,
                              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                              max_position_embeddings=256)
    model = DeepseekV3ForCausalLM(config).eval()
    for module in model.modules():  # random router biases, so routing differs between tokens
        if hasattr(module, "e_score_correction_bias"):
            module.e_score_correction_bias.data.normal_()
    return model


def sequences(vocab, lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def assert_convention(model, parts, capture, seqs):
    """Padded batch and each sample alone: hooks == output_hidden_states, bit for bit."""
    with LayerCapture(parts, capture) as cap:
        batched = capture_samples(cap, seqs)
        alone = [capture_samples(cap, [seq])[0] for seq in seqs]
    ids, mask = pad_batch(seqs)
    with torch.no_grad():
        hs_batch = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for row, seq in enumerate(seqs):
        n = len(seq)
        with torch.no_grad():
            hs_alone = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
        for (aux, final), hs, r in ((batched[row], hs_batch, row), (alone[row], hs_alone, 0)):
            assert aux.shape == (n, len(capture) * parts.hidden_size) and aux.dtype == torch.float32
            assert torch.equal(aux, torch.cat([hs[i][r, :n] for i in capture], dim=-1))
            assert torch.equal(final, hs[-1][r, :n])
            off_by_one = torch.cat([hs[i + 1][r, :n] for i in capture], dim=-1)  # layer outputs
            assert not torch.allclose(aux, off_by_one)
    # Batching changes only kernel rounding (why batch_tokens is in the unit config).
    for (aux_b, _), (aux_a, _) in zip(batched, alone):
        assert torch.allclose(aux_b, aux_a, rtol=1e-4, atol=1e-4)


def test_llama_capture_equals_output_hidden_states():
    model = tiny_llama()
    parts = find_decoder(model)
    assert parts.base is model.model and parts.norm is model.model.norm and parts.hidden_size == 64
    assert_convention(model, parts, [1, 3, 4], sequences(512, [23, 9, 40, 1]))


def test_tiny_deepseek_v3_moe_mla_capture_equals_output_hidden_states():
    model = tiny_deepseek_v3()
    parts = find_decoder(model)
    assert [type(layer.mlp).__name__ for layer in parts.layers[:2]] == ["DeepseekV3MLP", "DeepseekV3MoE"]
    assert_convention(model, parts, [0, 2, 4], sequences(512, [31, 12, 5]))


def test_demo_target_capture_equals_output_hidden_states():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(DEMO_TARGET, dtype=torch.float32).eval()
    parts = find_decoder(model)
    assert len(parts.layers) == 8 and parts.hidden_size == 256
    assert_convention(model, parts, [2, 4, 5], sequences(model.config.vocab_size, [48, 17]))


def test_demo_kimi_target_capture_equals_output_hidden_states():
    """The Kimi-shaped demo target (DeepSeek-V3: MLA, a dense layer then MoE) keeps the convention."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(DEMO_TARGET.parent / "demo_kimi_target", dtype=torch.float32).eval()
    parts = find_decoder(model)
    assert len(parts.layers) == 8 and type(parts.layers[1].mlp).__name__ == "DeepseekV3MoE"
    assert_convention(model, parts, [2, 4, 5], sequences(model.config.vocab_size, [40, 13]))


class KimiLikeWrapper(nn.Module):
    """A multimodal wrapper like KimiK25ForConditionalGeneration: text model nested, config
    under `text_config`, and a vision tower with its own (differently sized) block list."""

    def __init__(self, language_model):
        super().__init__()
        from transformers import PretrainedConfig

        self.config = PretrainedConfig()
        self.config.text_config = language_model.config
        self.vision_tower = nn.Module()
        self.vision_tower.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.language_model = language_model


def test_decoder_found_inside_a_multimodal_wrapper_and_errors_name_what_was_seen():
    inner = tiny_deepseek_v3()
    parts = find_decoder(KimiLikeWrapper(inner))
    assert parts.base is inner.model and parts.layers is inner.model.layers and parts.norm is inner.model.norm
    assert_convention(inner, parts, [1, 2, 3], sequences(512, [7, 19]))
    bare = KimiLikeWrapper(inner)
    bare.config.text_config = type(inner.config)(num_hidden_layers=7)
    with pytest.raises(ValueError, match=r"cannot find 7 decoder layers.*language_model.model.layers\[5\]"):
        find_decoder(bare)


def test_load_target_dtype_remote_code_flag_and_identity(tmp_path, monkeypatch):
    tiny_llama(layers=4).save_pretrained(tmp_path / "t")
    parts = load_target(str(tmp_path / "t"), dtype="bfloat16", trust_remote_code=False)
    assert next(parts.base.parameters()).dtype == torch.bfloat16 and len(parts.layers) == 4
    assert not parts.base.training
    tiny_deepseek_v3().save_pretrained(tmp_path / "dsv3")
    moe = load_target(str(tmp_path / "dsv3"), dtype="float32", trust_remote_code=False)
    assert type(moe.base).__name__ == "DeepseekV3Model" and len(moe.layers) == 5 and moe.hidden_size == 64

    seen = {}
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: seen.update(kw) or real(path, **{**kw, "trust_remote_code": False}))
    load_target(str(tmp_path / "t"), dtype="float32", trust_remote_code=True, revision="abc")
    assert seen["trust_remote_code"] is True and seen["revision"] == "abc" and "device_map" not in seen

    ident = target_identity(str(tmp_path / "t"))
    assert ident["weights"]["hashed"] == "content"
    (tmp_path / "t" / "model.safetensors").write_bytes(b"retrained" * 10)
    assert target_identity(str(tmp_path / "t"))["weights"] != ident["weights"]
    assert target_identity("moonshotai/Kimi-K2.5", None, str(tmp_path / "no-cache")) == {
        "hub_id": "moonshotai/Kimi-K2.5", "revision": "main"}
    assert FULL_HASH_LIMIT == 1 << 30


def test_plan_batches_respects_the_budget_and_resumes_to_the_same_batches():
    rng = random.Random(3)
    lengths = sorted((rng.randint(1, 300) for _ in range(200)), reverse=True)
    batches = plan_batches(lengths, 1024)
    assert [i for b in batches for i in b] == list(range(200))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * lengths[batch[0]] <= 1024
    k = 7  # the first k batches were stored before a kill: the rest re-plans identically
    rest = [i for b in batches[k:] for i in b]
    again = plan_batches([lengths[i] for i in rest], 1024)
    assert [[rest[i] for i in b] for b in again] == batches[k:]
    assert plan_batches([5000, 10], 1024) == [[0], [1]]  # longer than the budget: alone
    with pytest.raises(ValueError, match="longest first"):
        plan_batches([1, 2], 100)


def test_capture_layers_out_of_range_and_hooks_are_removed():
    model = tiny_llama(layers=4)
    parts = find_decoder(model)
    with pytest.raises(ValueError, match=r"capture layers \[4\] out of range for a 4-layer target"):
        LayerCapture(parts, [1, 4])
    with LayerCapture(parts, [1]):
        assert parts.layers[1]._forward_pre_hooks
    assert not parts.layers[1]._forward_pre_hooks and not parts.norm._forward_hooks
