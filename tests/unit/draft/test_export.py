"""Draft export for SGLang/vLLM: engine ids, round trip, tamper detection, atomicity, logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import eagle3.draft.export as export_mod
from eagle3.artifacts.atomic import is_temp_name, temp_path_for
from eagle3.draft.export import (
    ARCHITECTURE,
    CONFIG_NAME,
    WEIGHTS_NAME,
    ExportError,
    capture_layers_of,
    expected_shapes,
    export_draft,
    load_exported,
    validate_export,
)
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.serving.rules import draft_kind

IDS = "eagle_aux_hidden_state_layer_ids"
HIDDEN, VOCAB, DRAFT_VOCAB = 32, 50, 20


def geometry(capture=(2, 4, 5), layers=8, hidden=HIDDEN, target_hidden=HIDDEN, **kw) -> DraftGeometry:
    """A tiny draft: 4 query heads over 2 kv heads, fc over 3 captured target states."""
    fields = dict(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=48, fc_in_features=len(capture) * target_hidden, vocab_size=VOCAB,
                  draft_vocab_size=DRAFT_VOCAB, capture_layers=tuple(capture), target_num_layers=layers,
                  rope_theta=10000.0, max_position_embeddings=128)
    fields.update(kw)
    return DraftGeometry(**fields)


def make_draft(g: DraftGeometry | None = None, seed: int = 0) -> Eagle3Draft:
    """Random weights (norms too, so a lost norm shows) and a valid vocabulary map."""
    torch.manual_seed(seed)
    draft = Eagle3Draft(g or geometry())
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.2)
        ids = torch.randperm(draft.geometry.vocab_size)[: draft.geometry.draft_vocab_size].sort().values
        draft.d2t.copy_(ids - torch.arange(ids.numel()))
        draft.t2d.zero_()
        draft.t2d[ids] = True
    return draft


def read_config(path: Path) -> dict:
    return json.loads((path / CONFIG_NAME).read_text())


def write_config(path: Path, cfg: dict) -> None:
    (path / CONFIG_NAME).write_text(json.dumps(cfg))


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def attend(q, k, v):
    # GQA: 4 query heads share 2 kv heads.
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


# ------------------------------------------------------------------------------------------
# Names, ids, round trip


def test_expected_shapes_are_the_models_state_dict():
    g = geometry()
    assert expected_shapes(g) == {k: tuple(v.shape) for k, v in Eagle3Draft(g).state_dict().items()}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_round_trip_tensors_and_config(tmp_path, engine):
    draft = make_draft()
    out = export_draft(draft, tmp_path / "draft", engine, extra_metadata={"run": "r1"})
    assert sorted(p.name for p in out.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    assert siblings(out) == []  # no temporary directory left behind

    stored = load_file(str(out / WEIGHTS_NAME))
    original = draft.state_dict()
    assert set(stored) == set(original) - {"embed_tokens.weight"}
    for key, value in stored.items():
        if key in ("d2t", "t2d"):
            assert value.dtype == original[key].dtype and torch.equal(value, original[key])
        else:
            assert value.dtype == torch.bfloat16
            assert torch.equal(value, original[key].to(torch.bfloat16))

    g, got_engine, loaded = load_exported(out)
    assert (g, got_engine) == (draft.geometry, engine)
    for key, value in loaded.state_dict().items():
        if key == "embed_tokens.weight":
            assert not value.any()  # not exported: zeros until the target's is copied in
        elif key in ("d2t", "t2d"):
            assert torch.equal(value, original[key])
        else:
            assert value.dtype == torch.float32
            assert torch.equal(value, original[key].to(torch.bfloat16).float())

    cfg = read_config(out)
    assert cfg["architectures"] == [ARCHITECTURE] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    assert (cfg["vocab_size"], cfg["draft_vocab_size"]) == (VOCAB, DRAFT_VOCAB)
    heads = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
    assert (cfg["hidden_size"], *heads) == (32, 4, 2, 8)
    assert (cfg["intermediate_size"], cfg["hidden_act"], cfg["target_hidden_size"]) == (48, "silu", 32)
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"
    assert cfg["rope_theta"] == 10000.0 and cfg["rope_scaling"] is None
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    meta = cfg["eagle3"]
    assert meta["engine"] == engine and meta["capture_layers"] == [2, 4, 5]
    assert meta["geometry"] == draft.geometry.to_dict() and meta["extra"] == {"run": "r1"}
    assert validate_export(out, engine).engine == engine


@pytest.mark.parametrize("capture,layers,sglang_ids", [
    ((2, 4, 5), 8, [1, 3, 4]),
    ((2, 30, 58), 61, [1, 29, 57]),  # Kimi-K2.5's default capture
])
def test_ids_are_capture_minus_one_for_sglang_and_as_is_for_vllm(tmp_path, capture, layers, sglang_ids):
    draft = make_draft(geometry(capture=capture, layers=layers))
    sg = export_draft(draft, tmp_path / "sglang", "sglang")
    vl = export_draft(draft, tmp_path / "vllm", "vllm")

    sg_cfg, vl_cfg = read_config(sg), read_config(vl)
    assert sg_cfg["eagle_config"][IDS] == sglang_ids and IDS not in sg_cfg  # SGLang reads eagle_config only
    assert vl_cfg[IDS] == list(capture) and IDS not in vl_cfg["eagle_config"]  # vLLM reads the top level
    assert capture_layers_of(sg, "sglang") == list(capture)
    assert capture_layers_of(vl, "vllm") == list(capture)

    # Served on the wrong engine: refused by our validator, and the capture it would get differs.
    with pytest.raises(ExportError, match=r"eagle3\.engine: found 'sglang', expected 'vllm'"):
        validate_export(sg, "vllm")
    assert capture_layers_of(sg, "vllm") == sglang_ids  # a vLLM reading the nested ids: one layer early
    with pytest.raises(ExportError, match="sglang would capture its default layers"):
        capture_layers_of(vl, "sglang")


def test_transformers_keeps_every_field_the_engines_read(tmp_path):
    """Both engines parse the draft config with transformers; custom fields must survive."""
    from transformers import AutoConfig

    out = export_draft(make_draft(), tmp_path / "draft", "vllm")
    cfg = AutoConfig.from_pretrained(out)
    assert type(cfg).__name__ == "LlamaConfig" and cfg.architectures == [ARCHITECTURE]
    assert cfg.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    assert (cfg.draft_vocab_size, cfg.target_hidden_size) == (DRAFT_VOCAB, 32)
    assert (cfg.head_dim, cfg.vocab_size) == (8, VOCAB)
    assert cfg.eagle_config == {"use_aux_hidden_state": True}
    assert cfg.tie_word_embeddings is False
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert rope["rope_theta"] == 10000.0


def test_config_validator_recognises_an_export_as_eagle3(tmp_path):
    from eagle3.cli import check_config
    from tests.conftest import compose_config

    out = export_draft(make_draft(), tmp_path / "draft", "sglang")
    assert draft_kind(str(out)) == "eagle3"
    cfg = compose_config(["server=sglang", "server.speculative.algorithm=EAGLE",
                          f"server.speculative.draft_path={out}"])
    errors = check_config(cfg)
    assert any("the draft is EAGLE-3" in e for e in errors)


# ------------------------------------------------------------------------------------------
# Logits


def test_loaded_model_reproduces_the_original_logits(tmp_path):
    draft = make_draft(seed=3)
    torch.manual_seed(1)
    aux = torch.randn(2, 7, draft.geometry.fc_in_features)  # [B, T, 3H]
    ids = torch.randint(0, VOCAB, (2, 7))
    positions = torch.arange(7)

    def logits(model: Eagle3Draft) -> torch.Tensor:
        with torch.no_grad():
            return model.logits(model.step(model.project(aux), ids, positions, [attend]))

    want = logits(draft)
    for dtype in ("float32", "bfloat16"):
        out = export_draft(draft, tmp_path / dtype, "vllm", dtype=dtype)
        _, _, loaded = load_exported(out)
        with torch.no_grad():
            loaded.embed_tokens.weight.copy_(draft.embed_tokens.weight)  # the target's, not exported
        if dtype == "float32":
            assert torch.equal(logits(loaded), want)
        else:  # equal to the original with its weights rounded through bf16
            rounded = make_draft(seed=3)
            with torch.no_grad():
                for name, p in rounded.named_parameters():
                    if name != "embed_tokens.weight":
                        p.copy_(p.to(torch.bfloat16).float())
            assert torch.equal(logits(loaded), logits(rounded))
            assert torch.allclose(logits(loaded), want, atol=0.05)


def test_embedding_included_when_requested(tmp_path):
    draft = make_draft()
    out = export_draft(draft, tmp_path / "draft", "sglang", include_embedding=True, dtype="float32")
    assert "embed_tokens.weight" in load_file(str(out / WEIGHTS_NAME))
    _, _, loaded = load_exported(out)
    assert torch.equal(loaded.embed_tokens.weight, draft.embed_tokens.weight)


# ------------------------------------------------------------------------------------------
# Tampered exports fail with one line naming the file, the key, found and expected


def tamper_tensors(out: Path, edit) -> None:
    tensors = load_file(str(out / WEIGHTS_NAME))
    edit(tensors)
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})


def drop_hidden_norm(t):
    del t["midlayer.hidden_norm.weight"]


def narrow_fc(t):
    t["fc.weight"] = t["fc.weight"][:, :64].contiguous()


def unmark_a_draft_token(t):
    t2d = t["t2d"].clone()
    t2d[int(t["d2t"][0])] = False  # draft id 0 -> target id 0 + d2t[0]
    t["t2d"] = t2d


def out_of_range_d2t(t):
    d2t = t["d2t"].clone()
    d2t[-1] = VOCAB - (DRAFT_VOCAB - 1)  # draft id 19 -> target id 50
    t["d2t"] = d2t


def int32_d2t(t):
    t["d2t"] = t["d2t"].to(torch.int32)


def extra_tensor(t):
    t["midlayer.self_attn.q_norm.weight"] = torch.ones(8, dtype=torch.bfloat16)


def new_values_same_shapes(t):
    t["norm.weight"] = t["norm.weight"] + 1


@pytest.mark.parametrize("edit,pattern", [
    (drop_hidden_norm, r"midlayer\.hidden_norm\.weight: missing, expected shape \[32\]"),
    (narrow_fc, r"fc\.weight: found shape \[32, 64\], expected \[32, 96\]"),
    (unmark_a_draft_token, r"d2t/t2d: draft id 0 maps to target id \d+, which t2d marks False"),
    (out_of_range_d2t, r"d2t: draft id 19 maps to target id 50, expected an id in \[0, 50\)"),
    (int32_d2t, r"d2t: found dtype I32, expected I64"),
    (extra_tensor, r"midlayer\.self_attn\.q_norm\.weight: unexpected tensor"),
    (new_values_same_shapes, r"sha256: found [0-9a-f]{64}, expected [0-9a-f]{64}"),
])
def test_tampered_weights_fail_validation(tmp_path, edit, pattern):
    out = export_draft(make_draft(), tmp_path / "draft", "sglang")
    tamper_tensors(out, edit)
    with pytest.raises(ExportError, match=pattern) as info:
        validate_export(out)
    message = str(info.value)
    assert message.startswith(str(out / WEIGHTS_NAME) + ": ") and "\n" not in message
    with pytest.raises(ExportError):
        load_exported(out)


def forget_the_sglang_shift(cfg):
    cfg["eagle_config"][IDS] = [2, 4, 5]


def drop_the_ids(cfg):
    del cfg["eagle_config"][IDS]


def change_hidden_size(cfg):
    cfg["hidden_size"] = 64


def tie_embeddings(cfg):
    cfg["tie_word_embeddings"] = True


def retarget_capture(cfg):
    cfg["eagle3"]["geometry"]["capture_layers"] = [3, 4, 5]
    cfg["eagle3"]["capture_layers"] = [3, 4, 5]


def drop_metadata(cfg):
    del cfg["eagle3"]


@pytest.mark.parametrize("edit,pattern", [
    (forget_the_sglang_shift, r"eagle_config\.eagle_aux_hidden_state_layer_ids: found \[2, 4, 5\], "
                              r"expected \[1, 3, 4\] \(sglang reads capture - 1"),
    (drop_the_ids, r"eagle_config\.eagle_aux_hidden_state_layer_ids: found missing, expected \[1, 3, 4\]"),
    (change_hidden_size, r"hidden_size: found 64, expected 32"),
    (tie_embeddings, r"tie_word_embeddings: found true, expected false"),
    (retarget_capture, r"eagle_config\.eagle_aux_hidden_state_layer_ids: found \[1, 3, 4\], "
                       r"expected \[2, 3, 4\]"),
    (drop_metadata, r"eagle3: missing"),
])
def test_tampered_config_fails_validation(tmp_path, edit, pattern):
    out = export_draft(make_draft(), tmp_path / "draft", "sglang")
    cfg = read_config(out)
    edit(cfg)
    write_config(out, cfg)
    with pytest.raises(ExportError, match=pattern) as info:
        validate_export(out)
    assert str(info.value).startswith(str(out / CONFIG_NAME) + ": ") and "\n" not in str(info.value)


def test_vllm_ids_at_the_wrong_place_fail(tmp_path):
    out = export_draft(make_draft(), tmp_path / "draft", "vllm")
    cfg = read_config(out)
    cfg["eagle_config"][IDS] = cfg.pop(IDS)  # where SGLang reads them; vLLM would use its default
    write_config(out, cfg)
    with pytest.raises(ExportError, match=r"^[^ ]+: eagle_aux_hidden_state_layer_ids: found missing, "
                                          r"expected \[2, 4, 5\]"):
        validate_export(out)


# ------------------------------------------------------------------------------------------
# Refused before writing


@pytest.mark.parametrize("g,include_embedding,pattern", [
    (geometry(capture=(2, 4)), False, r"capture_layers: found 2 layers \[2, 4\], expected 3 layers for sglang"),
    (geometry(capture=(0, 4, 5)), False, r"capture_layers: found \[0, 4, 5\] \(sglang ids \[-1, 3, 4\]\), "
                                         r"expected layers >= 1 for sglang"),
    (geometry(capture=(2, 4, 8)), False, r"capture_layers: found \[2, 4, 8\], expected ids in \[0, 7\].*"
                                         r"layer 8 is out of range for a 8-layer model"),
    (geometry(hidden_act="gelu"), False, r"hidden_act: found 'gelu', expected 'silu'"),
    (geometry(rope_scaling={"rope_type": "yarn", "factor": 4.0}), False, r"rope_scaling: found"),
    (geometry(target_hidden=48), False,
     r"geometry\.hidden_size: found 32, expected 48 \(the target's hidden size.*include_embedding=True"),
])
def test_unservable_geometry_is_refused(tmp_path, g, include_embedding, pattern):
    with pytest.raises(ExportError, match=pattern):
        export_draft(make_draft(g), tmp_path / "draft", "sglang", include_embedding=include_embedding)
    assert not (tmp_path / "draft").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("capture", [(2, 4), (0, 4, 5), (1, 2, 3, 4, 5)])
def test_a_capture_sglang_lacks_exports_for_vllm_with_the_aux_count_it_reads(tmp_path, capture):
    """vLLM 0.32 sizes fc from `num_aux_hidden_states` (its default 3 would not fit 2 captures)
    and captures layer 0; SGLang builds fc for exactly 3 and reads capture - 1."""
    draft = make_draft(geometry(capture=capture))
    with pytest.raises(ExportError, match=r"^[^\n]*eagle3\.geometry\.capture_layers: found .*for sglang[^\n]*$"):
        export_draft(draft, tmp_path / "sglang", "sglang")
    out = export_draft(draft, tmp_path / "vllm", "vllm")
    cfg = read_config(out)
    assert cfg["num_aux_hidden_states"] == len(capture) and cfg[IDS] == list(capture)
    assert capture_layers_of(out, "vllm") == list(capture)
    # A hand edit of the count (vLLM would build another fc) no longer validates.
    cfg["num_aux_hidden_states"] = len(capture) + 1
    write_config(out, cfg)
    with pytest.raises(ExportError, match=f"num_aux_hidden_states: found {len(capture) + 1}, expected {len(capture)}"):
        validate_export(out)


def test_a_vllm_export_written_before_the_aux_count_still_reads_as_three(tmp_path):
    out = export_draft(make_draft(geometry()), tmp_path / "vllm", "vllm")
    cfg = read_config(out)
    del cfg["num_aux_hidden_states"]  # what exports of earlier versions lack (vLLM then reads 3)
    write_config(out, cfg)
    assert validate_export(out).geometry.capture_layers == (2, 4, 5)


def test_bad_state_dict_is_refused_before_writing(tmp_path):
    draft = make_draft()
    state = dict(draft.state_dict())
    state["midlayer.self_attn.o_proj.weight"] = torch.zeros(32, 16)
    with pytest.raises(ExportError, match=r"o_proj\.weight: found shape \[32, 16\], expected \[32, 32\]"):
        export_draft(state, tmp_path / "draft", "vllm", geometry=draft.geometry)
    state = dict(draft.state_dict())
    state["d2t"] = torch.zeros(DRAFT_VOCAB, dtype=torch.long)  # draft id i -> target id i: not t2d's set
    with pytest.raises(ExportError, match=r"d2t"):
        export_draft(state, tmp_path / "draft", "vllm", geometry=draft.geometry)
    with pytest.raises(ExportError, match=r"geometry: missing"):
        export_draft(state, tmp_path / "draft", "vllm")
    with pytest.raises(ExportError, match=r"engine: found 'trtllm'"):
        export_draft(draft, tmp_path / "draft", "trtllm")
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_directory_is_never_replaced(tmp_path):
    out = tmp_path / "draft"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a draft export"):
        export_draft(make_draft(), out, "sglang")
    assert (out / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------
# Atomicity


def dying_save_file(tensors, path, metadata=None):
    Path(path).write_bytes(b"\x00" * 100)  # half a file, then the process "dies"
    raise KeyboardInterrupt("killed mid-write")


def dying_config_write(path, obj):
    raise KeyboardInterrupt("killed after the weights were written")


@pytest.mark.parametrize("target,dying", [
    ("save_file", dying_save_file),  # killed while writing the weights
    ("atomic_write_json", dying_config_write),  # killed after the weights, before the config
])
def test_a_write_killed_midway_leaves_the_previous_export(tmp_path, monkeypatch, target, dying):
    out = export_draft(make_draft(seed=1), tmp_path / "draft", "sglang")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    monkeypatch.setattr(export_mod, target, dying)
    with pytest.raises(KeyboardInterrupt):
        export_draft(make_draft(seed=2), out, "sglang")
    monkeypatch.undo()

    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert siblings(out) == []
    validate_export(out, "sglang")


def test_a_half_directory_left_by_a_hard_kill_is_not_trusted_and_is_swept(tmp_path):
    out = export_draft(make_draft(seed=1), tmp_path / "draft", "vllm")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    half = temp_path_for(out)
    half = half.with_name(half.name.replace(f"-{os.getpid()}-", f"-{pid}-"))
    half.mkdir()
    (half / WEIGHTS_NAME).write_bytes(b"\x00" * 64)
    assert is_temp_name(half.name)
    with pytest.raises(ExportError):
        validate_export(half)
    validate_export(out, "vllm")

    export_draft(make_draft(seed=2), out, "vllm")  # a later export removes the leftover
    assert siblings(out) == []
    assert not torch.equal(load_exported(out)[2].fc.weight, make_draft(seed=1).fc.weight)


def test_readback_failure_keeps_the_previous_export(tmp_path, monkeypatch):
    out = export_draft(make_draft(seed=1), tmp_path / "draft", "sglang")
    before = (out / WEIGHTS_NAME).read_bytes()

    def refuse(*args, **kwargs):
        raise ExportError("simulated read-back failure")

    monkeypatch.setattr(export_mod, "validate_export", refuse)
    with pytest.raises(ExportError, match="simulated"):
        export_draft(make_draft(seed=2), out, "sglang")
    monkeypatch.undo()
    assert (out / WEIGHTS_NAME).read_bytes() == before and siblings(out) == []
