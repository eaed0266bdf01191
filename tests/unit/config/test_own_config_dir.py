"""A team's own config directory next to the package's (`--config-dir`, `hydra.searchpath`).

Issue 16: a new user keeps `model/`, `dataset/` and `experiment/` YAMLs for their own target and
data in a directory of their own, outside the checkout, and runs the package's entrypoint with
it. Hydra puts that directory on the config search path after the package's `conf/`: its group
options are listed and composed next to the package's, and where both have a file of the same
name the package's is the one found (the user's is silently shadowed) -- asserted below so a
change of that precedence is noticed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.draft.export import capture_layers_of, load_exported
from eagle3.layer_ids import engine_aux_layer_ids
from tests.conftest import run_cli
from tests.own_target import build_tiny_llama, vocab_size_of, write_conversations

CAPTURE = [2, 4, 5]
HIDDEN = 64
DRAFT_VOCAB = 1024


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_team_conf(conf: Path, target: Path, chats: Path) -> None:
    """The three YAMLs of the README's worked example, pointing at `target` and `chats`."""
    _write(conf / "model" / "tiny_llama.yaml", f"""\
# Our own target: a local Llama checkpoint with its own chat template (tokenizer_config / chat_template.jinja).
# Usage: python scripts/run.py --config-dir {conf} stage=plan model=tiny_llama
name: tiny_llama
path: {target}
dtype: float32
num_layers: 8
hidden_size: {HIDDEN}
vocab_size: {vocab_size_of(target)}
capture_layers: {CAPTURE}
training_chat_template: null  # null = the tokenizer's own template renders the training text
draft:
  vocab_size: {DRAFT_VOCAB}
  fc_in_features: {len(CAPTURE) * HIDDEN}
""")
    _write(conf / "dataset" / "my_chats.yaml", f"""\
# Our own chats: OpenAI `messages` jsonl already answered by our target, trained on as they are.
# Usage: python scripts/run.py --config-dir {conf} stage=prep dataset=my_chats model=tiny_llama
name: my_chats
sources:
  my_chats:
    track: target_native
    schema: openai_messages
    data_files: [{chats}]
    thinking: false
""")
    _write(conf / "experiment" / "my_run.yaml", f"""\
# @package _global_
# Our tiny Llama on our chats, sized to run the whole chain in a minute or two on a CPU.
# Usage: python scripts/run.py --config-dir {conf} experiment=my_run stage=all
defaults:
  - override /model: tiny_llama
  - override /dataset: my_chats

data:
  eval_size: 4
train:
  max_epochs: 1
  ttt_steps: 3
  eval_every_n_epochs: 1
eval:
  num_prompts: 2
  max_new_tokens: 16
""")


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A user's checkout-independent world: target, chats and config dir, plus a cwd that is none of them."""
    base = tmp_path_factory.mktemp("team")
    target = build_tiny_llama(base / "checkpoints" / "tiny-llama")
    chats = write_conversations(base / "data" / "chats.jsonl", 40)
    conf = base / "conf"
    write_team_conf(conf, target, chats)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return {"base": base, "target": target, "chats": chats, "conf": conf, "cwd": elsewhere}


def _job_config(team, *args: str) -> dict:
    """The composed job config (`--cfg job`) of the entrypoint run with `args`."""
    done = run_cli(["--cfg", "job", *args], cwd=team["cwd"])
    assert done.returncode == 0, done.stderr[-3000:]
    return yaml.safe_load(done.stdout)


def test_user_group_options_compose_next_to_the_packages(team, tmp_path):
    root = tmp_path / "artifacts"
    done = run_cli(["--config-dir", str(team["conf"]), "model=tiny_llama", "dataset=demo", "stage=plan",
                    f"paths.root={root}"], cwd=team["cwd"])
    assert done.returncode == 0, done.stderr[-3000:]
    [plan] = root.glob("runs/*_plan/plan.json")
    assert "tiny_llama" in plan.read_text(encoding="utf-8")

    cfg = _job_config(team, "--config-dir", str(team["conf"]), "model=demo", "dataset=my_chats")
    assert cfg["model"]["name"] == "demo" and cfg["dataset"]["name"] == "my_chats"
    assert cfg["dataset"]["sources"]["my_chats"]["data_files"] == [str(team["chats"])]


