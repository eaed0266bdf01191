"""`train.hidden_states=online` on the demo: the whole chain with no store, as good as store mode.

Store mode is the session's demo chain (`tests.conftest.demo_chain`); online mode runs
`stage=all train.hidden_states=online` in the same root with the chain's overrides, so it shares
the data units and adds its own train and eval units (~1 min on 2 cores). Same data, same schedule; the online draft trains
on fp32 states straight from the target, the store one on the bf16 store, so their accept lengths
agree closely but not bit for bit. "No store" is checked as "the online job wrote no hidden state
and declared none": every tensor file under the root is the one it was before, or a draft export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest
from tests.conftest import DemoChain, run_cli, unit_dirs

pytestmark = pytest.mark.slow
K = "3"
RELATIVE_TOLERANCE = 0.02


@dataclass(frozen=True)
class Modes:
    chain: DemoChain
    online_train: Manifest
    online_eval: Manifest
    tensors_before: dict[Path, int]  # every *.safetensors under the root before the online job: its mtime
    store_before: dict[Path, int]  # every file under hidden_states/ and extract/ before the online job
    plans: dict[str, dict]  # stage=plan's `hidden_states.modes` per mode (store: before the online job ran)


def _plan(chain: DemoChain, mode: str, work: Path) -> dict:
    root = chain.root
    before = set((root / "runs").iterdir())
    done = run_cli(["stage=plan", *chain.overrides, f"train.hidden_states={mode}", f"paths.root={root}"], cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    [run_dir] = [p for p in set((root / "runs").iterdir()) - before if p.name.endswith("_plan")]
    return json.loads((run_dir / "plan.json").read_text())["hidden_states"]["modes"]


@pytest.fixture(scope="module")
def modes(demo_chain) -> Modes:
    root, work = demo_chain.root, demo_chain.root.parent / "elsewhere"
    # The store root's plan before any online run exists in it: its online figures are estimates.
    store_plan = _plan(demo_chain, "store", work)
    tensors = _mtimes(root.rglob("*.safetensors"))
    store = _store_files(root)
    trains, evals = unit_dirs(root, "train"), unit_dirs(root, "eval")
    done = run_cli(["stage=all", *demo_chain.overrides, "train.hidden_states=online", f"paths.root={root}"],
                   cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    [train] = unit_dirs(root, "train") - trains
    [evaluation] = unit_dirs(root, "eval") - evals
    plans = {"store": store_plan, "online": _plan(demo_chain, "online", work)}
    return Modes(demo_chain, Manifest.load(train), Manifest.load(evaluation), tensors, store, plans)


def _mtimes(paths) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in paths if p.is_file()}


def _store_files(root: Path) -> dict[Path, int]:
    return _mtimes([*(root / "hidden_states").rglob("*"), *(root / "extract").rglob("*")])


def _real_accept(eval_manifest: Manifest) -> float:
    return json.loads((Path(eval_manifest.dir) / "eval_report.json").read_text())["real"][K]["accept_length"]


def test_online_mode_writes_no_hidden_state_store(modes):
    root = modes.chain.root
    assert any((root / "hidden_states").iterdir()) and modes.store_before  # store mode did write one
    assert _store_files(root) == modes.store_before, "the online job wrote to the hidden-state store"
    assert {p for p in root.rglob("*.safetensors")} >= set(modes.tensors_before)
    for path, mtime in modes.tensors_before.items():
        assert path.stat().st_mtime_ns == mtime, f"the online job rewrote {path}"
    new = [p for p in root.rglob("*.safetensors") if p not in modes.tensors_before]
    online_train = Path(modes.online_train.dir)
    assert new and all(p.is_relative_to(online_train / "draft") for p in new), new  # only its exported drafts
    assert unit_dirs(root, "extract") == set(modes.chain.units["extract"])  # no extract unit of its own
    train = modes.online_train
    assert train.status == "complete"
    assert train.extra["hidden_states"] == "online" and set(train.inputs) == {"merged", "vocab"}
    assert set(modes.online_eval.inputs) == {"train", "merged"}  # the eval read no store either
    [train_states, eval_states] = train.extra["states_source"]  # the train split's, then the in-training eval's
    assert train_states["backend"] == eval_states["backend"] == "hf" and eval_states["tokens"] > 0
    # The target ran over the whole train split every epoch.
    assert train_states["tokens"] == train.extra["train_tokens_per_epoch"] * train.extra["epochs"]


def test_online_accept_length_is_within_2_percent_of_store_mode(modes):
    store, online = _real_accept(modes.chain.manifest("eval")), _real_accept(modes.online_eval)
    print(f"real accept length at K=3: store {store:.3f}, online {online:.3f}")
    assert store > 2.0  # the demo draft is used
    assert abs(online - store) <= RELATIVE_TOLERANCE * store, (store, online)
    s, o = modes.chain.manifest("train").extra, modes.online_train.extra
    assert s["global_step"] == o["global_step"] and s["train_tokens_per_epoch"] == o["train_tokens_per_epoch"]


def test_plan_reads_both_modes_throughputs_from_the_manifests(modes):
    store_root = modes.plans["store"]
    extract, train = modes.chain.manifest("extract").extra, modes.chain.manifest("train").extra
    assert store_root["store"]["extract_tokens_per_s"]["value"] == extract["extract_tokens_per_s"]
    assert store_root["store"]["extract_tokens_per_s"]["basis"] == "actual"  # this very unit measured it
    assert store_root["store"]["train_tokens_per_s"]["value"] == train["train_tokens_per_s"]
    # No online run in that root yet: target forward then draft step per token, one after the other.
    serial = 1 / (1 / extract["extract_tokens_per_s"] + 1 / train["train_tokens_per_s"])
    assert store_root["online"]["train_tokens_per_s"]["value"] == pytest.approx(serial, abs=0.1)
    assert store_root["online"]["train_tokens_per_s"]["basis"] == "estimate"
    online = modes.online_train.extra
    assert modes.plans["online"]["online"]["train_tokens_per_s"] == {
        "value": online["train_tokens_per_s"], "basis": "actual",
        "note": f"train_tokens_per_s of {modes.online_train.dir}"}
    token_epochs = online["train_tokens_per_epoch"] * online["epochs"]
    assert modes.plans["online"]["online"]["wall_s"]["train"]["value"] == round(
        token_epochs / online["train_tokens_per_s"])
    assert modes.plans["online"]["online"]["bytes_stored"]["value"] == 0
