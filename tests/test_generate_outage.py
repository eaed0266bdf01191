"""Stage `generate` over HTTP through a server outage: nothing is lost to it, nothing is rejected for it.

A request that fails after all its retries (`request_failed`) says nothing about its conversation:
the server was down. Such conversations are left undone (not rejected), the unit is not finalized
(the CLI exits 3 with one line saying how many and to rerun), and the rerun sends exactly those
conversations, then restores the source order, so the unit ends byte-equal to a run that never
saw the outage. Outputs of earlier versions, which did write `request_failed` rejects, are
healed the same way on resume, and reuse never copies such a reject. A server that answers with
something unusable (an unknown finish reason, bytes that are not UTF-8) is not down: that
conversation is rejected with the reason, and nothing garbled reaches the training text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.stages import StageContext
from eagle3.stages.generate import CONVERSATIONS_FILE, GENERATE
from eagle3.stages.prep import PREP
from tests.conftest import HANG_GUARD_S, RUN_PY, compose_settings
from tests.mock_openai_server import MockChatServer, conversation_key
from tests.test_http_generate import DATA, FAST, UNIT, _check_complete_and_exact, _prepare, _urls

REJECTS = "rejects.jsonl"
# Two attempts a request, tiny backoff: an outage of a few dozen arrivals fails whole requests.
OUTAGE_CLIENT = ("generate.backend=vllm", "generate.http.max_attempts=2", "generate.http.inflight_batches=2",
                 "generate.length_policy=drop", *FAST)
SCENARIOS = {
    # A window of refusals amid a run that goes on: some requests fail for good, the rest is done.
    "window": (lambda n: 30 < n <= 90, "generate.http.max_consecutive_failures=0"),
    # The server goes away for good: the consecutive-failure stop ends the run early.
    "down": (lambda n: n > 40, "generate.http.max_consecutive_failures=3"),
}


def _prep_records(cfg, ctx) -> list[dict]:
    return list(read_jsonl(PREP.locate(cfg, ctx, UNIT)[1].dir / CONVERSATIONS_FILE))


def _written_ids(unit_dir: Path) -> list[str]:
    ids = []
    for name in (CONVERSATIONS_FILE, REJECTS):
        for path in (unit_dir / name, unit_dir / f"{name}.partial"):
            if path.exists():
                ids += [r["id"] for r in read_jsonl(path)]
    return ids


def _keys(records: list[dict]) -> dict[str, str]:
    """Conversation id -> the mock server's key of its requests (each key one conversation)."""
    keys = {r["id"]: conversation_key(r["messages"]) for r in records}
    assert len(set(keys.values())) == len(keys), "two prompts share their first turn; the test cannot tell them apart"
    return keys


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_outage_leaves_conversations_undone_and_a_rerun_completes_them_byte_equal(tmp_path, scenario):
    outage, stop_rule = SCENARIOS[scenario]
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1")
    with MockChatServer(latency_s=0.01, length_every=5, tool_every=11, outage=outage) as server:
        overrides = (*OUTAGE_CLIENT, stop_rule, _urls(server.url))
        root = tmp_path / "outage"
        cfg, ctx = _prepare(root, *overrides)
        records = _prep_records(cfg, ctx)
        keys = _keys(records)
        unit_dir = GENERATE.locate(cfg, ctx, UNIT)[0]
        cli = [sys.executable, str(RUN_PY), *DATA, "stage=generate", *overrides, f"paths.root={root}"]

        first = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert first.returncode == 3, first.stderr[-3000:]
        assert server.stats["outage"] > 0
        [line] = [ln for ln in first.stderr.splitlines() if ln.startswith("eagle3: ")]
        assert Manifest.load(unit_dir).status == "running"
        written = _written_ids(unit_dir)
        undone = sorted(set(keys) - set(written))
        assert undone and len(written) == len(set(written))
        partial_rejects = unit_dir / f"{REJECTS}.partial"
        reasons = Counter(r["reason"] for r in read_jsonl(partial_rejects)) if partial_rejects.exists() else {}
        assert "request_failed" not in reasons, reasons  # a server outage is not the conversation's fault
        if scenario == "window":  # the run went on to the end: only the failed conversations are missing
            assert f"{len(undone)} conversation(s) failed" in line, line
            assert "rerun the same command to retry them" in line and "request_failed" in line, line
        else:
            assert "in a row failed" in line and "rerun" in line, line

        server.outage = None  # the server is back
        server.reset()
        rerun = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        resent = dict(server.conversations)

        server.reset()
        clean_cfg, clean_ctx = _prepare(tmp_path / "clean", *overrides)
        [clean] = GENERATE(clean_cfg, clean_ctx)
        clean_requests = dict(server.conversations)

    resumed = Manifest.load(unit_dir)
    _check_complete_and_exact(resumed, [r["id"] for r in records])
    # Exactly the undone conversations were asked for again, each with all its turns, nothing else.
    assert resent == {keys[cid]: clean_requests[keys[cid]] for cid in undone}
    assert clean.dir.name == unit_dir.name
    for name in (CONVERSATIONS_FILE, REJECTS):
        assert (unit_dir / name).read_bytes() == (clean.dir / name).read_bytes(), name
    assert resumed.counts == clean.counts and clean.counts["rejected"].get("length_cut")


