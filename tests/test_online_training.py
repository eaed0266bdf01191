"""`train.hidden_states=online` on the demo: the whole chain with no store, as good as store mode.

Two default demo chains (`stage=all`, ~4 min each on 2 cores), store mode and online mode, in
separate artifact roots so "no store under paths.root" means what it says. Same data, same
schedule; the online draft trains on fp32 states straight from the target, the store one on the
bf16 store, so their accept lengths agree closely but not bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest
from tests.conftest import run_cli

pytestmark = pytest.mark.slow
K = "3"
RELATIVE_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("online")
    (base / "elsewhere").mkdir()
    roots = {}
    for mode in ("store", "online"):
        root = base / mode
        done = run_cli(["stage=all", f"train.hidden_states={mode}", f"paths.root={root}"], cwd=base / "elsewhere")
        assert done.returncode == 0, (mode, done.stderr[-3000:])
        roots[mode] = root
    return roots


def _one(root: Path, stage: str) -> Manifest:
    [manifest] = [Manifest.load(d) for d in (root / stage).iterdir() if d.is_dir()]
    assert manifest.status == "complete"
    return manifest


def _real_accept(root: Path) -> float:
    return json.loads((Path(_one(root, "eval").dir) / "eval_report.json").read_text())["real"][K]["accept_length"]


def test_online_mode_writes_no_hidden_state_store(roots):
    online = roots["online"]
    assert not (online / "hidden_states").exists()
    assert not (online / "extract").exists() or not any((online / "extract").iterdir())
    shards = [p for p in online.rglob("*.safetensors") if "draft" not in p.relative_to(online).parts]
    assert shards == [], shards  # the only tensors written are the exported drafts
    assert any((roots["store"] / "hidden_states").iterdir())  # store mode did write one
    train = _one(online, "train")
    assert train.extra["hidden_states"] == "online" and set(train.inputs) == {"merged", "vocab"}
    [train_states, eval_states] = train.extra["states_source"]
    assert train_states["backend"] == "hf"
    # The target ran over the whole train split every epoch.
    assert train_states["tokens"] == train.extra["train_tokens_per_epoch"] * train.extra["epochs"]


def test_online_accept_length_is_within_2_percent_of_store_mode(roots):
    store, online = _real_accept(roots["store"]), _real_accept(roots["online"])
    print(f"real accept length at K=3: store {store:.3f}, online {online:.3f}")
    assert store > 2.0  # the demo draft is used
    assert abs(online - store) <= RELATIVE_TOLERANCE * store, (store, online)
    s, o = _one(roots["store"], "train").extra, _one(roots["online"], "train").extra
    assert s["global_step"] == o["global_step"] and s["train_tokens_per_epoch"] == o["train_tokens_per_epoch"]


def test_plan_reads_both_modes_throughputs_from_the_manifests(roots, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    plans = {}
    for mode, root in roots.items():
        done = run_cli(["stage=plan", f"train.hidden_states={mode}", f"paths.root={root}"], cwd=work)
        assert done.returncode == 0, done.stderr[-2000:]
        [run_dir] = [p for p in (root / "runs").iterdir() if p.name.endswith("_plan")]
        plans[mode] = json.loads((run_dir / "plan.json").read_text())["hidden_states"]["modes"]
    store_root = plans["store"]
    extract, train = _one(roots["store"], "extract").extra, _one(roots["store"], "train").extra
    assert store_root["store"]["extract_tokens_per_s"]["value"] == extract["extract_tokens_per_s"]
    assert store_root["store"]["extract_tokens_per_s"]["basis"] == "actual"  # this very unit measured it
    assert store_root["store"]["train_tokens_per_s"]["value"] == train["train_tokens_per_s"]
    # No online run in that root: target forward then draft step per token, one after the other.
    serial = 1 / (1 / extract["extract_tokens_per_s"] + 1 / train["train_tokens_per_s"])
    assert store_root["online"]["train_tokens_per_s"]["value"] == pytest.approx(serial, abs=0.1)
    assert store_root["online"]["train_tokens_per_s"]["basis"] == "estimate"
    online = _one(roots["online"], "train").extra
    assert plans["online"]["online"]["train_tokens_per_s"] == {
        "value": online["train_tokens_per_s"], "basis": "actual",
        "note": f"train_tokens_per_s of {_one(roots['online'], 'train').dir}"}
    token_epochs = online["train_tokens_per_epoch"] * online["epochs"]
    assert plans["online"]["online"]["wall_s"]["train"]["value"] == round(token_epochs / online["train_tokens_per_s"])
    assert plans["online"]["online"]["bytes_stored"]["value"] == 0
