"""Server command lines: exact argv/env per profile, and the guards checked before any launch.

The SGLang lines are pinned for Kimi-K2.5 with an EAGLE-3 draft written by `export_draft` (a
tiny draft whose geometry says "Kimi": 61 target layers, captures [2, 30, 58], 163840-token
vocab, fc over 3 x 7168). SGLang cannot be installed on CPU machines, so these lines are what
its path is tested by (docs/design.md, 'Facts: SGLang').
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from eagle3.cli import check_config
from eagle3.config.convert import to_settings
from eagle3.draft.export import capture_layers_of, export_draft, validate_export
from eagle3.draft.geometry import DraftGeometry, geometry_from_target
from eagle3.draft.model import Eagle3Draft
from eagle3.paths import asset_path
from eagle3.serving.commands import (
    VLLM_PLUGIN_DIR,
    ServerConfigError,
    build_command,
    launch_config,
    sglang_command,
)
from eagle3.serving.rules import speculative_algorithm_error
from eagle3.target_info import read_config as target_text_config
from tests.conftest import compose_config

KIMI = ["model=kimi_k25"]
VLLM_PYTHON = "/opt/vllm-env/bin/python"


def _randomize(draft: Eagle3Draft, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    g = draft.geometry
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.02)
        ids = torch.randperm(g.vocab_size)[: g.draft_vocab_size].sort().values
        draft.d2t.copy_(ids - torch.arange(ids.numel()))
        draft.t2d.zero_()
        draft.t2d[ids] = True
    return draft


def kimi_geometry() -> DraftGeometry:
    """Kimi-K2.5's target side (61 layers, H 7168, vocab 163840, capture [2, 30, 58]), a tiny draft."""
    return DraftGeometry(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         intermediate_size=32, fc_in_features=3 * 7168, vocab_size=163840,
                         draft_vocab_size=64, capture_layers=(2, 30, 58), target_num_layers=61,
                         max_position_embeddings=256)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    """Exports: Kimi-shaped for SGLang; the demo target's real draft geometry for vLLM and SGLang."""
    root = tmp_path_factory.mktemp("drafts")
    kimi = _randomize(Eagle3Draft(kimi_geometry()))
    demo_g = geometry_from_target(target_text_config(asset_path("demo_target")), [2, 4, 5], 2048,
                                  {"fc_in_features": 768})
    demo = _randomize(Eagle3Draft(demo_g), seed=1)
    return {
        "kimi_sglang": export_draft(kimi, root / "kimi" / "sglang", "sglang", include_embedding=True),
        "demo_vllm": export_draft(demo, root / "demo" / "vllm", "vllm"),
        "demo_sglang": export_draft(demo, root / "demo" / "sglang", "sglang"),
    }


def kimi_spec(draft: Path) -> list[str]:
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--speculative-draft-model-quantization", "unquant"]


def command_for(overrides: list[str]):
    cfg = compose_config(overrides)
    assert check_config(cfg) == []
    return build_command(to_settings(cfg))


# ------------------------------------------------------------------------------------------
# The drafts are what the engines would load


def test_fixture_drafts_validate_for_their_engine(drafts):
    info = validate_export(drafts["kimi_sglang"], "sglang")
    assert info.geometry.target_num_layers == 61 and list(info.geometry.capture_layers) == [2, 30, 58]
    cfg = json.loads((drafts["kimi_sglang"] / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]  # SGLang adds 1
    assert capture_layers_of(drafts["kimi_sglang"], "sglang") == [2, 30, 58]
    assert validate_export(drafts["demo_vllm"], "vllm").engine == "vllm"
    assert capture_layers_of(drafts["demo_vllm"], "vllm") == [2, 4, 5]


# ------------------------------------------------------------------------------------------
# Exact command lines, one per profile


def test_sglang_generic_kimi_command(drafts):
    cmd = command_for(["server=sglang", *KIMI, f"server.speculative.draft_path={drafts['kimi_sglang']}"])
    assert cmd.argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.5",
        "--host", "127.0.0.1", "--port", "30000", "--tp-size", "1", "--dp-size", "1", "--dtype", "auto",
        "--trust-remote-code", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
        *kimi_spec(drafts["kimi_sglang"]),
    ]
    assert cmd.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert cmd.url == "http://127.0.0.1:30000" and cmd.health_paths == ("/health",)
    assert cmd.draft == str(drafts["kimi_sglang"])


