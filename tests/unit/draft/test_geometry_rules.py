"""Draft geometries an engine refuses are refused by config validation first, with the export's own rules.

Each case below is a config whose draft (`eagle3.draft.fit.draft_geometry`, what stage train
builds) the export refuses for some engine (`eagle3.draft.geometry.geometry_refusals`). The test
checks both halves: the export really refuses it for exactly those engines, and the entrypoint
refuses the config (exit 2, the key named) before any stage creates anything -- for every
config when no engine would export the draft, and for `stage=bench server=sglang` when only
SGLang refuses it (the chain then trains it and exports it for vLLM alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3.cli import check_config
from eagle3.config.convert import to_settings
from eagle3.draft.export import ExportError, capture_layers_of, export_draft
from eagle3.draft.fit import draft_geometry, export_engines
from eagle3.draft.geometry import GeometryRefusal, config_geometry, geometry_refusals
from eagle3.draft.model import Eagle3Draft
from eagle3.engines import ENGINES
from eagle3.paths import asset_path
from eagle3.stages import REGISTRY
from tests.conftest import HANG_GUARD_S, compose_config, run_cli

DEMO_TARGET = asset_path("demo_target")


def _train_geometry(overrides):
    """The geometry stage train builds for this config."""
    settings = to_settings(compose_config(list(overrides)))
    return draft_geometry(settings.model, settings.paths.hf_cache)
# The demo's draft is a layer variant SGLang lacks; these cases judge SGLang's layer unless they say otherwise.
PLAIN = ("model.draft.norm_before_residual=false",)
ALL = set(ENGINES)


def _gelu_target(tmp_path: Path) -> Path:
    """The demo target's config.json with another activation (all validation and geometry read)."""
    target = tmp_path / "gelu_target"
    target.mkdir(exist_ok=True)
    cfg = json.loads((DEMO_TARGET / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (target / "config.json").write_text(json.dumps(cfg))
    return target


# (case id, overrides, engines whose export refuses the draft, config keys the error names)
CASES = [
    ("capture_out_of_range", ["model.capture_layers=[2,4,8]"], ALL, ["model.capture_layers"]),
    ("capture_negative", ["model.capture_layers=[-1,4,5]"], ALL, ["model.capture_layers"]),
    ("capture_not_increasing", ["model.capture_layers=[4,2,5]"], ALL, ["model.capture_layers"]),
    ("capture_repeated", ["model.capture_layers=[2,4,4]"], ALL, ["model.capture_layers"]),
    ("capture_empty", ["model.capture_layers=[]", "model.draft.fc_in_features=null"], ALL, ["model.capture_layers"]),
    ("fc_not_a_multiple", ["model.draft.fc_in_features=700"], ALL, ["model.draft.fc_in_features"]),
    ("draft_hidden_not_target", ["model.draft.hidden_size=128"], ALL, ["model.draft.hidden_size"]),
    ("draft_vocab_over_target", ["model.draft.vocab_size=9000"], ALL, ["model.draft.vocab_size"]),
    ("two_input_norms", ["model.draft.norm_before_fc=true", "model.draft.fc_norm=true"], ALL,
     ["model.draft.fc_norm"]),
    ("target_not_silu", ["model.path=GELU"], ALL, ["model.path"]),
    # SGLang alone: exported for vLLM only, refused where SGLang would serve it.
    ("sglang_two_captures", [*PLAIN, "model.capture_layers=[2,4]", "model.draft.fc_in_features=512"], {"sglang"},
     ["model.capture_layers"]),
    ("sglang_four_captures", [*PLAIN, "model.capture_layers=[1,2,4,5]", "model.draft.fc_in_features=1024"],
     {"sglang"}, ["model.capture_layers"]),
    ("sglang_capture_zero", [*PLAIN, "model.capture_layers=[0,4,5]"], {"sglang"}, ["model.capture_layers"]),
    ("sglang_layer_variant", ["model.draft.norm_before_residual=true"], {"sglang"},
     ["model.draft.norm_before_residual"]),
]


def _overrides(overrides: list[str], tmp_path: Path) -> list[str]:
    return [o.replace("GELU", str(_gelu_target(tmp_path))) if "GELU" in o else o for o in overrides]


def _randomized(g) -> Eagle3Draft:
    torch.manual_seed(0)
    draft = Eagle3Draft(g)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.02)
        n = min(g.draft_vocab_size, g.vocab_size)
        draft.d2t[:n].zero_()  # draft id i -> target id i (a valid map for any vocab size)
        draft.t2d.zero_()
        draft.t2d[:n] = True
    return draft


@pytest.mark.slow
@pytest.mark.parametrize("case,overrides,refusing,keys", CASES, ids=[c[0] for c in CASES])
def test_the_export_refuses_each_case_for_exactly_those_engines(tmp_path, case, overrides, refusing, keys):
    g = _train_geometry(_overrides(overrides, tmp_path))
    draft = _randomized(g)
    for engine in ENGINES:
        if engine in refusing:
            with pytest.raises(ExportError, match=r"eagle3\.geometry\.") as exc:
                export_draft(draft, tmp_path / engine, engine)
            assert "\n" not in str(exc.value)
        else:
            export_draft(draft, tmp_path / engine, engine)
    assert sorted(engine for engine in ENGINES if geometry_refusals(g, engine)) == sorted(refusing)


@pytest.mark.slow
@pytest.mark.parametrize("case,overrides,refusing,keys", CASES, ids=[c[0] for c in CASES])
def test_validation_refuses_each_case_before_any_stage_runs(tmp_path, case, overrides, refusing, keys):
    root = tmp_path / "artifacts"
    # No engine exports it: every stage is refused, stage=all before demo_data writes a byte.
    # SGLang alone refuses it: serving the chain's draft on SGLang is refused, the chain itself runs.
    args = ["stage=all"] if refusing == ALL else ["stage=bench", "server=sglang"]
    done = run_cli([*args, *_overrides(overrides, tmp_path), f"paths.root={root}"], cwd=tmp_path)
    assert done.returncode == 2, (done.stdout[-1500:], done.stderr[-1500:])
    lines = [line.strip() for line in done.stderr.splitlines()]
    for key in keys:
        assert any(line.startswith(f"{key}: ") and "; valid: " in line for line in lines), done.stderr
    assert not any((root / name).exists() for name in REGISTRY), sorted(p.name for p in root.iterdir())
    if refusing != ALL:
        assert check_config(compose_config(["stage=all", *overrides])) == []
        assert check_config(compose_config(["stage=bench", "server=vllm", *overrides])) == []


def test_a_refusal_from_a_config_is_one_line_naming_the_key_and_the_fix():
    assert check_config(compose_config(["model.draft.hidden_size=128"])) == [
        "model.draft.hidden_size: 128 -- the draft reads the target's embedding, which the engines share with it "
        "only at equal width (an export with include_embedding=True carries its own); valid: 256 (the target's "
        "hidden size, fc_in_features / captures)"]
    assert check_config(compose_config(["stage=bench", "server=sglang", *PLAIN, "model.capture_layers=[0,4,5]"])) == [
        "model.capture_layers: [0, 4, 5] -- sglang cannot serve this draft geometry (sglang adds 1 to the ids it "
        "reads, so capture 0 has no id), so the chain exports none for it; valid: layers >= 1 for sglang, "
        "or server.backend=vllm"]


def test_the_fc_rule_names_the_target_width_not_the_draft_width():
    """Before: fc_in_features was checked against len(capture) x the DRAFT's hidden size, so
    `model.draft.hidden_size=128` was told `valid: 384`, and 384 then passed: an export the engines
    load (its fc looks 3 x 128 wide) but that trains on, and is fed, 3 x 256 features."""
    errors = check_config(compose_config(["model.draft.hidden_size=128"]))
    assert not any(e.startswith("model.draft.fc_in_features") for e in errors), errors
    errors = check_config(compose_config(["model.draft.hidden_size=128", "model.draft.fc_in_features=384"]))
    assert any(e.startswith("model.draft.fc_in_features: 384") and e.endswith("valid: 768") for e in errors), errors


def test_a_config_never_asks_for_rope_scaling_the_export_would_refuse():
    """The one export refusal no config reaches: the draft never takes the target's rope scaling
    (Kimi's is yarn), so `rope_scaling` is always null in what train builds."""
    model = dict(compose_config(["model=kimi_k25", "server=sglang"]).model)  # served by SGLang: the plain layer
    model["path"] = "/nonexistent"  # the hub id is not local: the model.* keys stand in
    g = config_geometry({**model, "draft": dict(model["draft"])})
    assert g.rope_scaling is None and geometry_refusals(g, "sglang") == []
    assert GeometryRefusal("rope_scaling", "x", "null", "y").config_key == "model.path"


@pytest.mark.parametrize("server", ["hf", "vllm", "sglang"])
def test_fc_norm_is_on_for_every_engine_unless_norm_before_fc_is_asked_for(server):
    """The default layer normalises each captured state before fc (eagle3.engines.SERVING_LAYER), which
    every engine serves; asking for norm_before_fc alone turns it off instead of failing validation."""
    g = _train_geometry([f"server={server}"])
    assert g.fc_norm and not g.norm_before_fc
    assert g.norm_before_residual is (server != "sglang")
    assert geometry_refusals(g, "vllm") == [] and check_config(compose_config([f"server={server}"])) == []
    single = _train_geometry([f"server={server}", "model.draft.norm_before_fc=true"])
    assert single.norm_before_fc and not single.fc_norm
    assert check_config(compose_config([f"server={server}", "model.draft.norm_before_fc=true"])) == []
    # Off on request; both on is still refused (the case two_input_norms above).
    assert not _train_geometry([f"server={server}", "model.draft.fc_norm=false"]).fc_norm


@pytest.mark.parametrize("capture", [(0, 4, 5), (2, 4), (1, 2, 4, 5)])
def test_train_exports_a_capture_sglang_lacks_for_vllm_only(tmp_path, capture):
    g = _train_geometry([*PLAIN, f"model.capture_layers=[{','.join(map(str, capture))}]",
                         f"model.draft.fc_in_features={256 * len(capture)}"])

    class Module:
        draft = _randomized(g)

    exports = export_engines(Module(), tmp_path, "bfloat16", {})
    assert sorted(exports) == ["vllm"] and not (tmp_path / "sglang").exists()
    assert capture_layers_of(exports["vllm"], "vllm") == list(capture)
    assert json.loads((Path(exports["vllm"]) / "config.json").read_text())["num_aux_hidden_states"] == len(capture)


# --------------------------------------------------------------------------------------------
# The acceptance line, for real: a 2-layer capture trains and is exported for vLLM alone

TWO_LAYERS = ("model.capture_layers=[2,4]", "model.draft.fc_in_features=512")
TINY = ("dataset=demo_native", "dataset.sources.demo_native.num_samples=12", "data.eval_size=2",
        "train.max_epochs=1", "train.ttt_steps=2", "eval.ks=[2]", "eval.num_prompts=0")


@pytest.fixture(scope="module")
def two_layer_chain(tmp_path_factory):
    """`stage=all` of a tiny demo chain capturing 2 layers: (root, the train unit, the job's output)."""
    root = tmp_path_factory.mktemp("two_layers") / "artifacts"
    work = root.parent / "elsewhere"
    work.mkdir()
    done = run_cli(["stage=all", *TINY, *TWO_LAYERS, f"paths.root={root}"], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    [unit] = [d for d in (root / "train").iterdir() if d.is_dir()]
    return root, unit, done.stdout + done.stderr


@pytest.mark.slow
def test_the_acceptance_line_plans_and_trains_a_two_layer_draft_exported_for_vllm(two_layer_chain, tmp_path):
    planned = run_cli(["stage=plan", *TWO_LAYERS, f"paths.root={tmp_path / 'plan'}"], cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    root, unit, output = two_layer_chain
    assert sorted(p.name for p in (unit / "draft").iterdir()) == ["vllm"]
    assert "train: no sglang export: it cannot serve model.capture_layers" in output
    cfg = json.loads((unit / "draft" / "vllm" / "config.json").read_text())
    assert cfg["num_aux_hidden_states"] == 2 and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4]
    assert cfg["target_hidden_size"] == 256
    refused = run_cli(["stage=bench", "server=sglang", *TINY, *TWO_LAYERS, f"paths.root={root}"], cwd=tmp_path)
    assert refused.returncode == 2 and "model.capture_layers: [2, 4] -- sglang cannot serve" in refused.stderr
    assert not (root / "bench").exists()


@pytest.mark.slow
def test_vllm_serves_the_two_layer_draft(two_layer_chain, tmp_path):
    """vLLM 0.32's CPU build loads the 2-capture export (fc 2 x 256 -> 256 from num_aux_hidden_states)
    and speculates with it; a fc sized for vLLM's default 3 would fail the weight load."""
    from eagle3.config.convert import to_settings
    from eagle3.serving.commands import build_command
    from eagle3.serving.engine_metrics import vllm_spec_counters
    from eagle3.serving.process import ServerProcess
    from tests.vllm_env import assert_stopped, free_port, launch_overrides, vllm_python

    python = vllm_python()
    root, unit, _ = two_layer_chain
    draft = unit / "draft" / "vllm"
    port = free_port()
    cfg = compose_config([*TINY, *TWO_LAYERS, f"paths.root={root}", "server=vllm", *launch_overrides(python, port),
                          "server.context_length=512", "server.speculative.num_steps=2",
                          "server.speculative.num_draft_tokens=3"])
    assert check_config(cfg) == []
    command = build_command(to_settings(cfg), draft)
    import urllib.request

    with ServerProcess(command, tmp_path / "vllm.log", startup_timeout_s=HANG_GUARD_S) as server:
        body = json.dumps({"model": str(cfg.model.path), "prompt": "def add(a, b):", "max_tokens": 24,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as reply:
            completion = json.loads(reply.read())
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=HANG_GUARD_S) as reply:
            counters = vllm_spec_counters(reply.read().decode())
    assert completion["usage"]["completion_tokens"] > 0, completion
    assert counters["drafts"] and counters["draft_tokens"] == 2 * counters["drafts"], counters
    log = (tmp_path / "vllm.log").read_text()
    assert "[2, 4]" in log or "(2, 4)" in log, log[-3000:]  # "Using auxiliary layers from speculative config"
    assert_stopped(port)
