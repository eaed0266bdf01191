"""Your own target and your own data, in one command (issue 16): `model=auto` + `dataset=files`.

A new user has a local Llama checkpoint with its own chat template and a jsonl of OpenAI-style
conversations. Naming the checkpoint, the files and their track is all the chain needs: the
geometry comes from the checkpoint's config.json, the capture ids from EAGLE-3's rule, the schema
from the file's first records, and the exports load back with the derived capture ids.
"""

from __future__ import annotations

import json
import time

import pytest

from eagle3.artifacts import Manifest
from eagle3.draft.export import capture_layers_of, load_exported
from eagle3.layer_ids import default_capture_layers, engine_aux_layer_ids
from tests.conftest import run_cli
from tests.own_target import build_tiny_llama, vocab_size_of, write_conversations

LAYERS, HIDDEN = 8, 64


@pytest.mark.slow
def test_stage_all_on_my_llama_and_my_jsonl_with_only_path_files_and_track(tmp_path):
    target = build_tiny_llama(tmp_path / "models" / "my-llama", layers=LAYERS, hidden=HIDDEN)
    chats = write_conversations(tmp_path / "data" / "chats.jsonl", 40)
    root = tmp_path / "artifacts"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    started = time.perf_counter()
    done = run_cli(["stage=all", "model=auto", f"model.path={target}", "dataset=files", f"dataset.files=[{chats}]",
                    "dataset.track=target_native", f"paths.root={root}"], cwd=cwd)
    wall = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert f"dataset=files: {chats} -> source chats, schema openai_messages" in log, log[-3000:]

    derived = default_capture_layers(LAYERS)  # [2, 4, 5]: nothing on the command line said so
    [tokenized] = [Manifest.load(d) for d in (root / "tokenize").iterdir()]
    assert tokenized.counts["out"] == 40 and not tokenized.counts["rejected"]
    [trained] = list((root / "train").iterdir())
    # The layer follows the serving engine (eagle3.engines.SERVING_LAYER): with no engine named
    # (server=hf) a model=auto draft gets vLLM's winning variant, so it is exported for vLLM alone.
    assert sorted(p.name for p in (trained / "draft").iterdir()) == ["vllm"]
    exported_layer = json.loads((trained / "draft" / "vllm" / "config.json").read_text())
    assert exported_layer["norm_before_residual"] is True and exported_layer["fc_norm"] is True
    for engine in ("vllm",):
        export = trained / "draft" / engine
        geometry, written_for, _ = load_exported(export)
        assert written_for == engine and list(geometry.capture_layers) == derived
        assert geometry.hidden_size == HIDDEN and geometry.fc_in_features == len(derived) * HIDDEN
        assert geometry.vocab_size == geometry.draft_vocab_size == vocab_size_of(target)  # a small vocab: all of it
        assert capture_layers_of(export, engine) == derived
        exported = json.loads((export / "config.json").read_text(encoding="utf-8"))
        ids = exported.get("eagle_aux_hidden_state_layer_ids") or exported["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"]
        assert ids == engine_aux_layer_ids(derived, engine)
    [evaluated] = [Manifest.load(d) for d in (root / "eval").iterdir()]
    assert evaluated.status == "complete"
    print(f"stage=all on the tiny Llama: {wall:.1f} s")


def test_a_file_smaller_than_the_eval_split_stops_at_merge_in_one_line(tmp_path):
    """Ten conversations under the demo's data.eval_size=16: say so at merge, not as a traceback in train."""
    target = build_tiny_llama(tmp_path / "my-llama", layers=LAYERS, hidden=HIDDEN)
    chats = write_conversations(tmp_path / "few.jsonl", 10)
    args = ["stage=all", "model=auto", f"model.path={target}", "dataset=files", f"dataset.files=[{chats}]",
            "dataset.track=target_native", f"paths.root={tmp_path / 'artifacts'}"]
    stopped = run_cli(args, cwd=tmp_path)
    assert stopped.returncode == 3 and "Traceback" not in stopped.stderr, stopped.stderr[-2000:]
    [line] = [x for x in stopped.stderr.splitlines() if x.startswith("eagle3:")]
    assert line == ("eagle3: merge files: all 10 samples went to the eval split (data.eval_size=16), leaving nothing "
                    "to train on; lower data.eval_size (e.g. data.eval_size=2) or add data")
    assert not (tmp_path / "artifacts" / "train").exists()
