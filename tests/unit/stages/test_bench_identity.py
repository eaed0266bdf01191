"""Stage bench keys a draft named by `server.speculative.draft_path` by its bytes, not its path.

A draft retrained into the same directory (a `force=true` train, a side-by-side rerun) must be
benchmarked again: keyed by the path, the old draft's acceptance came back for the new one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle3.stages.bench import BENCH
from tests.conftest import compose_settings


def _write_draft(directory: Path, value: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    save_file({"fc.weight": torch.full((4, 8), value)}, str(directory / "model.safetensors"))
    return directory


def _bench_key(draft: Path) -> dict:
    config = compose_settings(["stage=bench", "server=vllm", f"server.speculative.draft_path={draft}"])
    return BENCH.unit_config(config, config.dataset.name)


def test_a_draft_retrained_at_the_same_path_is_a_new_bench(tmp_path):
    draft = _write_draft(tmp_path / "export", 1.0)
    before = _bench_key(draft)
    assert _bench_key(draft) == before  # the same bytes: the same bench, reused
    _write_draft(draft, 2.0)  # same names and sizes, new weights
    assert _bench_key(draft) != before


def test_moving_a_draft_keeps_its_bench(tmp_path):
    draft = _write_draft(tmp_path / "export", 1.0)
    before = _bench_key(draft)
    moved = tmp_path / "elsewhere" / "export"
    moved.parent.mkdir()
    shutil.copytree(draft, moved)
    assert _bench_key(moved) == before


def test_the_chains_own_draft_is_keyed_by_its_train_input_not_by_a_path():
    config = compose_settings(["stage=bench", "server=vllm"])
    assert "draft" not in BENCH.unit_config(config, config.dataset.name)
