"""One target identity in every fingerprint: new when the weights change, blind to where they lie.

And the reverse for datasets: a hub source's `revision` counts, its description and mixture weight
do not (they are not prep's business).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import eagle3.target_info as target_info
from eagle3.paths import asset_path
from eagle3.stages import StageContext
from eagle3.stages.extract import store_spec
from eagle3.stages.generate import GENERATE
from eagle3.stages.prep import PREP
from eagle3.target_info import target_identity
from tests.conftest import FIXTURES, compose_settings


def _copy_demo_target(where: Path) -> Path:
    shutil.copytree(asset_path("demo_target"), where)
    return where


def _retrain_same_shape(checkpoint: Path) -> None:
    """What a retraining leaves: the same tensors, names, shapes and file sizes, other values."""
    from safetensors.torch import load_file

    tensors = load_file(checkpoint / "model.safetensors")
    save_file({k: (v + 0.01).to(v.dtype) for k, v in tensors.items()}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})


def _generate_config(path: Path, root: Path, *extra: str):
    cfg = compose_settings([f"model.path={path}", f"paths.root={root}", "generate.backend=vllm", "dataset=demo_prompts",
                          *extra])
    return GENERATE.unit_config(cfg, next(iter(cfg.dataset.sources)))


def test_generate_fingerprint_follows_the_weights_not_the_path(tmp_path):
    first = _copy_demo_target(tmp_path / "a" / "target")
    moved = _copy_demo_target(tmp_path / "elsewhere" / "target-copy")
    size = (first / "model.safetensors").stat().st_size
    before = _generate_config(first, tmp_path / "art")
    assert _generate_config(moved, tmp_path / "art") == before  # another path, same weights: reused
    _retrain_same_shape(first)
    assert (first / "model.safetensors").stat().st_size == size
    assert _generate_config(first, tmp_path / "art") != before  # same names and sizes, new weights
    # How the engine serves the target changes what it generates, so it counts too.
    assert _generate_config(moved, tmp_path / "art", "generate.server.dtype=float16") != before
    assert _generate_config(moved, tmp_path / "art", "generate.server.context_length=4096") != before
    assert _generate_config(moved, tmp_path / "art", "generate.server.reasoning_parser=deepseek_r1") != before
    # The engine that serves the draft does not generate: it changes nothing here.
    assert _generate_config(moved, tmp_path / "art", "server=sglang", "server.dtype=float16") == before


def _big_checkpoint(directory: Path, seed: int = 0, bump: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {f"layers.{i}.w": torch.randn(64, 64, generator=gen) for i in range(8)}
    if bump is not None:  # a fine-tune that touched one tensor only, elsewhere than its first bytes
        tensors[bump] = tensors[bump].clone()
        tensors[bump][32:, :] += 1.0
    save_file(tensors, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    return directory


def test_a_large_checkpoint_is_sampled_per_tensor_and_still_notices_a_one_tensor_fine_tune(tmp_path, monkeypatch):
    monkeypatch.setattr(target_info, "FULL_HASH_LIMIT", 1024)  # every checkpoint here counts as large
    monkeypatch.setattr(target_info, "SMALL_FILE_BYTES", 512)
    base = target_identity(str(_big_checkpoint(tmp_path / "base")))
    assert base["weights"]["hashed"].startswith("small files + safetensors headers")
    assert target_identity(str(_big_checkpoint(tmp_path / "same"))) == base  # same bytes elsewhere
    tuned = target_identity(str(_big_checkpoint(tmp_path / "tuned", bump="layers.5.w")))
    assert tuned != base and tuned["weights"]["bytes"] == base["weights"]["bytes"]
    reads = []
    real_open = open

    def counting_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "b" in mode and str(path).endswith(".safetensors"):
            original = handle.read
            handle.read = lambda n=-1: (reads.append(n), original(n))[1]
        return handle

    monkeypatch.setattr("builtins.open", counting_open)
    target_identity(str(_big_checkpoint(tmp_path / "fresh", seed=1)))
    assert -1 not in reads and sum(reads) < 8 * 64 * 64 * 4 / 2  # windows, not the whole file


def test_extract_store_identity_changes_with_same_shape_weights_above_the_full_hash_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(target_info, "FULL_HASH_LIMIT", 1024)
    monkeypatch.setattr(target_info, "SMALL_FILE_BYTES", 512)
    target = _copy_demo_target(tmp_path / "target")
    cfg = compose_settings([f"model.path={target}", f"paths.root={tmp_path / 'art'}"])
    before = store_spec(cfg).fingerprint
    _retrain_same_shape(target)
    assert store_spec(cfg).fingerprint != before


def test_a_hub_id_is_named_by_the_commit_the_local_cache_resolves(tmp_path):
    cache = tmp_path / "hub"
    refs = cache / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    ident = target_identity("org/model", None, str(cache))
    assert ident == {"hub_id": "org/model", "revision": "main", "commit": "a" * 40}
    (refs / "main").write_text("b" * 40)  # upstream moved and the cache followed: a new identity
    assert target_identity("org/model", None, str(cache))["commit"] == "b" * 40
    assert target_identity("org/model", "c" * 40, str(cache))["commit"] == "c" * 40
    assert target_identity("org/other", None, str(cache)) == {"hub_id": "org/other", "revision": "main"}


def test_a_hub_snapshot_directory_is_named_by_its_commit(tmp_path):
    snapshot = _copy_demo_target(tmp_path / "models--org--m" / "snapshots" / ("d" * 40))
    ident = target_identity(str(snapshot))
    assert ident["weights"]["commit"] == "d" * 40 and ident["weights"]["hashed"].startswith("hub commit")


def _prep_dir(tmp_path: Path, *overrides: str) -> Path:
    cfg = compose_settings([f"paths.root={tmp_path / 'art'}", "dataset=ultrachat", *overrides])
    return PREP.locate(cfg, StageContext(root=tmp_path / "art", run_dir=tmp_path), "ultrachat")[0]


def test_prep_fingerprint_counts_the_dataset_revision_but_not_description_or_weight(tmp_path):
    base = _prep_dir(tmp_path)
    assert _prep_dir(tmp_path, "dataset.sources.ultrachat.description=another note") == base
    assert _prep_dir(tmp_path, "dataset.sources.ultrachat.weight=3.0") == base
    assert _prep_dir(tmp_path, "dataset.sources.ultrachat.thinking=false") == base
    assert _prep_dir(tmp_path, "dataset.sources.ultrachat.revision=" + "e" * 40) != base


@pytest.mark.parametrize("pinned", [None, "f" * 40])
def test_a_hub_dataset_is_read_at_one_commit_in_the_first_run_and_every_resume(tmp_path, monkeypatch, pinned):
    import datasets

    import eagle3.stages.prep as prep_stage

    rows = [json.loads(line) for line in (FIXTURES / "raw" / "ultrachat.jsonl")
            .read_text().splitlines()]
    calls, latest = [], iter(["1" * 40, "2" * 40])  # upstream moves between the two runs
    monkeypatch.setattr(prep_stage, "latest_dataset_commit", lambda hub_id: next(latest))

    def load_dataset(*args, **kwargs):
        calls.append(kwargs["revision"])
        if len(calls) == 1:
            raise KeyboardInterrupt("killed mid-scan")
        return iter(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    overrides = [f"paths.root={tmp_path / 'art'}", "dataset=ultrachat"]
    if pinned:
        overrides.append(f"dataset.sources.ultrachat.revision={pinned}")
    cfg = compose_settings(overrides)
    ctx = StageContext(root=tmp_path / "art", run_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        PREP(cfg, ctx)
    [manifest] = PREP(cfg, ctx)
    assert calls == [pinned or "1" * 40] * 2  # the resume reads the version the first run started on
    assert manifest.status == "complete"
    assert ((manifest.dir / "hub_revision.json").is_file()) is (pinned is None)