def _demote(unit_dir: Path, victims: list[str], running: bool) -> None:
    """Make a complete output look like one an earlier version wrote through an outage.

    The victims' records move to rejects.jsonl as `request_failed` rejects (appended, as that
    version wrote them); `running` also turns the manifest back to a killed run's.
    """
    out_path, rej_path = unit_dir / CONVERSATIONS_FILE, unit_dir / REJECTS
    kept, moved = [], []
    for line in out_path.read_bytes().splitlines(keepends=True):
        (moved if json.loads(line)["id"] in victims else kept).append(line)
    assert len(moved) == len(victims)
    out_path.write_bytes(b"".join(kept))
    old = [json.dumps({"id": json.loads(line)["id"], "reason": "request_failed",
                       "detail": {"turn": 0, "error": "http_503: server down (attempt 6 of 6)", "prompt_tokens": 9},
                       "source": UNIT, "generation": {"thinking": True, "turns": []}}) + "\n" for line in moved]
    with rej_path.open("a") as fh:
        fh.writelines(old)
    manifest = Manifest.load(unit_dir)
    if running:
        manifest.status = "running"
    else:  # keep it a consistent complete output: sizes and counts as that version recorded them
        manifest.counts["out"] -= len(victims)
        manifest.counts["rejected"]["request_failed"] = len(victims)
        for name in (CONVERSATIONS_FILE, REJECTS):
            manifest.files[name]["bytes"] = (unit_dir / name).stat().st_size
    manifest.write(unit_dir)


FIXTURE = Path(__file__).parent / "fixtures" / "demo_prompts_small.jsonl"  # a fixed pool of 30


def _pool_ctx(server: MockChatServer, root: Path, n: int):
    """Config and context of prep -> generate of `n` prompts of the fixed pool through `server`."""
    cfg = compose_settings(["dataset=demo_prompts", f"dataset.sources.demo_prompts.data_files=[{FIXTURE}]",
                          "dataset.sources.demo_prompts.generator=null", "generate.batch_size=4",
                          "generate.length_policy=drop", "generate.backend=vllm", *FAST, "generate.http.inflight_batches=2",
                          _urls(server.url), f"dataset.sources.demo_prompts.num_samples={n}", f"paths.root={root}"])
    return cfg, StageContext(root=root, run_dir=root / "run")


def _pool_generate(server: MockChatServer, root: Path, n: int) -> Manifest:
    cfg, ctx = _pool_ctx(server, root, n)
    PREP(cfg, ctx)
    [manifest] = GENERATE(cfg, ctx)
    return manifest


