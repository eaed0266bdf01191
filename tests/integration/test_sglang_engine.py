"""SGLang's CPU engine for real: regenerate through it, capture hidden states through it, refuse to speculate.

Needs the server environment of `scripts/setup_sglang_cpu.sh` (SGLang 0.5.23; `tests.sglang_env`):
without it these tests FAIL when `CI` is set and are skipped otherwise.

Every stage runs the way a user runs it, with no server URLs: `generate.backend=sglang` and
`extract.backend=sglang` launch SGLang themselves (conf/server/cpu.yaml follows the backend: the
launcher's CPU flags, the `.sglang-venv` interpreter), and stop it; after each job nothing listens
on the server's port any more. Each start takes ~20-40 s on 2 cores.

* generate: greedy answers through SGLang equal the hf backend's (transformers in process).
* extract: the store SGLang's capture plugin fills equals the hf backend's within fp32 noise, and
  its capture layers are transformers' `hidden_states[i]` (not `[i + 1]`, SGLang's own numbering).
* online training reads the same server, with no store written.
* SIGKILL of the server mid-extract: one line naming it (engine, exit code, log line); the rerun
  keeps the batches already stored and completes.
* `stage=bench server=sglang` refuses on this CPU in one line before launching anything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.errors import EXIT_CONFIG_ERROR, EXIT_STAGE_ERROR
from eagle3.paths import asset_path
from eagle3.states.store import HiddenStateStore
from tests.conftest import HANG_GUARD_S, RUN_PY, SMALL_DEMO_DATA, run_cli, unit_dirs
from tests.sglang_env import sglang_python
from tests.vllm_env import assert_stopped, free_port

# Slow; its jobs launch servers (or run sweeps), each a process of its own (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

# Measured max abs diff 6e-6 on the demo target (|values| <= ~20): the same fp32 numbers added in other orders.
FP32_TOLERANCE = 1e-4
FP32 = "extract.storage_format=fp32"
GREEDY = ("generate.temperature=0",)
ONLINE_TRAIN = ("train.ttt_steps=3", "train.max_epochs=2")  # two epochs: every epoch asks the server again
KILL_BATCH_TOKENS = "extract.batch_tokens=512"  # ~9 batches for the small demo: a kill lands between two


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The small demo chain up to merge and vocab (answers regenerated in process), and SGLang's interpreter."""
    python = sglang_python()
    root = tmp_path_factory.mktemp("sglang") / "artifacts"
    (root.parent / "elsewhere").mkdir()
    for stage in ("demo_data", "prep", "generate", "tokenize", "merge", "vocab"):
        done = _cli(root, f"stage={stage}", in_process=True)
        assert done.returncode == 0, done.stderr[-3000:]
    return root, python


def _cli(root: Path, *args: str, timeout: float = 1800, in_process: bool | None = None):
    return run_cli([*SMALL_DEMO_DATA, f"paths.root={root}", *args], cwd=root.parent / "elsewhere", timeout=timeout,
                   in_process=in_process)


def _sglang(node: str, python: str, port: int) -> list[str]:
    backend = node.split(".")[0]
    return [f"{backend}.backend=sglang", f"{node}.python={python}", f"{node}.port={port}"]


def _new_unit(root: Path, stage: str, before: set[Path]) -> Manifest:
    [unit] = unit_dirs(root, stage) - before
    return Manifest.load(unit)


def _store_states(manifest: Manifest) -> dict[str, tuple]:
    store = HiddenStateStore(manifest.extra["store_dir"])
    return {r["id"]: store.load(r["key"]) for r in read_jsonl(Path(manifest.dir) / "keys.jsonl")}


def test_generate_through_sglang_equals_the_hf_backend_under_greedy_decoding(chain):
    root, python = chain
    answers = {}
    for backend in ("hf", "sglang"):
        before, port = unit_dirs(root, "generate"), free_port()
        args = [*GREEDY] + (_sglang("generate.server", python, port) if backend == "sglang" else [])
        done = _cli(root, "stage=generate", *args)
        assert done.returncode == 0, done.stderr[-3000:]
        if backend == "sglang":
            assert "generate: launching sglang" in done.stdout + done.stderr
            assert_stopped(port)
        manifest = _new_unit(root, "generate", before)
        assert manifest.status == "complete" and manifest.config["generate"]["backend"] == backend
        # The answers and the ids behind them: the hf backend's own, SGLang's response_token_ids.
        answers[backend] = {r["id"]: (r["messages"], [t["token_ids"] for t in r["meta"]["generation"]["turns"]])
                            for r in read_jsonl(Path(manifest.dir) / "conversations.jsonl")}
    assert len(answers["sglang"]) == len(answers["hf"]) >= 20
    differ = [i for i in answers["hf"] if answers["hf"][i] != answers["sglang"][i]]
    assert differ == [], f"{len(differ)} of {len(answers['hf'])} conversations differ, first {differ[:1]}: " \
        f"{answers['hf'][differ[0]] if differ else ''} vs {answers['sglang'][differ[0]] if differ else ''}"


