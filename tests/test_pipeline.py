"""The demo chain end to end through the entrypoint, and the skip-if-complete rerun."""

from __future__ import annotations

import pytest
import torch

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.stages import CHAIN
from tests.conftest import SMALL_DEMO_DATA

SMALL = (
    *SMALL_DEMO_DATA,
    "train.max_epochs=2",
    "eval.num_prompts=2",
    "eval.max_new_tokens=24",
)


def manifests(root, stage):
    return [Manifest.load(d) for d in sorted((root / stage).iterdir())]


@pytest.mark.slow
def test_stage_all_runs_the_chain_then_skips_everything(cli, tmp_path):
    root = tmp_path / "artifacts"
    first = cli("stage=all", *SMALL, root=root)
    assert first.returncode == 0, first.stderr[-3000:]
    for stage in CHAIN:
        found = manifests(root, stage.name)
        assert found and all(m.status == "complete" for m in found), stage.name
        for m in found:
            rejected = sum(m.counts["rejected"].values())
            assert m.counts["in"] == m.counts["out"] + rejected, (stage.name, m.counts)

    [merged] = manifests(root, "merge")
    train = list(read_jsonl(merged.dir / "train.jsonl"))
    evals = list(read_jsonl(merged.dir / "eval.jsonl"))
    assert len(evals) == 4 and train
    assert {r["source"] for r in train + evals} == {"demo_native", "demo_prompts"}
    for record in train[:5]:
        assert len(record["input_ids"]) == len(record["loss_mask"]) == record["seq_len"]
        assert 0 < sum(record["loss_mask"]) < record["seq_len"]

    [vocab] = manifests(root, "vocab")
    d2t = torch.load(vocab.dir / "d2t.pt", weights_only=True)
    t2d = torch.load(vocab.dir / "t2d.pt", weights_only=True)
    assert d2t.shape == (2048,) and t2d.shape == (8192,) and int(t2d.sum()) == 2048
    assert 0.9 < vocab.extra["coverage_train"] <= 1.0

    second = cli("stage=all", *SMALL, root=root)
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    for stage in CHAIN:
        assert f"[{stage.name}]" in log and "complete, reusing" in log
    assert log.count("complete, reusing") == sum(len(manifests(root, s.name)) for s in CHAIN)