def test_old_request_failed_rejects_are_retried_on_resume_and_never_reused(tmp_path):
    with MockChatServer(latency_s=0.01, tool_every=7, length_every=5) as server:
        fresh = _pool_generate(server, tmp_path / "fresh", 12)
        prompts = list(read_jsonl(Path(fresh.inputs["conversations"]["path"]) / CONVERSATIONS_FILE))
        keys = _keys(prompts)
        kept = {r["id"] for r in read_jsonl(fresh.dir / CONVERSATIONS_FILE)}
        victims = [r["id"] for r in prompts[:4] if r["id"] in kept][:2]  # both in the first batch
        assert len(victims) == 2

        # Resume of a running output holding old request_failed rejects: they are not done.
        _demote(fresh.dir, victims, running=True)
        server.reset()
        [healed] = GENERATE(*_pool_ctx(server, tmp_path / "fresh", 12))
        assert set(server.conversations) == {keys[v] for v in victims}  # only they were asked for
        clean = _pool_generate(server, tmp_path / "clean", 12)
        for name in (CONVERSATIONS_FILE, REJECTS):
            assert (healed.dir / name).read_bytes() == (clean.dir / name).read_bytes(), name
        assert "request_failed" not in healed.counts["rejected"] and healed.counts == clean.counts

        # Reuse: a complete earlier output with a request_failed reject does not lend that batch.
        _demote(clean.dir, victims, running=False)
        server.reset()
        grown = _pool_generate(server, tmp_path / "clean", 20)
        assert grown.extra["this_run"]["batches_reused"] == 2  # batches 2 and 3 of the 12; not the first
        assert {keys[v] for v in victims} <= set(server.conversations)
        reference = _pool_generate(server, tmp_path / "reference", 20)
    for name in (CONVERSATIONS_FILE, REJECTS):
        assert (grown.dir / name).read_bytes() == (reference.dir / name).read_bytes(), name
    assert "request_failed" not in grown.counts["rejected"]


def test_a_complete_unit_an_earlier_version_left_with_request_failed_rejects_is_reopened_and_healed(tmp_path):
    with MockChatServer(latency_s=0.01, tool_every=7, length_every=5) as server:
        old = _pool_generate(server, tmp_path / "old", 12)
        prompts = list(read_jsonl(Path(old.inputs["conversations"]["path"]) / CONVERSATIONS_FILE))
        keys = _keys(prompts)
        kept = {r["id"] for r in read_jsonl(old.dir / CONVERSATIONS_FILE)}
        victims = [r["id"] for r in prompts if r["id"] in kept][3:5]
        _demote(old.dir, victims, running=False)  # complete, with the holes that version left
        server.reset()
        [healed] = GENERATE(*_pool_ctx(server, tmp_path / "old", 12))
        assert set(server.conversations) == {keys[v] for v in victims}  # only the holes were asked for
        clean = _pool_generate(server, tmp_path / "clean", 12)
    assert healed.dir == old.dir and healed.status == "complete"
    for name in (CONVERSATIONS_FILE, REJECTS):
        assert (healed.dir / name).read_bytes() == (clean.dir / name).read_bytes(), name
    assert healed.counts == clean.counts and "request_failed" not in healed.counts["rejected"]


def _break_some(body: dict, completion: dict):
    """Every 4th conversation: no finish reason; 4th+1: an unknown one; 4th+2: bytes that are not UTF-8."""
    which = int(conversation_key(body["messages"]), 16) % 4
    choice = completion["choices"][0]
    if which == 0:
        choice["finish_reason"] = None
    elif which == 1:
        choice["finish_reason"] = "weird"
    elif which == 2:
        choice["message"]["content"] = "caf\u00e9 MARK"
        raw = json.dumps(completion, ensure_ascii=False).encode("utf-8")
        return raw.replace("\u00e9 MARK".encode("utf-8"), b"\xc3\x28 MARK")  # a broken 2-byte sequence
    return completion


def test_unknown_finish_reasons_and_invalid_utf8_are_rejected_not_trained_on(tmp_path):
    with MockChatServer(latency_s=0.0, reply_hook=_break_some) as server:
        manifest = _pool_generate(server, tmp_path, 16)
        requests = server.stats["requests"]
    records, rejects = _check_complete_and_exact(manifest, [r["id"] for r in read_jsonl(
        Path(manifest.inputs["conversations"]["path"]) / CONVERSATIONS_FILE)])
    by_reason: dict[str, list] = {}
    for reject in rejects:
        by_reason.setdefault(reject["reason"], []).append(reject["detail"])
    assert set(by_reason) == {"unknown_finish_reason", "invalid_utf8"}, by_reason
    finishes = {str(d["error"]) for d in by_reason["unknown_finish_reason"]}
    assert any("None" in f for f in finishes) and any("'weird'" in f for f in finishes), finishes
    assert records, "the healthy quarter is kept"
    text = (manifest.dir / CONVERSATIONS_FILE).read_text(encoding="utf-8")
    assert "\ufffd" not in text and "MARK" not in text
    assert requests == server.stats["ok"], "an answer the server gave is not retried"
