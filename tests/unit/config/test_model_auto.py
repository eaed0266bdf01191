"""model=auto: a target named only by `model.path` gets its geometry from its own config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eagle3.cli import check_config
from eagle3.paths import PROJECT_ROOT
from tests.conftest import compose_config, run_cli

DEMO_TARGET = PROJECT_ROOT / "eagle3" / "assets" / "demo_target"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# What the user would have to set by hand when the checkpoint's config.json cannot be read.
TARGET_KEYS = ("model.num_layers", "model.hidden_size", "model.vocab_size", "model.capture_layers")


def _save_llama(directory: Path, num_layers: int = 8, vocab_size: int = 1000) -> Path:
    """A random-weight Llama checkpoint with the demo tokenizer's files beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=num_layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                         intermediate_size=128, vocab_size=vocab_size, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_TARGET / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return _save_llama(tmp_path_factory.mktemp("ckpt") / "my-llama")


def _run(tmp: Path, *args: str):
    """The entrypoint from an unrelated cwd, offline (no test may reach the hub)."""
    workdir = tmp / "elsewhere"
    workdir.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in OFFLINE.items():
            mp.setenv(key, value)
        mp.setenv("HF_HOME", str(tmp / "hf_home"))  # an empty hub cache: nothing to fall back on
        return run_cli([*args, f"paths.root={tmp / 'artifacts'}"], cwd=workdir)


def _error_lines(stderr: str) -> list[str]:
    return [ln.strip() for ln in stderr.splitlines() if ln.startswith("  ")]


def test_plan_prints_the_geometry_read_from_config_json(llama, tmp_path):
    result = _run(tmp_path, "stage=plan", "model=auto", f"model.path={llama}")
    assert result.returncode == 0, result.stderr
    assert (f"model: my-llama (auto from {llama}/config.json): 8 layers, hidden 64, vocab 1000, capture [2, 4, 5], "
            "draft vocab 1000, fc 192") in result.stdout
    [run_dir] = (tmp_path / "artifacts" / "runs").iterdir()
    header = json.loads((run_dir / "plan.json").read_text())["header"]
    assert header["model_source"] == f"{llama}/config.json" and header["num_layers"] == 8


def test_derived_values_are_plain_values_downstream(llama):
    cfg = compose_config(["model=auto", f"model.path={llama}"])
    assert check_config(cfg) == []
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert {k: model[k] for k in ("name", "num_layers", "hidden_size", "vocab_size", "capture_layers")} == {
        "name": "my-llama", "num_layers": 8, "hidden_size": 64, "vocab_size": 1000, "capture_layers": [2, 4, 5]}
    # The schema's draft vocab (32000) exceeds this target's: the draft takes the whole target vocab.
    assert model["draft"]["vocab_size"] == 1000 and model["draft"]["fc_in_features"] == 3 * 64


def test_a_target_with_a_large_vocab_keeps_the_default_draft_vocab(tmp_path):
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}))
    cfg = compose_config(["model=auto", f"model.path={tmp_path / 'big'}"])
    assert check_config(cfg) == []
    assert list(cfg.model.capture_layers) == [2, 16, 29] and cfg.model.draft.vocab_size == 32000
    assert cfg.model.draft.fc_in_features == 3 * 4096


def test_the_language_model_under_text_config_is_read(tmp_path):
    inner = {"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 4, "intermediate_size": 256, "vocab_size": 2048}
    wrapper = tmp_path / "wrapped"
    wrapper.mkdir()
    (wrapper / "config.json").write_text(json.dumps(
        {"model_type": "some_vlm", "hidden_size": 999, "vocab_size": 5, "language_config": inner}))
    cfg = compose_config(["model=auto", f"model.path={wrapper}", "model.text_config_key=language_config"])
    assert check_config(cfg) == []
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.vocab_size) == (12, 128, 2048)
    assert list(cfg.model.capture_layers) == [2, 6, 9] and cfg.model.draft.fc_in_features == 3 * 128


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(tmp: Path) -> Path:
    """A hub cache holding `acme/Tiny-Chat`'s config.json at COMMIT (what a download leaves); its snapshot dir."""
    repo = tmp / "hub" / "models--acme--Tiny-Chat"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(
        {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 64, "num_attention_heads": 4,
         "vocab_size": 4000}))
    return repo / "snapshots" / COMMIT


def test_a_hub_id_is_read_from_the_hub_cache_offline(tmp_path):
    snapshot = _hub_cache(tmp_path)
    result = _run(tmp_path, "stage=plan", "model=auto", "model.path=acme/Tiny-Chat",
                  f"paths.hf_cache={tmp_path / 'hub'}")
    assert result.returncode == 0, result.stderr
    assert (f"model: Tiny-Chat (auto from {snapshot}/config.json): 16 layers, hidden 64, "
            "vocab 4000, capture [2, 8, 13], draft vocab 4000, fc 192") in result.stdout