def test_a_relative_config_dir_is_read_from_the_working_directory(team):
    done = run_cli(["--cfg", "job", "--config-dir", "conf", "experiment=my_run"], cwd=team["base"])
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = yaml.safe_load(done.stdout)
    assert cfg["model"]["name"] == "tiny_llama" and cfg["train"]["max_epochs"] == 1


def test_hydra_searchpath_adds_the_same_directory(team):
    cfg = _job_config(team, f"hydra.searchpath=[file://{team['conf']}]", "model=tiny_llama")
    assert cfg["model"]["name"] == "tiny_llama" and cfg["model"]["capture_layers"] == CAPTURE


def test_a_package_option_shadows_a_same_named_user_yaml(team, tmp_path):
    conf = tmp_path / "conf"
    _write(conf / "model" / "demo.yaml", "# A user's model/demo.yaml: never found, conf/model/demo.yaml is.\n"
                                         "name: not_the_package_demo\n")
    for where in (["--config-dir", str(conf)], [f"hydra.searchpath=[file://{conf}]"]):
        cfg = _job_config(team, *where, "model=demo")
        assert cfg["model"]["name"] == "demo", where


def test_a_misspelt_user_option_lists_the_users_options_too(team):
    done = run_cli(["--config-dir", str(team["conf"]), "model=tiny_lama", "stage=plan"], cwd=team["cwd"])
    assert done.returncode == 1
    err = done.stderr
    assert "Could not find 'model/tiny_lama'" in err and "tiny_llama" in err and "kimi_k25" in err


def test_a_missing_config_dir_is_named(team, tmp_path):
    missing = tmp_path / "no_such_conf"
    done = run_cli(["--config-dir", str(missing), "stage=plan"], cwd=team["cwd"])
    assert done.returncode == 1
    assert f"Additional config directory '{missing}' not found" in done.stderr


@pytest.mark.slow
def test_stage_all_with_a_user_config_dir_exports_the_yamls_capture(team, tmp_path):
    root = tmp_path / "artifacts"
    # SGLang's layer (fc_norm alone), so both engines get an export (server=hf defaults to vLLM's
    # norm_before_residual too, exported for vLLM only: eagle3.engines.SERVING_LAYER).
    done = run_cli(["--config-dir", str(team["conf"]), "experiment=my_run", "stage=all", f"paths.root={root}",
                    "model.draft.norm_before_residual=false"], cwd=team["cwd"])
    assert done.returncode == 0, done.stderr[-3000:]

    # The tokenizer's own template rendered the training text: Llama-3 headers, masks on the answers.
    [tokenized] = [Manifest.load(d) for d in (root / "tokenize").iterdir()]
    assert sum(tokenized.counts["rejected"].values()) == 0 and tokenized.counts["out"] == 40
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(team["target"]))
    record = next(iter(read_jsonl(tokenized.dir / tokenized.extra["file"])))
    text = tokenizer.decode(record["input_ids"])
    answers = tokenizer.decode([t for t, m in zip(record["input_ids"], record["loss_mask"]) if m])
    assert text.startswith("<|begin_of_text|><|start_header_id|>") and "<|im_" not in text
    assert answers.startswith("Step 1:") and answers.endswith("<|eot_id|>") and "<|start_header_id|>" not in answers

    [trained] = list((root / "train").iterdir())
    for engine in ("vllm", "sglang"):
        export = trained / "draft" / engine
        geometry, written_for, _ = load_exported(export)
        assert written_for == engine and list(geometry.capture_layers) == CAPTURE
        assert geometry.vocab_size == vocab_size_of(team["target"]) and geometry.draft_vocab_size == DRAFT_VOCAB
        assert capture_layers_of(export, engine) == CAPTURE
        exported = json.loads((export / "config.json").read_text(encoding="utf-8"))
        ids = exported.get("eagle_aux_hidden_state_layer_ids") or exported["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"]
        assert ids == engine_aux_layer_ids(CAPTURE, engine) == ([2, 4, 5] if engine == "vllm" else [1, 3, 4])
    [evaluated] = [Manifest.load(d) for d in (root / "eval").iterdir()]
    assert evaluated.status == "complete"