def test_sglang_sm120_kimi_command(drafts):
    cmd = command_for(["server=sglang_sm120", *KIMI, f"server.speculative.draft_path={drafts['kimi_sglang']}"])
    assert cmd.argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.5",
        "--host", "127.0.0.1", "--port", "30000", "--tp-size", "8", "--dp-size", "1", "--dtype", "auto",
        "--mem-fraction-static", "0.85", "--trust-remote-code",
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
        "--attention-backend", "triton", "--moe-runner-backend", "triton",
        *kimi_spec(drafts["kimi_sglang"]),
    ]
    assert cmd.env == {"SGLANG_ENABLE_SPEC_V2": "1", "SGL_ENABLE_JIT_DEEPGEMM": "0"}
    # What sm120 needs, said independently of the pinned line.
    line = " ".join(cmd.argv)
    assert "--attention-backend triton" in line and "--speculative-algorithm EAGLE3 " in line
    assert not any(k in line.lower() for k in ("fa3", "flashmla", "trtllm", "deep_gemm", "deepgemm"))
    assert float(cmd.argv[cmd.argv.index("--mem-fraction-static") + 1]) <= 0.85


def test_sm120_fills_in_triton_and_memory_fraction_when_unset(drafts):
    cmd = command_for(["server=sglang_sm120", *KIMI, f"server.speculative.draft_path={drafts['kimi_sglang']}",
                       "server.kernels.attention_backend=null", "server.kernels.moe_runner_backend=null",
                       "server.mem_fraction_static=null"])
    assert cmd.argv[cmd.argv.index("--attention-backend") + 1] == "triton"
    assert cmd.argv[cmd.argv.index("--mem-fraction-static") + 1] == "0.85"
    assert "--moe-runner-backend" not in cmd.argv
    assert cmd.env["SGL_ENABLE_JIT_DEEPGEMM"] == "0"


def test_sglang_h200_kimi_command(drafts):
    cmd = command_for(["server=sglang_h200", *KIMI, f"server.speculative.draft_path={drafts['kimi_sglang']}"])
    assert cmd.argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.5",
        "--host", "127.0.0.1", "--port", "30000", "--tp-size", "8", "--dp-size", "1", "--dtype", "auto",
        "--mem-fraction-static", "0.85", "--trust-remote-code",
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
        "--attention-backend", "fa3",
        *kimi_spec(drafts["kimi_sglang"]),
    ]
    assert cmd.env == {"SGLANG_ENABLE_SPEC_V2": "1"}


def test_vllm_cpu_demo_command(drafts):
    cmd = command_for(["server=vllm", f"server.python={VLLM_PYTHON}",
                       f"server.speculative.draft_path={drafts['demo_vllm']}"])
    spec = '{"method":"eagle3","model":"%s","num_speculative_tokens":3}' % drafts["demo_vllm"]
    assert cmd.argv == [
        VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(asset_path("demo_target")),
        "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "1", "--data-parallel-size", "1",
        "--dtype", "bfloat16", "--max-model-len", "2048",
        "--reasoning-parser", "kimi_k2", "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2",
        "--speculative-config", spec, "--no-enable-chunked-prefill",
    ]
    # eagle3's vLLM plugin (EAGLE-3 for Gemma 3) comes first on the server's PYTHONPATH, the caller's after it
    env = dict(cmd.env)
    assert env.pop("PYTHONPATH").split(os.pathsep)[0] == str(VLLM_PLUGIN_DIR)
    assert (VLLM_PLUGIN_DIR / "eagle3_vllm_models-0.dist-info" / "entry_points.txt").read_text().splitlines() == [
        "[vllm.general_plugins]", "eagle3_models = eagle3_vllm_models:register"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "LD_PRELOAD": "/opt/vllm-env/lib/libiomp5.so"}
    assert cmd.health_paths == ("/health", "/v1/models")
    assert cmd.shell().startswith("LD_PRELOAD=/opt/vllm-env/lib/libiomp5.so PYTHONPATH=")
    assert " VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind /opt/vllm-env/bin/python -m " in cmd.shell()
    assert f"--speculative-config '{spec}'" in cmd.shell()  # pasteable: the JSON is quoted