def test_sglang_store_equals_the_hf_store_and_captures_transformers_hidden_states_i(chain):
    root, python = chain
    manifests = {}
    for backend in ("hf", "sglang"):
        before, port = unit_dirs(root, "extract"), free_port()
        args = [FP32, *(_sglang("extract.server", python, port) if backend == "sglang" else [])]
        done = _cli(root, "stage=extract", *args)
        assert done.returncode == 0, done.stderr[-3000:]
        if backend == "sglang":
            assert_stopped(port)
        manifests[backend] = _new_unit(root, "extract", before)
        assert manifests[backend].config["backend"] == backend
    hf, sg = (_store_states(manifests[b]) for b in ("hf", "sglang"))
    assert sorted(hf) == sorted(sg) and len(hf) >= 30
    worst = {"aux": 0.0, "final": 0.0}
    for sid, (aux, final, ids) in hf.items():
        s_aux, s_final, s_ids = sg[sid]
        assert torch.equal(ids, s_ids) and aux.shape == s_aux.shape == (len(ids), 3 * 256)
        assert final.shape == s_final.shape == (len(ids), 256)
        worst["aux"] = max(worst["aux"], float((aux - s_aux).abs().max()))
        worst["final"] = max(worst["final"], float((final - s_final).abs().max()))
    print(f"sglang vs hf store, max abs diff: aux {worst['aux']:.2e}, final {worst['final']:.2e}")
    assert worst["aux"] <= FP32_TOLERANCE and worst["final"] <= FP32_TOLERANCE, worst

    # The layer-id convention against transformers itself: capture i is hidden_states[i], not [i + 1].
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(asset_path("demo_target"), dtype=torch.float32).eval()
    sid = sorted(sg)[0]
    aux, final, ids = sg[sid]
    with torch.no_grad():
        hidden = model(ids[None].long(), output_hidden_states=True).hidden_states
    for block, layer in enumerate([2, 4, 5]):
        captured = aux[:, block * 256:(block + 1) * 256]
        assert float((captured - hidden[layer][0]).abs().max()) <= FP32_TOLERANCE, layer
        assert float((captured - hidden[layer + 1][0]).abs().max()) > 100 * FP32_TOLERANCE, layer
    assert float((final - hidden[-1][0]).abs().max()) <= FP32_TOLERANCE  # the final-normed state


def _stores(root: Path) -> list[str]:
    where = root / "hidden_states"
    return sorted(p.name for p in where.iterdir()) if where.is_dir() else []


def test_online_training_through_sglang_runs_the_chain_without_a_store(chain):
    root, python = chain
    stores_before = _stores(root)
    before, port = unit_dirs(root, "train"), free_port()
    done = _cli(root, "stage=train", "train.hidden_states=online", *ONLINE_TRAIN,
                *_sglang("extract.server", python, port))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_stopped(port)
    assert _stores(root) == stores_before, "online training wrote a hidden-state store"
    online = _new_unit(root, "train", before)
    assert online.status == "complete" and online.extra.get("hidden_states") == "online"
    sources = online.extra["states_source"]
    assert sources and all(s["backend"] == "sglang" and s["failed"] == 0 for s in sources)
    assert sources[0]["tokens"] == online.extra["train_tokens_per_epoch"] * online.extra["epochs"]


def _index_lines(root: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (root / "hidden_states").glob("*/index/*.jsonl")
               if "-bf16" in p.parent.parent.name)


