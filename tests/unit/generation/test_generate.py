"""Stage `generate` (hf backend): turn-by-turn regeneration, length policies, kill -9 resume.

Two layers. A scripted backend pins the turn logic and the counting exactly (which turn ends a
conversation, what each length policy keeps, what is rejected and counted) without a model.
The demo target then runs the real stage: regenerated multi-turn conversations in canonical
form with and without thinking, a forced `length` cut under both policies, a kill -9 through
the CLI whose resumed output is byte-equal to an uninterrupted run, and the CLI chain
demo_data -> prep -> generate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, StageOutput, read_jsonl
from eagle3.chat_formats.kimi import (
    GENERATION_PROMPT,
    IM_END,
    TOOL_CALL_ARG,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
)
from eagle3.errors import Eagle3Error, NothingKept
from eagle3.generation import pipeline
from eagle3.generation.factory import make_backend
from eagle3.generation.hf_backend import to_message
from eagle3.generation.regenerate import GenerateSettings, batch_seed, regenerate_batch, split_turns
from eagle3.generation.types import BackendUnavailable, GenerationResult
from eagle3.stages import CHAIN, StageContext
from eagle3.stages import generate as generate_stage
from eagle3.stages.demo_data import DEMO_DATA
from eagle3.stages.generate import CONVERSATIONS_FILE, GENERATE
from eagle3.stages.prep import PREP
from tests.conftest import FIXTURES, HANG_GUARD_S, RUN_PY, compose_settings, kill_9_when

UNIT = "demo_prompts"


# ----------------------------------------------------------------------------- scripted backend
class ScriptedBackend:
    """Answers turn t of conversation c with SCRIPT[c][t]: 'stop', 'length', 'tool' or 'empty'."""

    name = "scripted"

    def __init__(self, script: dict[str, list[str]], failing: frozenset = frozenset(), independent: bool = False):
        self.script, self.calls, self.failing = script, [], failing
        self.independent_requests = independent  # results depend on the request and seed alone?

    def describe(self):
        return {"backend": self.name}

    def generate(self, requests, params):
        self.calls.append(([r.id for r in requests], params.seed))
        results = []
        for req in requests:
            conv, turn = req.id.rsplit(":", 1)
            if req.id in self.failing:  # the server was down for this request, all retries long
                results.append(GenerationResult(id=req.id, error="request_failed", prompt_tokens=10,
                                                error_detail="http_503: HTTP 503 (attempt 6 of 6)"))
                continue
            kind = self.script[conv][int(turn)]
            head = GENERATION_PROMPT if req.thinking else GENERATION_PROMPT + "</think>"
            body = {"stop": f"why {turn}</think>answer {turn}{IM_END}",
                    "length": "thinking and thinking",
                    "empty": f"</think>{IM_END}" if req.thinking else IM_END,
                    "tool": (f"look</think>{TOOL_CALLS_BEGIN}{TOOL_CALL_BEGIN}functions.read_file:0"
                             f'{TOOL_CALL_ARG}{{"path": "x.py"}}{TOOL_CALL_END}{TOOL_CALLS_END}{IM_END}')}[kind]
            if not req.thinking:
                body = body.split("</think>", 1)[-1]
            finish = {"stop": "stop", "length": "length", "empty": "stop", "tool": "tool_calls"}[kind]
            results.append(GenerationResult(id=req.id, message=to_message(head, body, req.thinking),
                                            finish_reason=finish, completion_tokens=len(body) // 4 + 1,
                                            prompt_tokens=10))
        return results

    def close(self):
        pass


def _conv(cid: str, n_users: int, system: bool = True) -> dict:
    messages = [{"role": "system", "content": "be brief"}] if system else []
    for i in range(n_users):
        messages.append({"role": "user", "content": f"question {i}"})
    return {"id": cid, "source": UNIT, "track": "prompt_only", "messages": messages, "meta": {"k": 1}}


def _settings(**kw) -> GenerateSettings:
    base = dict(max_new_tokens=8, temperature=0.6, top_p=0.95, max_user_turns=8,
                length_policy="keep_flagged", thinking=True, seed=0)
    return GenerateSettings(**{**base, **kw})


def test_every_user_turn_gets_a_regenerated_answer_in_canonical_form():
    backend = ScriptedBackend({"a": ["stop"] * 3, "b": ["stop"]})
    [a, b] = regenerate_batch(backend, [_conv("a", 3), _conv("b", 1, system=False)], _settings())
    roles = [m["role"] for m in a.record["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    answers = [m for m in a.record["messages"] if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in answers] == ["why 0", "why 1", "why 2"]
    assert [m["content"] for m in answers] == ["answer 0", "answer 1", "answer 2"]
    gen = a.record["meta"]["generation"]
    assert gen["ended"] == "complete" and [t["finish_reason"] for t in gen["turns"]] == ["stop"] * 3
    assert a.record["meta"]["truncated"] is False and a.record["meta"]["k"] == 1
    # Lock-step rounds: round 0 has both conversations, later rounds only the one still going,
    # and every round's seed is a function of the batch's ids and the round only.
    assert [ids for ids, _ in backend.calls] == [["a:0", "b:0"], ["a:1"], ["a:2"]]
    assert [seed for _, seed in backend.calls] == [batch_seed(["a", "b"], t, 0) for t in range(3)]
    assert b.record["messages"][-1]["content"] == "answer 0"


def test_thinking_off_has_no_reasoning():
    [a] = regenerate_batch(ScriptedBackend({"a": ["stop", "stop"]}), [_conv("a", 2)], _settings(thinking=False))
    for m in a.record["messages"]:
        assert "reasoning_content" not in m
    assert [m["content"] for m in a.record["messages"] if m["role"] == "assistant"] == ["answer 0", "answer 1"]


def test_length_cut_keep_flagged_keeps_up_to_the_cut_and_drop_rejects():
    script = {"a": ["stop", "length", "stop"]}
    [kept] = regenerate_batch(ScriptedBackend(script), [_conv("a", 3)], _settings())
    assert kept.record["meta"]["truncated"] is True
    assert [m["role"] for m in kept.record["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert kept.record["meta"]["generation"]["ended"] == "length"
    assert kept.record["meta"]["generation"]["dropped_user_turns"] == 1
    [dropped] = regenerate_batch(ScriptedBackend(script), [_conv("a", 3)], _settings(length_policy="drop"))
    assert dropped.record is None and dropped.reason == "length_cut" and dropped.detail["turn"] == 1


def test_tool_call_ends_the_conversation_and_empty_answers_are_rejected():
    backend = ScriptedBackend({"t": ["stop", "tool", "stop"], "e": ["stop", "empty"]})
    [tool, empty] = regenerate_batch(backend, [_conv("t", 3), _conv("e", 2)], _settings())
    last = tool.record["messages"][-1]
    assert last["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "x.py"}'}
    assert tool.record["meta"]["generation"]["ended"] == "tool_calls"
    assert tool.record["meta"]["generation"]["turns"][-1]["finish_reason"] == "tool_calls"
    assert empty.record is None and empty.reason == "empty_generation"


def test_max_user_turns_and_conversations_without_user_turn():
    [a, z] = regenerate_batch(ScriptedBackend({"a": ["stop"] * 4}),
                              [_conv("a", 4), {"id": "z", "messages": [{"role": "system", "content": "x"}]}],
                              _settings(max_user_turns=2))
    assert sum(m["role"] == "user" for m in a.record["messages"]) == 2
    assert a.record["meta"]["generation"]["ended"] == "max_user_turns"
    assert z.reason == "no_user_turn"
    turns, ignored = split_turns([{"role": "user", "content": "q"}, {"role": "assistant", "content": "foreign"},
                                  {"role": "user", "content": "q2"}, {"role": "system", "content": "late"}])
    assert [[m["content"] for m in t] for t in turns] == [["q"], ["q2"]] and ignored == 2


def test_stage_counts_both_length_policies(tmp_path, monkeypatch):
    script = {"c0": ["stop", "stop"], "c1": ["length"], "c2": ["stop", "length"], "c3": ["empty"], "c4": ["tool"]}
    source = tmp_path / "in.jsonl"
    lines = [json.dumps(_conv(c, len(t))) + "\n" for c, t in script.items()]
    source.write_text("".join([lines[0], *lines]))  # c0 twice, in one batch: counted, not rewritten
    monkeypatch.setattr(pipeline, "make_backend", lambda cfg: ScriptedBackend(script))
    counts = {}
    for policy in ("keep_flagged", "drop"):
        cfg = compose_settings(["dataset=demo_prompts", f"generate.length_policy={policy}", "generate.batch_size=2"])
        out = StageOutput.open(tmp_path / "root", "generate", UNIT, generate_stage._unit_config(cfg, UNIT))
        with out:
            manifest = out.finalize(extra=pipeline.generate_file(cfg, UNIT, source, out,
                                                                 CONVERSATIONS_FILE))
        counts[policy] = manifest.counts
        assert manifest.extra["finish_reasons"] == {"length": 2, "stop": 4, "tool_calls": 1}
    assert counts["keep_flagged"]["in"] == counts["drop"]["in"] == 6
    assert counts["keep_flagged"]["rejected"] == {"duplicate_id": 1, "empty_generation": 1}
    assert counts["keep_flagged"]["length_cut_kept"] == 2 and counts["keep_flagged"]["out"] == 4
    assert counts["drop"]["rejected"] == {"duplicate_id": 1, "empty_generation": 1, "length_cut": 2}
    assert counts["drop"]["length_cut_kept"] == 0 and counts["drop"]["out"] == 2
    assert counts["drop"]["tokens_generated"] == counts["keep_flagged"]["tokens_generated"] > 0


def _generate_unit(root: Path, source: Path, backend: ScriptedBackend, monkeypatch) -> Manifest:
    monkeypatch.setattr(pipeline, "make_backend", lambda cfg: backend)
    cfg = compose_settings(["dataset=demo_prompts", "generate.length_policy=drop", "generate.batch_size=3"])
    out = StageOutput.open(root, "generate", UNIT, generate_stage._unit_config(cfg, UNIT))
    with out:
        return out.finalize(extra=pipeline.generate_file(cfg, UNIT, source, out, CONVERSATIONS_FILE))


@pytest.mark.parametrize("independent", [True, False])
def test_failed_requests_leave_conversations_undone_and_a_rerun_asks_for_just_them(tmp_path, monkeypatch,
                                                                                  independent):
    script = {f"c{i}": ["stop", "stop"] if i % 2 else ["length"] for i in range(7)}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(_conv(c, len(t))) + "\n" for c, t in script.items()))
    clean = ScriptedBackend(script, independent=independent)
    reference = _generate_unit(tmp_path / "clean", source, clean, monkeypatch)

    flaky = ScriptedBackend(script, failing=frozenset({"c1:1", "c4:0"}), independent=independent)
    with pytest.raises(Eagle3Error) as info:
        _generate_unit(tmp_path / "out", source, flaky, monkeypatch)
    message = str(info.value)
    assert "\n" not in message and "2 conversation(s) failed" in message, message
    assert "http_503" in message and "rerun the same command to retry them" in message
    unit_dir = tmp_path / "out" / "generate" / reference.dir.name
    assert Manifest.load(unit_dir).status == "running"
    rejects = list(read_jsonl(unit_dir / "rejects.jsonl.partial"))
    assert {r["id"] for r in rejects} == {"c0", "c2", "c6"}  # the length cuts; c4 is not rejected for the outage

    again = ScriptedBackend(script, independent=independent)
    resumed = _generate_unit(tmp_path / "out", source, again, monkeypatch)
    if independent:  # only the failed conversations, under the seeds of their batches
        assert again.calls == [(["c1:0"], clean.calls[0][1]), (["c1:1"], clean.calls[1][1]),
                               (["c4:0"], clean.calls[2][1])]
    else:  # the batches holding them re-run whole, to reproduce their seeds and batching
        assert again.calls == clean.calls[:4]
    for name in (CONVERSATIONS_FILE, "rejects.jsonl"):
        assert (resumed.dir / name).read_bytes() == (reference.dir / name).read_bytes(), name
    assert resumed.counts == reference.counts


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_http_backends_without_urls_say_how_to_connect(backend):
    cfg = compose_settings([f"generate.backend={backend}", f"server@generate.server={backend}"])
    with pytest.raises(BackendUnavailable) as info:
        make_backend(cfg)
    message = str(info.value)
    assert "\n" not in message and "generate.server.urls" in message and "generate.backend=hf" in message


def test_generate_is_registered_after_prep():
    names = [s.name for s in CHAIN]
    assert names.index("prep") + 1 == names.index("generate") < names.index("tokenize")


# ----------------------------------------------------------------------------- the demo target
# One torch thread: on 2 cores shared with other jobs, two spinning OpenMP threads make the demo
# target ~20x slower per step (docs/benchmarks-log.md, "Generate throughput (hf backend)"). The CLI
# subprocesses get the same via the env.
THREADS_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


N_CONVS = 8
MAX_NEW = 64  # long enough for the demo target to finish some thinking turns and go on
REAL = ("dataset=demo_prompts", f"dataset.sources.demo_prompts.num_samples={N_CONVS}",
        "generate.batch_size=4", f"generate.max_new_tokens={MAX_NEW}")


def _stage_cfg(root: Path, *overrides: str):
    return compose_settings([*REAL, f"paths.root={root}", *overrides])


def _run_chain(root: Path, *overrides: str) -> Manifest:
    """demo_data -> prep -> generate in this process; returns the generate manifest."""
    cfg = _stage_cfg(root, *overrides)
    ctx = StageContext(root=root, run_dir=root / "run")
    DEMO_DATA(cfg, ctx)
    PREP(cfg, ctx)
    [manifest] = GENERATE(cfg, ctx)
    return manifest


def _prompts(root: Path, *overrides: str) -> dict[str, list[str]]:
    cfg = _stage_cfg(root, *overrides)
    prep = PREP.locate(cfg, StageContext(root=root, run_dir=root), UNIT)[1]
    return {r["id"]: [m["content"] for m in r["messages"] if m["role"] == "user"]
            for r in read_jsonl(prep.dir / CONVERSATIONS_FILE)}


def _reconciled(m: Manifest) -> None:
    assert m.status == "complete"
    assert m.counts["in"] == N_CONVS == m.counts["out"] + sum(m.counts["rejected"].values()), m.counts


@pytest.mark.slow
@pytest.mark.parametrize("thinking", [True, False])
def test_regenerates_every_turn_with_the_sources_thinking_mode(tmp_path, thinking):
    manifest = _run_chain(tmp_path, f"dataset.sources.demo_prompts.thinking={str(thinking).lower()}")
    _reconciled(manifest)
    prompts = _prompts(tmp_path, f"dataset.sources.demo_prompts.thinking={str(thinking).lower()}")
    records = list(read_jsonl(manifest.dir / CONVERSATIONS_FILE))
    assert records and manifest.counts["out"] == len(records)
    finish = {}
    for rec in records:
        gen = rec["meta"]["generation"]
        users = [m["content"] for m in rec["messages"] if m["role"] == "user"]
        assert users == prompts[rec["id"]][:len(users)], "user turns are replayed in order"
        # Every user turn is answered by exactly one regenerated assistant turn, right after it.
        roles = [m["role"] for m in rec["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] * len(users)
        assert len(gen["turns"]) == len(users) and gen["thinking"] is thinking
        for msg, turn in zip([m for m in rec["messages"] if m["role"] == "assistant"], gen["turns"]):
            assert ("reasoning_content" in msg) is thinking
            assert turn["finish_reason"] in ("stop", "length", "tool_calls") and 0 < turn["completion_tokens"] <= MAX_NEW
            finish[turn["finish_reason"]] = finish.get(turn["finish_reason"], 0) + 1
            if turn["finish_reason"] == "length":
                assert turn["completion_tokens"] == MAX_NEW and rec["meta"]["truncated"]
        dropped = len(prompts[rec["id"]]) - len(users)
        assert gen["dropped_user_turns"] == dropped
        assert (gen["ended"] == "complete") == (dropped == 0 and gen["turns"][-1]["finish_reason"] == "stop")
    assert manifest.extra["finish_reasons"] == dict(sorted(finish.items()))
    assert manifest.counts["assistant_turns"] == sum(finish.values())
    if thinking:
        assert any(m.get("reasoning_content") for r in records for m in r["messages"])
    # The foreign (rule-based) answers of the raw data are nowhere in the output.
    [raw] = [Manifest.load(d) for d in (tmp_path / "demo_data").iterdir()]
    foreign = {t["value"] for r in read_jsonl(raw.dir / "data.jsonl") for t in r["conversations"] if t["from"] == "gpt"}
    answers = {m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"}
    assert foreign and not foreign & answers
    assert any(len(r["meta"]["generation"]["turns"]) > 1 for r in records), "no multi-turn regeneration seen"


@pytest.mark.slow
def test_tiny_max_new_tokens_forces_length_under_both_policies(tmp_path):
    keep = _run_chain(tmp_path, "generate.max_new_tokens=2", "generate.length_policy=keep_flagged")
    _reconciled(keep)
    n_cut = keep.extra["finish_reasons"].get("length", 0)
    assert n_cut >= N_CONVS - 1, keep.extra
    assert keep.counts["length_cut_kept"] == n_cut and "length_cut" not in keep.counts["rejected"]
    try:
        drop = _run_chain(tmp_path, "generate.max_new_tokens=2", "generate.length_policy=drop")
    except NothingKept as exc:  # every answer was cut: dropping them all stops the job at generate
        assert n_cut == N_CONVS and "0 of 8 conversations kept; rejected 8: length_cut 8" in str(exc)
        [unit] = [d for d in (tmp_path / "generate").iterdir() if d != keep.dir]
        drop = Manifest.load(unit)
        assert drop.status == "stopped"
        assert drop.counts["in"] == N_CONVS == sum(drop.counts["rejected"].values())
    else:
        _reconciled(drop)
    assert drop.counts["rejected"].get("length_cut") == n_cut and drop.counts["length_cut_kept"] == 0
    assert drop.counts["out"] == keep.counts["out"] - n_cut
    for rec in read_jsonl(keep.dir / CONVERSATIONS_FILE):
        assert rec["messages"][-1]["role"] == "assistant"
        if rec["meta"]["truncated"]:
            assert rec["meta"]["generation"]["turns"][-1] == {**rec["meta"]["generation"]["turns"][-1],
                                                               "finish_reason": "length", "completion_tokens": 2}
    rejects = list(read_jsonl(drop.dir / "rejects.jsonl"))
    assert {r["reason"] for r in rejects} <= {"length_cut", "empty_generation"}


KILL = ("generate.batch_size=2", "generate.max_new_tokens=16")  # 4 batches: time to kill mid-way


def _cli(root: Path, *args: str, multirun: bool = False) -> list[str]:
    flags = ["-m"] if multirun else []
    return [sys.executable, str(RUN_PY), *flags, *REAL, *KILL, *args, f"paths.root={root}"]


def _lines(*paths: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


@pytest.mark.slow
def test_kill_9_during_generate_then_rerun_equals_an_uninterrupted_run(tmp_path):
    env = dict(os.environ, HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1", **THREADS_ENV)
    killed = tmp_path / "killed"
    # The CLI chain demo_data -> prep -> generate (the first two as one sequential multirun,
    # which saves a process start).
    done = subprocess.run(_cli(killed, "stage=demo_data,prep", multirun=True), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = _stage_cfg(killed, *KILL)
    unit_dir = GENERATE.locate(cfg, StageContext(root=killed, run_dir=killed), UNIT)[0]
    partials = [unit_dir / f"{CONVERSATIONS_FILE}.partial", unit_dir / "rejects.jsonl.partial"]

    # Killed once a whole batch is written (KILL's batch_size=2; records are written one by one, so
    # a kill after the first line may leave no batch to skip; the half-written batch is the next case).
    kill_9_when(_cli(killed, "stage=generate"), lambda: _lines(*partials) >= 2, cwd=tmp_path, env=env)
    assert Manifest.load(unit_dir).status == "running"
    assert 0 < _lines(*partials) < N_CONVS

    rerun = subprocess.run(_cli(killed, "stage=generate"), cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "[generate] demo_prompts" in rerun.stdout + rerun.stderr
    resumed = Manifest.load(unit_dir)
    assert resumed.status == "complete" and resumed.extra["this_run"]["batches_skipped"] >= 1

    clean = _run_chain(tmp_path / "clean", *KILL)
    assert clean.dir.name == unit_dir.name  # same config and inputs -> same fingerprint
    assert (unit_dir / CONVERSATIONS_FILE).read_bytes() == (clean.dir / CONVERSATIONS_FILE).read_bytes()
    assert (unit_dir / "rejects.jsonl").read_bytes() == (clean.dir / "rejects.jsonl").read_bytes()
    assert resumed.counts == clean.counts and clean.counts["in"] == N_CONVS

    # A batch cut half-way (the kill landed between two writes): the rerun reruns the whole
    # batch, reproduces it exactly and writes only what is missing.
    half = tmp_path / "half"
    cfg, ctx = _stage_cfg(half, *KILL), StageContext(root=half, run_dir=half)
    DEMO_DATA(cfg, ctx)
    PREP(cfg, ctx)
    clean_lines = (clean.dir / CONVERSATIONS_FILE).read_bytes().splitlines(keepends=True)
    with StageOutput.open(half, "generate", UNIT, generate_stage._unit_config(cfg, UNIT),
                          inputs=generate_stage._unit_inputs(cfg, ctx, UNIT)) as out:
        for line in clean_lines[:3]:
            out.records(CONVERSATIONS_FILE).write(json.loads(line))
    [again] = GENERATE(cfg, ctx)
    assert (again.dir / CONVERSATIONS_FILE).read_bytes() == b"".join(clean_lines)
    assert again.counts == clean.counts and again.extra["this_run"]["batches_run"] >= 1


POOL_FILE = FIXTURES / "demo_prompts_small.jsonl"  # 30 ShareGPT records
FIXED_POOL = (f"dataset.sources.demo_prompts.data_files=[{POOL_FILE}]", "dataset.sources.demo_prompts.generator=null",
              "generate.batch_size=4", "generate.max_new_tokens=24")


def _generate_sample(root: Path, num_samples: int, *overrides: str, force: bool = False) -> Manifest:
    """prep -> generate of `num_samples` prompts from the fixed 30-record ShareGPT fixture."""
    cfg = compose_settings(["dataset=demo_prompts", *FIXED_POOL, f"paths.root={root}",
                          f"dataset.sources.demo_prompts.num_samples={num_samples}", *overrides])
    PREP(cfg, StageContext(root=root, run_dir=root / "run"))
    [manifest] = GENERATE(cfg, StageContext(root=root, run_dir=root / "run", force=force))
    return manifest


@pytest.mark.slow
def test_a_larger_sample_reuses_the_batches_a_smaller_one_ran_and_equals_a_fresh_run(tmp_path, monkeypatch):
    # 8 prompts = 2 full batches of 4; prep's sample of 10 starts with those same 8 (key order).
    small = _generate_sample(tmp_path / "grown", 8)
    assert small.extra["this_run"]["batches_run"] == 2 and small.extra["reused_from"] == {}
    # stage=plan, before the grown run: 8 of its 10 conversations would be copied.
    from eagle3.stages.plan import plan_data

    cfg = compose_settings(["dataset=demo_prompts", *FIXED_POOL, "dataset.sources.demo_prompts.num_samples=10",
                          f"paths.root={tmp_path / 'grown'}"])
    PREP(cfg, StageContext(root=tmp_path / "grown", run_dir=tmp_path / "run"))
    planned = {s["stage"]: s["units"] for s in plan_data(cfg, StageContext(root=tmp_path / "grown",
                                                                           run_dir=tmp_path / "run"))["stages"]}
    [gen_row] = planned["generate"]
    assert gen_row["status"] == "missing" and gen_row["figures"]["copied_from_earlier"]["value"] == 8
    assert gen_row["figures"]["generated_tokens_one_turn"]["value"] == 2 * 24  # 2 left x max_new_tokens
    assert "8 copied from earlier outputs" in gen_row["other"]
    grown = _generate_sample(tmp_path / "grown", 10)
    assert grown.dir != small.dir
    assert grown.extra["this_run"]["batches_reused"] == 2 and grown.extra["this_run"]["conversations_reused"] == 8
    assert grown.extra["this_run"]["batches_run"] == 1 and grown.extra["this_run"]["conversations"] == 2
    assert grown.extra["reused_from"] == {str(small.dir): 8}
    # Exactly what a run that never saw the smaller sample writes: same files, same counts.
    fresh = _generate_sample(tmp_path / "fresh", 10)
    assert fresh.extra["this_run"]["batches_run"] == 3 and fresh.extra["reused_from"] == {}
    assert fresh.dir.name == grown.dir.name  # reuse is not part of the fingerprint
    for name in (CONVERSATIONS_FILE, "rejects.jsonl"):
        assert (grown.dir / name).read_bytes() == (fresh.dir / name).read_bytes(), name
    assert grown.counts == fresh.counts and grown.counts["in"] == 10
    assert grown.extra["finish_reasons"] == fresh.extra["finish_reasons"]

    # A smaller sample whose batches all ran before generates nothing; another sampling config
    # (other answers) and reuse_earlier=false reuse nothing.
    with monkeypatch.context() as patch:  # nothing to generate: the target is not even loaded
        patch.setattr(pipeline, "make_backend", lambda cfg: pytest.fail("the target was loaded"))
        shrunk = _generate_sample(tmp_path / "grown", 4)
    assert shrunk.extra["this_run"]["batches_run"] == 0 and shrunk.extra["this_run"]["batches_reused"] == 1
    assert shrunk.extra["backend"]["loaded"] is False
    assert list(read_jsonl(shrunk.dir / CONVERSATIONS_FILE)) == list(read_jsonl(fresh.dir / CONVERSATIONS_FILE))[:4]
    hotter = _generate_sample(tmp_path / "grown", 4, "generate.temperature=0.9")
    assert hotter.extra["this_run"]["batches_run"] == 1 and hotter.extra["reused_from"] == {}
    again = _generate_sample(tmp_path / "grown", 4, "generate.reuse_earlier=false", force=True)
    assert again.dir == shrunk.dir and again.extra["this_run"]["batches_run"] == 1
    assert again.extra["reused_from"] == {}