def test_without_speculation_no_draft_flags_but_the_same_cpu_environment():
    vllm = command_for(["server=vllm", f"server.python={VLLM_PYTHON}", "server.speculative.algorithm=null"])
    assert "--speculative-config" not in vllm.argv
    # The baseline of a benchmark runs in the speculative server's environment: without Intel's
    # OpenMP preloaded the target alone decodes ~10x slower on vllm-cpu, faking a speedup.
    assert vllm.env.pop("PYTHONPATH").split(os.pathsep)[0] == str(VLLM_PLUGIN_DIR)
    assert vllm.env == {"LD_PRELOAD": "/opt/vllm-env/lib/libiomp5.so", "VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    sglang = command_for(["server=sglang", "server.speculative.algorithm=null"])
    assert not any(a.startswith("--speculative") for a in sglang.argv) and sglang.env == {}
    assert "--trust-remote-code" not in sglang.argv  # the demo target needs no custom code


def test_generate_launches_its_own_server_node_not_the_serving_one():
    """Stage generate hands the launcher `generate.server` (as extract does `extract.server`): an SGLang
    generation server on sm120 while `server` says vLLM serves the draft."""
    cfg = compose_config([*KIMI, "generate.backend=sglang", "server@generate.server=sglang_sm120", "server=vllm",
                          "generate.server.speculative.algorithm=null", "generate.server.port=31000"])
    assert check_config(cfg) == []
    settings = to_settings(cfg)
    cmd = build_command(launch_config(settings, "generate.server"))
    assert cmd.backend == "sglang" and cmd.port == 31000 and cmd.argv[cmd.argv.index("--attention-backend") + 1] == "triton"
    assert not any(a.startswith("--speculative") for a in cmd.argv)
    assert settings.server.backend == "vllm"  # the caller's config is untouched
    # speculative=False (bench's baseline, the extraction server): the node with speculation off, in a copy.
    assert settings.server.speculative.algorithm == "EAGLE3"
    baseline = launch_config(settings, "server", speculative=False)
    assert baseline.server.speculative.algorithm is None and settings.server.speculative.algorithm == "EAGLE3"
    assert baseline.server is not settings.server and baseline.model is settings.model
    with pytest.raises(TypeError, match="generate.http is not a server node"):
        launch_config(settings, "generate.http")


def test_user_env_wins_and_extra_args_come_last(drafts, tmp_path):
    cmd = command_for(["server=sglang", *KIMI, f"server.speculative.draft_path={drafts['kimi_sglang']}",
                       "+server.env.SGLANG_ENABLE_SPEC_V2=0", "+server.env.CUDA_VISIBLE_DEVICES='0,1'",
                       "server.extra_args=[--max-running-requests,64]", f"paths.hf_cache={tmp_path}"])
    assert cmd.env == {"SGLANG_ENABLE_SPEC_V2": "0", "CUDA_VISIBLE_DEVICES": "0,1", "HF_HUB_CACHE": str(tmp_path)}
    assert cmd.argv[-2:] == ["--max-running-requests", "64"]


def test_vllm_preload_follows_a_relative_interpreter(drafts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = command_for(["server=vllm", "server.python=.venv-vllm/bin/python",
                       f"server.speculative.draft_path={drafts['demo_vllm']}"])
    assert cmd.env["LD_PRELOAD"] == str(tmp_path / ".venv-vllm" / "lib" / "libiomp5.so")


# ------------------------------------------------------------------------------------------
# Guards: nothing is built for a config an engine would serve wrongly


def build_errors(overrides: list[str]) -> list[str]:
    with pytest.raises(ServerConfigError) as info:
        build_command(to_settings(compose_config(overrides)))
    return info.value.errors


def test_eagle_with_an_eagle3_draft_is_refused_with_the_validator_line(drafts):
    draft = drafts["kimi_sglang"]
    overrides = ["server=sglang_sm120", *KIMI, "server.speculative.algorithm=EAGLE",
                 f"server.speculative.draft_path={draft}"]
    line = speculative_algorithm_error("EAGLE", str(draft))
    assert line.startswith("server.speculative.algorithm: 'EAGLE' -- the draft is EAGLE-3") and "\n" not in line
    assert line.endswith("valid: EAGLE3")
    assert build_errors(overrides) == [line]
    assert line in check_config(compose_config(overrides))  # one rule, two callers


def test_eagle_guard_reads_the_actual_draft_directory(drafts, tmp_path):
    # The config names no draft here; the launcher is handed the export and still refuses EAGLE.
    cfg = to_settings(compose_config(["server=sglang", *KIMI, "server.speculative.algorithm=EAGLE"]))
    with pytest.raises(ServerConfigError) as info:
        sglang_command(cfg, drafts["kimi_sglang"])
    assert any("the draft is EAGLE-3" in e for e in info.value.errors)


def test_sglang_export_is_refused_by_vllm(drafts):
    errors = build_errors(["server=vllm", f"server.python={VLLM_PYTHON}",
                           f"server.speculative.draft_path={drafts['demo_sglang']}"])
    assert len(errors) == 1
    assert errors[0].startswith(f"server.speculative.draft_path: '{drafts['demo_sglang']}' -- ")
    assert "eagle3.engine: found 'sglang', expected 'vllm'" in errors[0]
    assert errors[0].endswith("valid: a draft export for vllm (stage=train writes draft/vllm in its output)")


def test_vllm_export_is_refused_by_sglang(drafts):
    errors = build_errors(["server=sglang", f"server.speculative.draft_path={drafts['demo_vllm']}"])
    assert len(errors) == 1 and "found 'vllm', expected 'sglang'" in errors[0]


def test_non_loopback_host_is_refused():
    overrides = ["server=sglang", "server.speculative.algorithm=null", "server.host=0.0.0.0"]
    expected = ("server.host: '0.0.0.0' -- servers this project launches bind loopback only; "
                "valid: 127.0.0.1, ::1 or localhost")
    assert build_errors(overrides) == [expected]
    # ... also when the public address comes in through extra_args.
    errors = build_errors(["server=vllm", "server.speculative.algorithm=null",
                           "server.extra_args=[--host,0.0.0.0]"])
    assert errors == ["server.extra_args: '--host' -- the launcher sets this flag from server.host "
                      "(and checks it there); valid: set server.host instead"]
    errors = build_errors(["server=sglang", "server.speculative.algorithm=null",
                           "server.extra_args=['--speculative-algorithm=EAGLE']"])
    assert len(errors) == 1 and errors[0].startswith("server.extra_args: '--speculative-algorithm=EAGLE'")


def test_draft_for_another_target_or_capture_is_refused(drafts):
    errors = build_errors(["server=sglang", *KIMI, "model.capture_layers=[2,30,57]",
                           f"server.speculative.draft_path={drafts['kimi_sglang']}"])
    assert len(errors) == 1
    assert ("sglang would capture layers [2, 30, 58] for this draft, but its fc must read layers [2, 30, 57]"
            in errors[0])
    # The demo draft served for Kimi: every mismatch at once, one line each.
    errors = build_errors(["server=sglang", *KIMI, f"server.speculative.draft_path={drafts['demo_sglang']}"])
    assert [e.split(" -- ")[1].split(":")[0] for e in errors] == [
        "sglang would capture layers [2, 4, 5] for this draft, but its fc must read layers [2, 30, 58] "
        "(model.capture_layers); valid",
        "trained for another target", "trained for another target", "trained for another target",
    ]
    assert all("\n" not in e for e in errors)


def test_speculation_without_a_draft_or_with_a_missing_one(tmp_path):
    errors = build_errors(["server=sglang", *KIMI])
    assert errors == ["server.speculative.draft_path: null -- speculative decoding needs a draft; valid: the path "
                      "of an export for sglang; stage=serve finds this config's train output itself; or "
                      "server.speculative.algorithm=null"]
    errors = build_errors(["server=sglang", *KIMI, f"server.speculative.draft_path={tmp_path / 'nope'}"])
    assert len(errors) == 1 and "not a directory, expected a draft export" in errors[0]


def test_all_launch_errors_are_reported_together(drafts):
    with pytest.raises(ServerConfigError) as info:
        build_command(to_settings(compose_config(["server=sglang_sm120", *KIMI, "server.host=10.0.0.1",
                                                  "server.kernels.attention_backend=fa3",
                                                  f"server.speculative.draft_path={drafts['demo_vllm']}"])))
    keys = [e.split(":")[0] for e in info.value.errors]
    assert keys == ["server.host", "server.kernels.attention_backend", "server.speculative.draft_path"]
    assert str(info.value).startswith("3 server errors:\n  server.host: '10.0.0.1'")


def test_hf_backend_has_no_server_command():
    errors = build_errors(["server=hf"])
    assert errors == ["server.backend: 'hf' -- not a server the launcher runs; "
                      "valid: sglang, vllm (e.g. server=sglang)"]


def test_vllm_cpu_bare_interpreter_not_on_path(drafts, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    errors = build_errors(["server=vllm", "server.python=python-vllm-missing",
                           f"server.speculative.draft_path={drafts['demo_vllm']}"])
    assert len(errors) == 1 and errors[0].startswith("server.python: 'python-vllm-missing' -- not found on PATH")
    baseline = build_errors(["server=vllm", "server.python=python-vllm-missing", "server.speculative.algorithm=null"])
    assert len(baseline) == 1 and baseline[0].startswith("server.python: 'python-vllm-missing' -- not found on PATH")


# ------------------------------------------------------------------------------------------
# Config rules added with the launchers (validate_config, all at once)


def errors_for(overrides: list[str]) -> list[str]:
    return check_config(compose_config(overrides))


def test_launcher_config_rules():
    assert errors_for(["server=sglang", "server.profile=cpu"]) == []  # serving the target alone is fine
    for stage in ("bench", "serve"):
        assert errors_for([f"stage={stage}", "server=sglang_cpu", "server.speculative.algorithm=EAGLE3"]) == [
            "server.speculative.algorithm: 'EAGLE3' -- SGLang has no EAGLE path on a CPU: its torch_native "
            "attention refuses EAGLE ('EAGLE is not supported in decode attention backend torch_native'), triton "
            "has no CPU driver and intel_amx needs AMX tiles and a CPU-built sgl-kernel; valid: null (the target "
            "alone), server=vllm on a CPU, or server=sglang on a GPU"]
    assert errors_for(["server=vllm", "server.kernels.attention_backend=triton"]) == [
        "server.kernels.attention_backend: 'triton' -- an SGLang kernel flag; the vLLM launcher would ignore it; "
        "valid: null with server.backend=vllm (vLLM flags go in server.extra_args)"]
    assert errors_for(["server=vllm", "server.speculative.eagle_topk=4"]) == [
        "server.speculative.eagle_topk: 4 -- vLLM drafts a chain of num_steps tokens; valid: 1"]
    assert errors_for(["server=sglang", "server.mem_fraction_static=1.5"]) == [
        "server.mem_fraction_static: 1.5 -- a fraction of the accelerator memory; valid: (0, 1] or null"]
    assert errors_for(["server=vllm", "server.vllm_cpu_kvcache_gb=0"]) == [
        "server.vllm_cpu_kvcache_gb: 0 -- must be a positive number; valid: > 0"]
    assert errors_for(["stage=serve"]) == [
        "server.backend: 'hf' -- stage=serve launches an HTTP server; valid: sglang, vllm (e.g. server=sglang)"]
    # The layer follows the serving engine: a draft for SGLang gets the plain layer by default...
    assert errors_for(["stage=serve", "server=sglang"]) == []
    # ...and asking SGLang for a vLLM-only variant is refused: SGLang would serve the plain layer.
    assert errors_for(["stage=serve", "server=sglang", "model.draft.norm_before_residual=true"]) == [
        "model.draft.norm_before_residual: true -- sglang cannot serve this draft layer variant (sglang's "
        "llama_eagle3 has no such option and would run the plain layer; vllm serves it), so the chain exports "
        "none for it; valid: false for sglang, or server.backend=vllm"]
    assert errors_for(["stage=serve", "server=sglang", "model.draft.norm_before_residual=false"]) == []
    assert errors_for(["stage=serve", "server=vllm"]) == []


def test_an_eager_vllm_cpu_launch_of_an_mla_target_turns_custom_ops_off():
    """vLLM's CPU rotary custom op is wrong on MLA in eager mode (greedy output diverges from
    transformers'): eager launches of an MLA target get custom ops off; compiled ones and Llama
    targets are left as they are."""
    common = ["server=vllm", f"server.python={VLLM_PYTHON}", "server.speculative.algorithm=null"]
    kimi = command_for(["model=demo_kimi", *common, "server.extra_args=[--enforce-eager]"])
    at = kimi.argv.index("--compilation-config")
    assert json.loads(kimi.argv[at + 1]) == {"custom_ops": ["none"]}
    assert "--trust-remote-code" in kimi.argv  # its tokenizer is remote code, as Kimi's is
    assert "--compilation-config" not in command_for(["model=demo_kimi", *common]).argv
    assert "--compilation-config" not in command_for([*common, "server.extra_args=[--enforce-eager]"]).argv
    # fp32 MLA on CPU: the reference MLA backend (the AMX one loads bf16/fp16 weights only).
    fp32 = command_for(["model=demo_kimi", *common, "server.dtype=float32"]).argv
    assert fp32[fp32.index("--attention-backend") + 1] == "CPU_MLA"
    assert "--attention-backend" not in kimi.argv and "--attention-backend" not in command_for(
        [*common, "server.dtype=float32"]).argv


@pytest.mark.parametrize("model,attention,server,refused", [
    ("demo_kimi", "llama", "vllm", "a llama-attention draft beside an MLA target"),
    ("demo_kimi", "mla", "vllm", None),
    ("demo_kimi", "llama", "vllm_gpu", None),  # GPUs serve a Llama-style draft on an MLA target
    ("demo", "llama", "vllm", None),
])
def test_vllm_cpu_serves_a_draft_only_with_the_targets_kind_of_attention(model, attention, server, refused):
    errors = check_config(compose_config(["stage=bench", f"model={model}", f"model.draft.attention={attention}",
                                          f"server={server}", f"server.python={VLLM_PYTHON}"]))
    pairing = [e for e in errors if "share no block size" in e]
    if refused is None:
        assert pairing == []
    else:
        assert pairing == [e for e in errors if e.startswith(f"model.draft.attention: '{attention}' -- vLLM's CPU build "
                                                             f"cannot serve {refused}")] != []
        assert "valid: model.draft.attention=mla, or server=vllm_gpu on a GPU" in pairing[0]