def test_sglang_killed_mid_extract_is_named_in_one_line_and_the_rerun_resumes(chain, tmp_path):
    root, python = chain
    port = free_port()
    before = unit_dirs(root, "extract")
    command = [sys.executable, str(RUN_PY), "stage=extract", *SMALL_DEMO_DATA, f"paths.root={root}",
               KILL_BATCH_TOKENS, *_sglang("extract.server", python, port)]
    record_path = root / ".servers" / f"{socket.gethostname()}-{port}.json"
    with open(tmp_path / "first.err", "w") as err:
        job = subprocess.Popen(command, cwd=root.parent / "elsewhere", stdout=subprocess.DEVNULL, stderr=err,
                               env=dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1"))
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while _index_lines(root) < 2:
            assert job.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no batch stored within {HANG_GUARD_S:.0f} s"
            time.sleep(0.05)
        server = json.loads(record_path.read_text())
        os.killpg(server["pgid"], signal.SIGKILL)
        job.wait(HANG_GUARD_S)
    finally:
        if job.poll() is None:
            job.kill()
    stderr = (tmp_path / "first.err").read_text()
    assert job.returncode == EXIT_STAGE_ERROR, stderr[-3000:]
    [line] = [line for line in stderr.splitlines() if line.startswith("eagle3: ")]
    assert line.startswith(f"eagle3: sglang server exited with code -9 (SIGKILL) while extract's requests were in "
                           f"flight (log: {server['log']}): pid {server['pid']}, "), line
    stored = _index_lines(root)
    assert_stopped(port)
    [unit] = unit_dirs(root, "extract") - before
    assert Manifest.load(unit).status == "running"

    again = run_cli(command[2:], cwd=root.parent / "elsewhere")
    assert again.returncode == 0, again.stderr[-3000:]
    assert_stopped(port)
    manifest = Manifest.load(unit)
    counts, extra = manifest.counts, manifest.extra
    print(f"killed after {stored} stored batches; the rerun found {extra['samples_from_earlier_runs']} samples "
          f"stored and extracted {extra['tokens_extracted_this_run']} tokens")
    assert manifest.status == "complete" and counts["out"] == counts["in"] == counts["extracted"] >= 30
    # The batches stored before the kill were kept: the rerun extracted only the rest.
    assert 0 < extra["samples_from_earlier_runs"] < counts["in"], extra
    assert 0 < extra["tokens_extracted_this_run"] < extra["tokens_extracted"], extra


def test_bench_refuses_sglang_speculation_on_a_cpu_in_one_line(chain, tmp_path):
    root, _ = chain
    from eagle3.draft.export import export_draft
    from eagle3.draft.geometry import geometry_from_target
    from eagle3.draft.model import Eagle3Draft
    from eagle3.target_info import read_config as target_text_config

    geometry = geometry_from_target(target_text_config(asset_path("demo_target")), [2, 4, 5], 2048,
                                    {"fc_in_features": 768})
    model = Eagle3Draft(geometry)
    with torch.no_grad():  # a valid vocab map: the first draft-vocab target ids
        model.d2t.zero_()
        model.t2d.zero_()
        model.t2d[: geometry.draft_vocab_size] = True
    draft = export_draft(model, tmp_path / "draft" / "sglang", "sglang")
    port = free_port()
    done = _cli(root, "stage=bench", "server=sglang", f"server.port={port}", f"server.speculative.draft_path={draft}")
    assert done.returncode == EXIT_CONFIG_ERROR, (done.stdout[-2000:], done.stderr[-2000:])
    [line] = [line for line in done.stderr.splitlines() if line.startswith("eagle3: ")]
    assert line == ("eagle3: server.backend: 'sglang' -- no GPU on this machine, and SGLang has no EAGLE path on a "
                    "CPU: its torch_native attention refuses EAGLE ('EAGLE is not supported in decode attention "
                    "backend torch_native'), triton has no CPU driver and intel_amx needs AMX tiles and a CPU-built "
                    "sgl-kernel; valid: server=vllm on a CPU (the chain's in-process eval measures the draft "
                    "anywhere), or this command on a GPU machine"), line
    assert_stopped(port)
    # The CPU option says so before any work: the config rule, one line too.
    refused = _cli(root, "stage=bench", "server=sglang_cpu", "server.speculative.algorithm=EAGLE3",
                   f"server.speculative.draft_path={draft}")
    assert refused.returncode == EXIT_CONFIG_ERROR
    assert "server.speculative.algorithm: 'EAGLE3' -- SGLang has no EAGLE path on a CPU" in refused.stderr