def test_values_given_for_a_hub_id_are_checked_against_its_cached_config(tmp_path):
    _hub_cache(tmp_path)
    cfg = compose_config(["model=auto", "model.path=acme/Tiny-Chat", f"paths.hf_cache={tmp_path / 'hub'}",
                          "model.num_layers=7", "model.hidden_size=64", "model.vocab_size=4000"])
    assert check_config(cfg) == ["model.num_layers: 7 -- acme/Tiny-Chat/config.json says num_hidden_layers=16; "
                                 "valid: 16"]


def test_a_value_the_user_gives_is_checked_against_the_checkpoint(llama, tmp_path):
    result = _run(tmp_path, "stage=plan", "model=auto", f"model.path={llama}", "model.num_layers=7")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert _error_lines(result.stderr) == [
        f"model.num_layers: 7 -- {llama}/config.json says num_hidden_layers=8; valid: 8"]


@pytest.mark.parametrize("path", ["missing_dir", "nobody/no-such-model"])
def test_an_unreadable_config_names_the_keys_to_set(tmp_path, path):
    path = str(tmp_path / path) if path == "missing_dir" else path
    result = _run(tmp_path, "stage=plan", "model=auto", f"model.path={path}")
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr and "InterpolationResolutionError" not in result.stderr
    lines = _error_lines(result.stderr)
    assert [ln.split(":")[0] for ln in lines] == list(TARGET_KEYS), result.stderr
    assert all(path in ln and "config.json" in ln and "valid: set " in ln for ln in lines), lines


def test_values_given_for_an_unreadable_checkpoint_are_enough(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        cfg = compose_config(["model=auto", f"model.path={tmp_path / 'nowhere'}", "model.name=mine",
                              "model.num_layers=32", "model.hidden_size=4096", "model.vocab_size=128256"])
        assert check_config(cfg) == []
    assert list(cfg.model.capture_layers) == [2, 16, 29] and cfg.model.draft.fc_in_features == 12288


def test_a_target_too_small_for_the_capture_rule_says_to_set_capture_layers(tmp_path):
    small = _save_llama(tmp_path / "small", num_layers=6)
    result = _run(tmp_path, "stage=plan", "model=auto", f"model.path={small}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = _error_lines(result.stderr)
    assert line.startswith("model.capture_layers: ") and "[2, 3, 3]" in line and "6-layer" in line
    assert "valid: set model.capture_layers" in line
    cfg = compose_config(["model=auto", f"model.path={small}", "model.capture_layers=[1,3,5]"])
    assert check_config(cfg) == [] and cfg.model.draft.fc_in_features == 3 * 64


def test_a_config_json_without_the_key_names_it(tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "hidden_size": 64,
                                                               "vocab_size": 1000}))
    errors = check_config(compose_config(["model=auto", f"model.path={tmp_path / 'odd'}"]))
    assert [e.split(":")[0] for e in errors] == ["model.num_layers", "model.capture_layers"], errors
    assert f"{tmp_path / 'odd'}/config.json has no positive integer num_hidden_layers" in errors[0]
    assert errors[0].endswith("valid: set model.num_layers (an integer), or a model.path whose config.json can be read")


def test_model_auto_without_a_path_asks_for_one():
    errors = check_config(compose_config(["model=auto"]))
    assert len(errors) == 1 and errors[0].startswith("model.path: '???' -- has no value"), errors


@pytest.mark.parametrize(("directory", "name"), [("my llama (v2)", "my_llama__v2_"), (".hidden-7b", "hidden-7b")])
def test_the_name_is_a_safe_directory_name(tmp_path, directory, name):
    (tmp_path / directory).mkdir()
    shutil.copy(DEMO_TARGET / "config.json", tmp_path / directory / "config.json")
    cfg = compose_config(["model=auto", f"model.path='{tmp_path / directory}'"])
    assert cfg.model.name == name and check_config(cfg) == []


def test_the_dtype_is_the_one_the_checkpoint_was_saved_in(tmp_path):
    """A float32 test model runs in float32; a checkpoint without a saved dtype gets the schema's default."""
    checkpoint = _save_llama(tmp_path / "f32")
    assert compose_config(["model=auto", f"model.path={checkpoint}"]).model.dtype == "float32"
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("torch_dtype", None), config.pop("dtype", None)
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert compose_config(["model=auto", f"model.path={checkpoint}"]).model.dtype == "bfloat16"
    assert compose_config(["model=auto", f"model.path={checkpoint}", "model.dtype=float16"]).model.dtype == "float16"
