"""The demo chain end to end through the entrypoint, and the skip-if-complete rerun.

The chain is the session's demo chain (`tests.conftest.demo_chain`: `stage=all` on the default
data, a shorter schedule); this test checks what it produced, then runs the same command again.
"""

from __future__ import annotations

import re

import pytest
import torch

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.stages import CHAIN
from tests.conftest import compose_config, run_cli, unit_dirs
from tests.emitted_ids import assert_trained_on_emitted_ids


@pytest.mark.slow
def test_stage_all_runs_the_chain_then_skips_everything(demo_chain):
    root = demo_chain.root
    for stage in CHAIN:
        found = [Manifest.load(d) for d in demo_chain.units[stage.name]]
        assert found and all(m.status == "complete" for m in found), stage.name
        for m in found:
            rejected = sum(m.counts["rejected"].values())
            assert m.counts["in"] == m.counts["out"] + rejected, (stage.name, m.counts)

    merged = demo_chain.manifest("merge")
    train = list(read_jsonl(merged.dir / "train.jsonl"))
    evals = list(read_jsonl(merged.dir / "eval.jsonl"))
    assert len(evals) == compose_config().data.eval_size and train
    assert {r["source"] for r in train + evals} == {"demo_native", "demo_prompts"}
    for record in train[:5]:
        assert len(record["input_ids"]) == len(record["loss_mask"]) == record["seq_len"]
        assert 0 < sum(record["loss_mask"]) < record["seq_len"]
    # The regenerated answers train on the ids the demo target emitted (the hf backend's own).
    [generated] = demo_chain.units["generate"]
    [tokenized] = [d for d in demo_chain.units["tokenize"] if Manifest.load(d).name == "demo_prompts"]
    assert assert_trained_on_emitted_ids(generated, tokenized) > 0

    # A batch job's log (no terminal): generate's timed progress lines, each Lightning line once, no tips.
    first = demo_chain.log
    assert re.search(r"generate demo_prompts: \d+/64 conv \(\d+%\), [\d.]+ conv/s", first), first[-3000:]
    assert "Tip:" not in first and "GPU available: False" in first
    assert first.count("GPU available: False") == 1

    # Every input a stage reads is declared in its manifest (and checked before the work reads it).
    evaluation = demo_chain.manifest("eval")
    assert set(evaluation.inputs) == {"train", "merged", "extract"}
    assert evaluation.inputs["merged"]["path"] == str(merged.dir)

    vocab = demo_chain.manifest("vocab")
    d2t = torch.load(vocab.dir / "d2t.pt", weights_only=True)
    t2d = torch.load(vocab.dir / "t2d.pt", weights_only=True)
    assert d2t.shape == (2048,) and t2d.shape == (8192,) and int(t2d.sum()) == 2048
    assert 0.9 < vocab.extra["coverage_train"] <= 1.0

    before = {stage.name: unit_dirs(root, stage.name) for stage in CHAIN}
    second = run_cli(["stage=all", *demo_chain.overrides, f"paths.root={root}"], cwd=root.parent / "elsewhere")
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    for stage in CHAIN:
        assert f"[{stage.name}]" in log and "complete, reusing" in log
        assert unit_dirs(root, stage.name) == before[stage.name], stage.name  # nothing new was built
    assert log.count("complete, reusing") == sum(len(units) for units in demo_chain.units.values())
