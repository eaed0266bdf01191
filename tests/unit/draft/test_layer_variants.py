"""Draft layer variants (model.draft.*), Muon, the teacher and LR schedule options of train.*."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from eagle3.draft.export import ExportError, export_draft, load_exported, validate_export
from eagle3.draft.fit import export_engines
from eagle3.draft.lightning_module import lr_multiplier
from eagle3.draft.optim import MuonAdamW, is_muon_param, orthogonalize
from eagle3.draft.options import LAYER_VARIANTS
from eagle3.draft.teacher import teacher_targets
from tests.conftest import run_cli
from tests.unit.draft.test_export import geometry, make_draft, read_config

VARIANTS = {
    "plain": {},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "speculators": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
}


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_step(draft, aux: torch.Tensor, token: int, flags: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's llama_eagle3 forward for one position (attention over one key = its value), from the
    parameters alone: returns (logits, what the next step reads)."""
    g, m, eps = draft.geometry, draft.midlayer, draft.geometry.rms_norm_eps
    x = aux
    if flags.get("norm_before_fc"):
        x = rms(x, draft.input_norm.weight, eps)
    if flags.get("fc_norm"):
        x = torch.cat([rms(c, n.weight, eps) for c, n in zip(x.chunk(3, -1), draft.fc_norm)], -1)
    hidden = x @ draft.fc.weight.T  # [H]
    normed = rms(hidden, m.hidden_norm.weight, eps)
    residual = normed if flags.get("norm_before_residual") else hidden
    embeds = rms(draft.embed_tokens.weight[token], m.input_layernorm.weight, eps)
    cat = torch.cat([embeds, normed])
    v = (cat @ m.self_attn.v_proj.weight.T).view(g.num_key_value_heads, g.head_dim)
    per_head = v.repeat_interleave(g.num_attention_heads // g.num_key_value_heads, 0).reshape(-1)
    h = per_head @ m.self_attn.o_proj.weight.T + residual
    # vLLM's layers hand on (mlp output, residual) and add them inside the next RMSNorm (fused add).
    mlp_out, residual = mlp(m, rms(h, m.post_attention_layernorm.weight, eps)), h
    for layer in draft.layers.values():  # layers 1.., read the residual stream only (q/k/v over H)
        residual = mlp_out + residual
        x = rms(residual, layer.input_layernorm.weight, eps)
        v = (x @ layer.self_attn.v_proj.weight.T).view(g.num_key_value_heads, g.head_dim)
        per_head = v.repeat_interleave(g.num_attention_heads // g.num_key_value_heads, 0).reshape(-1)
        residual = per_head @ layer.self_attn.o_proj.weight.T + residual
        mlp_out = mlp(layer, rms(residual, layer.post_attention_layernorm.weight, eps))
    out = mlp_out + residual
    final = rms(out, draft.norm.weight, eps)
    return final @ draft.lm_head.weight.T, (final if flags.get("norm_output") else out)


def mlp(layer, u: torch.Tensor) -> torch.Tensor:
    w = layer.mlp
    return (torch.nn.functional.silu(u @ w.gate_proj.weight.T) * (u @ w.up_proj.weight.T)) @ w.down_proj.weight.T


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_step_matches_the_engine_formula(name):
    flags = VARIANTS[name]
    draft = make_draft(geometry(**flags), seed=3)
    torch.manual_seed(0)
    aux = torch.randn(96)
    state = draft.step(draft.project(aux.view(1, 1, -1)), torch.tensor([[7]]), torch.tensor([0]),
                       [lambda q, k, v: v.repeat_interleave(q.shape[1] // k.shape[1], 1)])
    logits, carried = reference_step(draft, aux, 7, flags)
    assert torch.allclose(draft.logits(state)[0, 0], logits, atol=1e-5)
    assert torch.allclose(draft.carry(state)[0, 0], carried, atol=1e-5)
    if name != "plain":  # the flag changes the output: a lost flag would show
        plain_logits, plain_carried = reference_step(draft, aux, 7, {k: False for k in flags})
        changed = torch.cat([logits, carried]) - torch.cat([plain_logits, plain_carried])
        assert changed.abs().max() > 1e-3


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("name", ["plain", "speculators"])
def test_deeper_draft_step_matches_the_engine_formula(name, layers):
    """Layers >= 1 are plain Llama layers on the residual stream, as vLLM's llama_eagle3 runs them."""
    flags = VARIANTS[name]
    draft = make_draft(geometry(num_layers=layers, **flags), seed=5)
    assert len(draft.layers) == layers - 1
    assert draft.midlayer.self_attn.q_proj.in_features == 2 * draft.geometry.hidden_size  # cat(embed, hidden)
    assert draft.layers["1"].self_attn.q_proj.in_features == draft.geometry.hidden_size
    torch.manual_seed(0)
    aux = torch.randn(96)
    step = [lambda q, k, v: v.repeat_interleave(q.shape[1] // k.shape[1], 1)] * layers
    state = draft.step(draft.project(aux.view(1, 1, -1)), torch.tensor([[7]]), torch.tensor([0]), step)
    logits, carried = reference_step(draft, aux, 7, flags)
    assert torch.allclose(draft.logits(state)[0, 0], logits, atol=1e-5)
    assert torch.allclose(draft.carry(state)[0, 0], carried, atol=1e-5)
    shallow = make_draft(geometry(**flags), seed=5)  # the same first layer without the others
    shallow.load_state_dict({k: v for k, v in draft.state_dict().items() if not k.startswith("layers.")})
    assert (reference_step(shallow, aux, 7, flags)[0] - logits).abs().max() > 1e-3
    with pytest.raises(ValueError, match=f"1 attention patterns for a {layers}-layer draft"):
        draft.step(draft.project(aux.view(1, 1, -1)), torch.tensor([[7]]), torch.tensor([0]), step[:1])


@pytest.mark.parametrize("name", ["speculators", "fc_norm"])
def test_variant_exports_for_vllm_with_the_keys_it_reads_and_loads_back(tmp_path, name):
    flags = VARIANTS[name]
    draft = make_draft(geometry(**flags), seed=4)
    out = export_draft(draft, tmp_path / "vllm", "vllm", dtype="float32")
    cfg = read_config(out)
    for variant in LAYER_VARIANTS:
        assert cfg[variant] is bool(flags.get(variant)), variant
    from safetensors.torch import load_file

    tensors = load_file(str(out / "model.safetensors"))
    assert ("input_norm.weight" in tensors) is bool(flags.get("norm_before_fc"))
    assert sorted(k for k in tensors if k.startswith("fc_norm.")) == (
        [f"fc_norm.{i}.weight" for i in range(3)] if flags.get("fc_norm") else [])
    g, engine, loaded = load_exported(out)
    assert engine == "vllm" and g.variants() == draft.geometry.variants()
    loaded.embed_tokens.weight.data.copy_(draft.embed_tokens.weight)
    aux, ids, pos = torch.randn(1, 4, 96), torch.tensor([[1, 2, 3, 4]]), torch.arange(4)
    from eagle3.draft.attention import ttt_attention

    def attend(q, k, v):
        return ttt_attention(q, [k], [v], 2)

    with torch.no_grad():
        a = draft.logits(draft.step(draft.project(aux), ids, pos, [attend]))
        b = loaded.logits(loaded.step(loaded.project(aux), ids, pos, [attend]))
    assert torch.allclose(a, b, atol=1e-6)


def test_sglang_export_of_a_variant_is_refused_in_one_line(tmp_path):
    draft = make_draft(geometry(norm_before_residual=True))  # the variant SGLang 0.5.23 lacks (eagle3.engines)
    with pytest.raises(ExportError) as exc:
        export_draft(draft, tmp_path / "sglang", "sglang")
    message = str(exc.value)
    assert "\n" not in message and "norm_before_residual: found true, expected false for sglang" in message
    assert not (tmp_path / "sglang").exists()
    # A config edited to claim the plain layer for vLLM does not pass the read-back check either.
    out = export_draft(draft, tmp_path / "vllm", "vllm")
    cfg_file = out / "config.json"
    import json

    cfg = json.loads(cfg_file.read_text())
    cfg["norm_before_residual"] = False
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="norm_before_residual: found false, expected true"):
        validate_export(out)


def test_a_two_layer_draft_exports_for_vllm_only_and_loads_back(tmp_path):
    draft = make_draft(geometry(num_layers=2), seed=6)
    with pytest.raises(ExportError) as exc:
        export_draft(draft, tmp_path / "sglang", "sglang")
    assert "\n" not in str(exc.value) and "num_layers: found 2, expected 1 for sglang" in str(exc.value)
    assert not (tmp_path / "sglang").exists()

    trained = SimpleNamespace(draft=draft)  # what export_engines reads of the Lightning module
    assert sorted(export_engines(trained, tmp_path / "train", "float32", {})) == ["vllm"]
    out = tmp_path / "train" / "vllm"
    cfg = read_config(out)
    assert cfg["num_hidden_layers"] == 2 and cfg["eagle3"]["geometry"]["num_layers"] == 2
    from safetensors.torch import load_file

    names = set(load_file(str(out / "model.safetensors")))
    assert {"layers.1.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight", "midlayer.hidden_norm.weight"} <= names
    assert not any(n.startswith(("layers.0.", "layers.2.", "layers.1.hidden_norm")) for n in names)
    g, _, loaded = load_exported(out)
    assert g.num_layers == 2
    loaded.embed_tokens.weight.data.copy_(draft.embed_tokens.weight)
    from eagle3.draft.attention import TTTAttention

    aux, ids, pos = torch.randn(1, 4, 96), torch.tensor([[1, 2, 3, 4]]), torch.arange(4)
    with torch.no_grad():
        a = draft.logits(draft.step(draft.project(aux), ids, pos, TTTAttention(2, 2).attends))
        b = loaded.logits(loaded.step(loaded.project(aux), ids, pos, TTTAttention(2, 2).attends))
    assert torch.allclose(a, b, atol=1e-6)
    # An export whose config claims one layer while holding two is refused when read.
    cfg["num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="num_hidden_layers: found 1, expected 2"):
        validate_export(out)


def test_an_export_written_before_the_variant_keys_still_reads_as_the_plain_layer(tmp_path):
    import json

    out = export_draft(make_draft(geometry()), tmp_path / "vllm", "vllm")
    cfg = json.loads((out / "config.json").read_text())
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        del cfg[key]  # what exports of earlier versions lack (vLLM reads them as false)
    (out / "config.json").write_text(json.dumps(cfg))
    assert validate_export(out).geometry.variants() == {k: False for k in LAYER_VARIANTS}


def test_train_exports_a_variant_for_the_engines_that_serve_it(tmp_path):
    class Module:
        draft = make_draft(geometry(norm_before_residual=True))

    exports = export_engines(Module(), tmp_path, "bfloat16", {})
    assert sorted(exports) == ["vllm"] and not (tmp_path / "sglang").exists()

    class Plain:
        draft = make_draft(geometry())

    assert sorted(export_engines(Plain(), tmp_path / "plain", "bfloat16", {})) == ["sglang", "vllm"]


def test_config_refuses_variants_an_engine_cannot_serve_before_any_work(tmp_path):
    done = run_cli(["stage=bench", "server=sglang", "model.draft.norm_before_residual=true",
                    f"paths.root={tmp_path}"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model.draft.norm_before_residual" in done.stderr and "sglang cannot serve" in done.stderr
    both = run_cli(["stage=train", "model.draft.norm_before_fc=true", "model.draft.fc_norm=true",
                    f"paths.root={tmp_path}"], cwd=tmp_path)
    assert both.returncode == 2 and "model.draft.fc_norm" in both.stderr
    assert not any((tmp_path / stage).exists() for stage in ("train", "bench"))


# --------------------------------------------------------------------------------------------
# Muon + AdamW


def _params(seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(seed)
    return [("midlayer.mlp.up_proj.weight", torch.nn.Parameter(torch.randn(12, 8))),
            ("lm_head.weight", torch.nn.Parameter(torch.randn(6, 8))),
            ("norm.weight", torch.nn.Parameter(torch.randn(8)))]


def _steps(optimizer, params, n: int = 4) -> None:
    for step in range(n):  # gradients depend on each parameter alone: groups can be compared apart
        optimizer.zero_grad()
        loss = sum((torch.sin(p * (step + 1)) + p.pow(2)).sum() for _, p in params)
        loss.backward()
        optimizer.step()


def test_muon_split_puts_matrices_on_muon_and_vocab_rows_and_vectors_on_adamw():
    assert [is_muon_param(n, p) for n, p in _params()] == [True, False, False]


def test_adamw_group_equals_torch_adamw():
    ours, ref = _params(), _params()
    _steps(MuonAdamW(ours, lr=1e-2, weight_decay=0.05), ours)
    _steps(torch.optim.AdamW([p for _, p in ref[1:]], lr=1e-2, weight_decay=0.05), ref[1:])
    for (_, a), (_, b) in zip(ours[1:], ref[1:]):
        assert torch.allclose(a, b, atol=1e-6)


def test_muon_group_matches_torch_muon_with_adamw_rms_matching():
    ours, ref = _params(), _params()
    _steps(MuonAdamW(ours[:1], lr=1e-2, muon_weight_decay=0.1), ours[:1])
    _steps(torch.optim.Muon([ref[0][1]], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"), ref[:1])
    start = _params()[0][1]
    moved_ours, moved_ref = ours[0][1] - start, ref[0][1] - start
    # torch orthogonalises in bfloat16, this module in float32: equal up to bf16 rounding.
    assert torch.allclose(moved_ours, moved_ref, rtol=0.05, atol=5e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_orthogonalize_flattens_the_spectrum(dtype):
    torch.manual_seed(0)
    update = torch.randn(16, 6) @ torch.diag(torch.tensor([10.0, 5, 1, 0.5, 0.2, 0.1])) @ torch.randn(6, 6)
    ortho = orthogonalize(update, steps=5, dtype=dtype)
    assert ortho.dtype == torch.float32  # the update comes back in the parameter's dtype
    s = torch.linalg.svdvals(ortho)
    assert s.max() < 1.3 and s.min() > 0.3  # from a 100x spread to within a factor ~3, in bf16 too


def test_muon_newton_schulz_precision_follows_the_hardware(monkeypatch):
    monkeypatch.setattr("eagle3.draft.optim.cpu_has_native_bf16", lambda: True)
    params = _params()
    assert MuonAdamW(params, lr=1e-2)._ns_dtype(params[0][1]) == torch.bfloat16
    monkeypatch.setattr("eagle3.draft.optim.cpu_has_native_bf16", lambda: False)
    assert MuonAdamW(params, lr=1e-2)._ns_dtype(params[0][1]) == torch.float32
    assert MuonAdamW(params, lr=1e-2, ns_dtype="bfloat16")._ns_dtype(params[0][1]) == torch.bfloat16
    with pytest.raises(ValueError, match="ns_dtype='half'; valid: auto, bfloat16, float32"):
        MuonAdamW(params, lr=1e-2, ns_dtype="half")


def test_muon_state_round_trips_so_a_resumed_run_continues_identically():
    a, b = _params(), _params()
    opt_a = MuonAdamW(a, lr=1e-2)
    _steps(opt_a, a, 2)
    opt_b = MuonAdamW(b, lr=1e-2)
    _steps(opt_b, b, 2)
    opt_c = MuonAdamW(b, lr=1e-2)
    opt_c.load_state_dict(opt_b.state_dict())
    _steps(opt_a, a, 2)
    _steps(opt_c, b, 2)
    for (_, x), (_, y) in zip(a, b):
        assert torch.equal(x, y)


def test_muon_refuses_bare_tensors_with_the_fix_in_the_message():
    with pytest.raises(TypeError, match="named_parameters"):
        MuonAdamW([torch.nn.Parameter(torch.randn(3, 3))])


# --------------------------------------------------------------------------------------------
# Teacher and schedule


def test_full_vocab_teacher_keeps_the_in_vocab_mass_without_renormalising():
    torch.manual_seed(0)
    final, head = torch.randn(1, 5, 8), torch.randn(12, 8)
    ids = torch.tensor([0, 2, 3, 7, 11])
    full = torch.softmax(final @ head.T, -1)
    renorm = teacher_targets(final, head, ids)
    raw = teacher_targets(final, head, ids, renormalise=False)
    assert torch.allclose(raw.probs, full[..., ids].reshape(raw.probs.shape), atol=1e-6)
    want = full[..., ids] / full[..., ids].sum(-1, keepdim=True)
    assert torch.allclose(renorm.probs, want.reshape(renorm.probs.shape), atol=1e-6)
    assert torch.equal(raw.argmax, renorm.argmax)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_lr_schedules_warm_up_then_fall_to_the_floor(schedule):
    values = [lr_multiplier(s, total=100, warmup=10, floor=0.1, schedule=schedule) for s in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0) and values[10] == pytest.approx(1.0)
    assert values[100] == pytest.approx(0.1)
    mid = 0.1 + 0.9 * (0.5 if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert values[55] == pytest.approx(mid)
    with pytest.raises(ValueError, match="valid: cosine, linear"):
        lr_multiplier(50, 100, 10, 0.1, "step")
