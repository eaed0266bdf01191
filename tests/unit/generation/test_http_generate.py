"""Stage `generate` over HTTP (generate.backend=vllm|sglang with generate.server.urls): the OpenAI-compatible client.

Every test talks to real HTTP endpoints on 127.0.0.1 (`MockChatServer`, an aiohttp app on a
random port that answers like vLLM/SGLang with their reasoning and tool-call parsers on):

* the wire format: what a request carries (thinking via chat_template_kwargs, tools, sampling,
  a per-request seed) and how responses of either engine become canonical messages;
* the client alone: retries over dropped connections, 5xx/429 and stalls, a too-long prompt,
  concurrency partitions, endpoints sharing the load, a dead server stopping the run;
* the stage: (a) the CLI regenerates 60 demo prompts with reasoning and tool calls captured;
  (b) against a faulty server nothing is lost or duplicated, counts reconcile, and a kill -9
  mid-run then a rerun ends byte-equal to an uninterrupted run; (c) several endpoints (one of
  them dead) share the load and give the same output as one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.cli import check_config
from eagle3.config.client_schema import GenerateHTTPConfig, GeneratePartitionConfig
from eagle3.generation.factory import make_backend
from eagle3.generation.http_backend import HTTPBackend
from eagle3.generation.openai_chat import (
    BadResponse,
    build_body,
    chat_url,
    is_context_error,
    request_seed,
    to_result,
)
from eagle3.generation.types import BackendUnavailable, GenerationRequest, SamplingParams
from eagle3.serving.http import backoff_delay, models_url
from eagle3.stages import StageContext
from eagle3.stages.demo_data import DEMO_DATA
from eagle3.stages.generate import CONVERSATIONS_FILE, GENERATE
from eagle3.stages.prep import PREP
from tests.conftest import FIXTURES, HANG_GUARD_S, RUN_PY, compose_config, compose_settings, kill_9_when, run_cli
from tests.mock_openai_server import TOO_LONG_MARKER, FaultPlan, MockChatServer, conversation_key, request_key

UNIT = "demo_prompts"
N_CONVS = 60
DATA = ("dataset=demo_prompts", f"dataset.sources.demo_prompts.num_samples={N_CONVS}",
        "generate.batch_size=4", "generate.max_new_tokens=64")
# Generating through SGLang: the backend and its server node.
SGLANG = ("generate.backend=sglang", "server@generate.server=sglang")
# Fast retries for tests: the schedule, not the clock, decides what fails.
FAST = ("generate.http.backoff_s=0.01", "generate.http.max_backoff_s=0.05", "generate.http.connect_wait_s=10",
        "generate.http.log_every_s=0.5")


def _urls(*urls: str) -> str:
    return f"generate.server.urls=[{','.join(urls)}]"


def _backend(*urls: str, **kw) -> HTTPBackend:
    """A client of `urls` with the schema's `generate.http` defaults, fast retries and `kw` on top."""
    fast = dict(request_timeout_s=5.0, backoff_s=0.01, max_backoff_s=0.05, max_attempts=4, connect_wait_s=5.0)
    return HTTPBackend(urls, dataclasses.replace(GenerateHTTPConfig(), **{**fast, **kw}))


def _requests(n: int, prefix: str = "c", thinking: bool = True, size: int = 1) -> list[GenerationRequest]:
    return [GenerationRequest(id=f"{prefix}{i}:0", messages=[{"role": "user", "content": f"question {i} " * size}],
                              thinking=thinking) for i in range(n)]


PARAMS = SamplingParams(max_new_tokens=32, temperature=0.6, top_p=0.95, seed=11)


# ----------------------------------------------------------------------------- wire format
def test_request_body_carries_thinking_tools_sampling_and_a_per_request_seed():
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
               {"role": "user", "content": "q2"}]
    req = GenerationRequest(id="conv-1:1", messages=history, tools=tools, thinking=False)
    body = build_body(req, PARAMS, model="kimi", thinking_keys=("thinking",),
                      chat_template_kwargs={"thinking": True, "other": 1}, extra_body={"skip_special_tokens": False})
    assert body["chat_template_kwargs"] == {"thinking": False, "other": 1}  # the source's mode wins
    assert body["tools"] == tools and body["messages"] == history and body["model"] == "kimi"
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (32, 0.6, 0.95)
    assert body["stream"] is False and body["n"] == 1 and body["skip_special_tokens"] is False
    assert body["seed"] == request_seed(11, "conv-1:1") < 2**31
    assert request_seed(11, "conv-2:1") != body["seed"] != request_seed(12, "conv-1:1")
    assert "tools" not in build_body(GenerationRequest(id="x", messages=history), PARAMS, model="m")
    assert chat_url("http://h:1/v1/") == chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert models_url("http://h:1/v1") == "http://h:1/v1/models"


def _response(message: dict, finish: str = "stop", usage=(7, 5)) -> dict:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}


def test_responses_of_either_engine_become_canonical_messages():
    think, plain = GenerationRequest(id="a", messages=[]), GenerationRequest(id="b", messages=[], thinking=False)
    # SGLang / older vLLM name the field reasoning_content, newer vLLM `reasoning`.
    for field in ("reasoning_content", "reasoning"):
        r = to_result(think, _response({"role": "assistant", "content": "hi", field: "why"}))
        assert r.message == {"role": "assistant", "content": "hi", "reasoning_content": "why"}
        assert (r.finish_reason, r.prompt_tokens, r.completion_tokens, r.error) == ("stop", 7, 5, None)
    # No reasoning parser on the server: the think block is split off the content.
    r = to_result(think, _response({"role": "assistant", "content": "<think>why</think>hi"}))
    assert r.message["reasoning_content"] == "why" and r.message["content"] == "hi"
    assert to_result(think, _response({"role": "assistant", "content": "hi"})).message["reasoning_content"] == ""
    # Thinking off: no reasoning_content; stray reasoning is kept as answer text.
    r = to_result(plain, _response({"role": "assistant", "content": "hi", "reasoning": "why "}))
    assert r.message == {"role": "assistant", "content": "why hi"}
    # Tool calls: engine extras dropped, parsed arguments re-serialized, null content, and the
    # finish reason follows the message (some servers say `stop`); `length` wins.
    call = {"id": "functions.lookup:0", "index": 0, "type": "function",
            "function": {"name": "lookup", "arguments": {"q": "x"}}}
    r = to_result(think, _response({"role": "assistant", "content": None, "reasoning_content": "r",
                                    "tool_calls": [call]}, finish="stop"))
    assert r.finish_reason == "tool_calls" and r.message["content"] == ""
    assert r.message["tool_calls"] == [{"id": "functions.lookup:0", "type": "function",
                                        "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    r = to_result(think, _response({"role": "assistant", "content": "", "tool_calls": [call]}, finish="length"))
    assert r.finish_reason == "length"
    # A turn whose ending is unknown, or text that cannot be UTF-8, is an error result, not a message.
    for finish in (None, "weird", "content_filter"):
        r = to_result(think, _response({"role": "assistant", "content": "hi"}, finish=finish))
        assert (r.error, r.error_detail, r.message) == ("unknown_finish_reason", f"finish_reason={finish!r}", {})
    r = to_result(think, json.loads('{"choices": [{"finish_reason": "stop", "message": {"content": "a\\ud800b"}}]}'))
    assert r.error == "invalid_utf8" and r.message == {} and "surrogate" in r.error_detail
    for bad in ({"object": "error", "message": "boom"}, {"choices": []}, [1],
                _response({"role": "assistant", "content": ""}, finish="abort")):
        with pytest.raises(BadResponse):
            to_result(think, bad)
    assert is_context_error(400, "This model's maximum context length is 2048 tokens. However, you requested 9")
    assert is_context_error(400, "The input (3000 tokens) is longer than the model's context length (2048 tokens).")
    assert not is_context_error(500, "maximum context length") and not is_context_error(400, "bad tool schema")


def test_backoff_is_exponential_capped_and_jittered():
    rng = random.Random(0)
    for attempt, step in ((1, 1.0), (2, 2.0), (3, 4.0), (8, 10.0)):
        delays = [backoff_delay(attempt, 1.0, 10.0, rng) for _ in range(200)]
        assert step / 2 <= min(delays) and max(delays) <= step and len(set(delays)) > 100
    assert backoff_delay(1, 1.0, 10.0, rng, retry_after=5) == 5
    assert backoff_delay(1, 1.0, 10.0, rng, retry_after=500) == 10


def test_config_validation_of_the_client_keys():
    cfg = compose_config(["generate.backend=vllm", _urls("http://127.0.0.1:1"),
                          "generate.http.partitions=[{max_context:100,concurrency:0},{max_context:100,concurrency:2}]",
                          "generate.http.endpoint_strategy=random", "generate.http.max_attempts=0",
                          "generate.http.thinking_keys=[]", "+generate.http.extra_body.seed=3"])
    errors = "\n".join(check_config(cfg))
    for key in ("partitions[0].concurrency", "generate.http.partitions:", "endpoint_strategy", "max_attempts",
                "thinking_keys", "extra_body.seed"):
        assert key in errors, (key, errors)
    assert check_config(compose_config([*SGLANG, _urls("http://127.0.0.1:1")])) == []


# ----------------------------------------------------------------------------- the client
def test_retries_through_drops_5xx_429_and_stalls_and_reports_what_still_fails():
    faults = FaultPlan(seed=3, p_fault=0.6, max_faulty_attempts=2, p_permanent=0.1, stall_s=1.0)
    with MockChatServer(faults=faults, tool_every=5, length_every=7, record_bodies=True) as server:
        backend = _backend(server.url, request_timeout_s=0.4, max_attempts=4)
        try:
            requests = _requests(40) + [GenerationRequest(id="long:0", messages=[
                {"role": "user", "content": f"{TOO_LONG_MARKER} please"}])]
            results = backend.generate(requests, PARAMS)
            stats = backend.stats()
        finally:
            backend.close()
    assert [r.id for r in results] == [r.id for r in requests]  # request order, every request answered
    assert {"drop", "http_500", "http_503", "http_429", "stall"} <= set(server.stats), server.stats
    assert stats["retries"] > 0 and {"timeout", "connection", "http_500"} <= set(stats["errors"]), stats
    failed = [r for r in results if r.error == "request_failed"]
    permanent = [r for r in requests[:40] if faults.fault(_key(server, r), 99)]  # fails on every attempt
    assert len(failed) == len(permanent) > 0 and stats["requests_failed"] == len(failed)
    assert all("http_500" in r.error_detail and "attempt 4 of 4" in r.error_detail for r in failed)
    ok = [r for r in results if r.error is None]
    assert len(ok) == 40 - len(failed) and all(r.message.get("reasoning_content") for r in ok)
    assert {r.finish_reason for r in ok} == {"stop", "length", "tool_calls"}
    [too_long] = [r for r in results if r.id == "long:0"]
    assert too_long.error == "prompt_too_long" and "maximum context length" in too_long.error_detail
    assert server.stats["too_long"] == 1, "a prompt the server refuses as too long is not retried"


def _key(server: MockChatServer, request: GenerationRequest) -> str:
    """The mock server's key of a request as the client sends it (default settings)."""
    keys = GenerateHTTPConfig().thinking_keys
    return request_key(build_body(request, PARAMS, model=server.model, thinking_keys=keys))


def test_partitions_cap_concurrency_by_prompt_length():
    # At the default 3 characters per token, short prompts are ~12 tokens, long ones ~490.
    with MockChatServer(latency_s=0.15, long_chars=1000) as server:
        parts = [GeneratePartitionConfig(max_context=100, concurrency=4),
                 GeneratePartitionConfig(max_context=None, concurrency=2)]
        backend = _backend(server.url, partitions=parts)
        try:
            short, long = _requests(24, "s"), _requests(8, "l", size=120)
            results = backend.generate(short + long, PARAMS)
            assert backend.stats()["partitions"] == {"<=100": 24, "any": 8}
        finally:
            backend.close()
        assert all(r.error is None for r in results)
        assert server.max_inflight["short"] == 4 and server.max_inflight["long"] == 2, server.max_inflight
        assert server.max_inflight["all"] == 6  # the partitions run side by side
        # Only finite partitions: a prompt longer than all of them is refused before sending.
        backend = _backend(server.url, partitions=[GeneratePartitionConfig(max_context=100, concurrency=4)])
        try:
            [r] = backend.generate(_requests(1, "x", size=200), PARAMS)
        finally:
            backend.close()
        assert r.error == "prompt_too_long" and r.prompt_tokens > 100


def test_endpoints_share_the_load_round_robin_and_least_busy():
    servers = [MockChatServer(latency_s=0.05).start() for _ in range(3)]
    try:
        urls = [s.url for s in servers]
        backend = _backend(*urls, endpoint_strategy="round_robin")
        try:
            backend.generate(_requests(30), PARAMS)
        finally:
            backend.close()
        assert [s.stats["ok"] for s in servers] == [10, 10, 10]
        for s in servers:
            s.reset()
        backend = _backend(*urls, partitions=[GeneratePartitionConfig(None, 6)])
        try:
            backend.generate(_requests(60), PARAMS)
        finally:
            backend.close()
        assert sum(s.stats["ok"] for s in servers) == 60 and min(s.stats["ok"] for s in servers) >= 15
        assert max(s.max_inflight["all"] for s in servers) <= 3  # least busy keeps them level
    finally:
        for s in servers:
            s.stop()


def test_dead_endpoints_stop_the_run_instead_of_rejecting_everything():
    with MockChatServer(faults=FaultPlan(p_permanent=1.0)) as server:
        backend = _backend(server.url, max_attempts=2, max_consecutive_failures=5,
                           partitions=[GeneratePartitionConfig(None, 2)])
        try:
            with pytest.raises(BackendUnavailable, match="in a row failed"):
                backend.generate(_requests(40), PARAMS)
        finally:
            backend.close()
        assert server.stats["requests"] < 40 * 2  # it stopped early
    with pytest.raises(BackendUnavailable, match="no endpoint answered"):
        backend = _backend("http://127.0.0.1:9", connect_wait_s=0.5)
        try:
            backend.generate(_requests(1), PARAMS)
        finally:
            backend.close()
    cfg = compose_settings(["generate.backend=vllm"])
    with pytest.raises(BackendUnavailable, match="generate.server.urls"):
        make_backend(cfg)
    assert isinstance(make_backend(cfg, urls=["http://127.0.0.1:9"]), HTTPBackend)  # a launcher's URLs


# ----------------------------------------------------------------------------- the stage
def _prepare(root: Path, *overrides: str):
    """demo_data -> prep in this process; returns (cfg, ctx) for the generate overrides."""
    cfg = compose_settings([*DATA, f"paths.root={root}", *overrides])
    ctx = StageContext(root=root, run_dir=root / "run")
    DEMO_DATA(cfg, ctx)
    PREP(cfg, ctx)
    return cfg, ctx


def _prep_ids(cfg, ctx) -> list[str]:
    prep = PREP.locate(cfg, ctx, UNIT)[1]
    return [r["id"] for r in read_jsonl(prep.dir / CONVERSATIONS_FILE)]


def _check_complete_and_exact(manifest: Manifest, prep_ids: list[str]) -> tuple[list[dict], list[dict]]:
    """Every input id exactly once in output + rejects, and the counts say so."""
    assert manifest.status == "complete"
    records = list(read_jsonl(manifest.dir / CONVERSATIONS_FILE))
    rejects = list(read_jsonl(manifest.dir / "rejects.jsonl"))
    ids = [r["id"] for r in records] + [r["id"] for r in rejects]
    assert sorted(ids) == sorted(prep_ids) and len(set(ids)) == len(ids), "lost or duplicated conversations"
    counts = manifest.counts
    assert counts["in"] == len(prep_ids) == counts["out"] + sum(counts["rejected"].values()), counts
    assert counts["out"] == len(records) and sum(counts["rejected"].values()) == len(rejects)
    return records, rejects


def test_a_cli_generate_over_http_writes_canonical_conversations_with_reasoning(tmp_path):
    with MockChatServer(reasoning_field="reasoning", tool_every=6, record_bodies=True) as server:
        cfg, ctx = _prepare(tmp_path / "artifacts", "generate.backend=vllm", _urls(server.url))
        done = run_cli([*DATA, "stage=generate", "generate.backend=vllm", _urls(server.url), *FAST,
                        f"paths.root={tmp_path / 'artifacts'}"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[generate] demo_prompts" in done.stdout + done.stderr
    manifest = GENERATE.locate(cfg, ctx, UNIT)[1]
    assert manifest is not None
    records, rejects = _check_complete_and_exact(manifest, _prep_ids(cfg, ctx))
    assert len(records) == N_CONVS and not rejects
    ended = Counter(r["meta"]["generation"]["ended"] for r in records)
    assert ended["tool_calls"] > 0 and ended["complete"] > 0, ended
    for rec in records:
        assert rec["track"] == "prompt_only" and rec["source"] == UNIT
        roles = [m["role"] for m in rec["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        for msg in (m for m in rec["messages"] if m["role"] == "assistant"):
            assert msg["reasoning_content"].startswith("The user asks:")  # vLLM's `reasoning`, captured
            assert set(msg) <= {"role", "content", "reasoning_content", "tool_calls"}
            for call in msg.get("tool_calls", []):
                assert set(call) == {"id", "type", "function"} and json.loads(call["function"]["arguments"])
        turns = rec["meta"]["generation"]["turns"]
        assert all(t["completion_tokens"] > 0 and t["prompt_tokens"] > 0 for t in turns)
    # What went over the wire: the source's thinking mode, the served model, the sampling knobs.
    body = server.bodies[0]
    assert body["model"] == "mock-target" and body["chat_template_kwargs"]["thinking"] is True
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (64, 0.6, 0.95)
    extra = manifest.extra
    assert extra["backend"]["backend"] == "vllm" and extra["backend"]["urls"] == [server.url]
    client = extra["this_run"]["client"]
    assert client["requests_ok"] == manifest.counts["assistant_turns"] == server.stats["ok"]
    assert extra["this_run"]["inflight_batches"] > 1
    assert "generate demo_prompts: 60/60 conv (100%)" in done.stdout + done.stderr  # the progress line


FAULTY = FaultPlan(seed=7, p_fault=0.35, max_faulty_attempts=2, stall_s=2.0)  # every request gets through
FAULT_CLIENT = ("generate.backend=vllm", "generate.http.request_timeout_s=1.0", "generate.http.max_attempts=5",
                "generate.http.inflight_batches=2", *FAST)


def _lines(*paths: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


@pytest.mark.slow
def test_b_faults_lose_nothing_and_a_kill_9_rerun_equals_an_uninterrupted_run(tmp_path):
    env = dict(os.environ, HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    with MockChatServer(faults=FAULTY, latency_s=0.05, length_every=5, tool_every=11) as server:
        overrides = (*FAULT_CLIENT, _urls(server.url))
        killed = tmp_path / "killed"
        cfg, ctx = _prepare(killed, *overrides)
        unit_dir = GENERATE.locate(cfg, ctx, UNIT)[0]
        partials = [unit_dir / f"{CONVERSATIONS_FILE}.partial", unit_dir / "rejects.jsonl.partial"]
        cli = [sys.executable, str(RUN_PY), *DATA, "stage=generate", *overrides, f"paths.root={killed}"]
        kill_9_when(cli, lambda: _lines(*partials) >= 8, cwd=tmp_path, env=env, poll_s=0.01)
        assert Manifest.load(unit_dir).status == "running"
        assert 0 < _lines(*partials) < N_CONVS

        server.reset()  # the rerun meets the same fault schedule as a fresh server
        rerun = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        resumed = Manifest.load(unit_dir)
        assert resumed.extra["this_run"]["batches_skipped"] >= 1

        server.reset()
        clean_cfg, clean_ctx = _prepare(tmp_path / "clean", *overrides)
        [clean] = GENERATE(clean_cfg, clean_ctx)
        faults_seen = dict(server.stats)

    assert clean.dir.name == unit_dir.name  # same config and inputs -> same fingerprint
    records, rejects = _check_complete_and_exact(clean, _prep_ids(clean_cfg, clean_ctx))
    _check_complete_and_exact(resumed, _prep_ids(cfg, ctx))
    for name in (CONVERSATIONS_FILE, "rejects.jsonl"):
        assert (unit_dir / name).read_bytes() == (clean.dir / name).read_bytes(), name
    assert resumed.counts == clean.counts
    # The faults happened and were retried through: nothing rejected, the length cuts kept
    # flagged. (Requests that fail for good are tests/unit/generation/test_http_generate.py's.)
    assert {"drop", "http_500", "http_503", "http_429", "stall"} <= set(faults_seen), faults_seen
    client = clean.extra["this_run"]["client"]
    assert client["retries"] > 0 and {"timeout", "connection"} <= set(client["errors"]), client
    assert not rejects and client["requests_failed"] == 0 and not clean.counts["rejected"]
    assert clean.extra["finish_reasons"].get("length", 0) > 0 and clean.counts["length_cut_kept"] > 0
    assert len(records) == N_CONVS


def test_c_several_endpoints_one_dead_share_the_load_and_match_one_endpoint(tmp_path):
    servers = [MockChatServer(latency_s=0.03, tool_every=7, length_every=9).start() for _ in range(4)]
    try:
        *many, single = servers
        shared = (*SGLANG, *FAST, "generate.http.inflight_batches=4")
        cfg, ctx = _prepare(tmp_path / "many", *shared, _urls(*(s.url for s in many), "http://127.0.0.1:9"))
        [multi] = GENERATE(cfg, ctx)
        one_cfg, one_ctx = _prepare(tmp_path / "one", *shared, _urls(single.url))
        [one] = GENERATE(one_cfg, one_ctx)
    finally:
        for s in servers:
            s.stop()
    _check_complete_and_exact(multi, _prep_ids(cfg, ctx))
    assert multi.dir.name == one.dir.name  # endpoints are not part of what is generated
    assert (multi.dir / CONVERSATIONS_FILE).read_bytes() == (one.dir / CONVERSATIONS_FILE).read_bytes()
    served = [s.stats["ok"] for s in many]
    assert sum(served) == single.stats["ok"] == multi.counts["assistant_turns"]
    assert min(served) >= sum(served) // 6, served  # each live endpoint took a real share
    endpoints = multi.extra["this_run"]["client"]["endpoints"]
    assert endpoints["http://127.0.0.1:9"]["alive_at_start"] is False
    assert endpoints["http://127.0.0.1:9"]["ok"] == 0 and not multi.counts["rejected"]


def test_c2_a_launched_server_hands_its_urls_to_the_units_as_a_connected_one_does(tmp_path, monkeypatch):
    """Without generate.server.urls the stage launches `generate.server` (speculation off: no draft_path)
    and runs its units against it: the same unit, byte for byte, as a run connecting to that server."""
    from eagle3.serving import process

    launched = []

    @contextlib.contextmanager
    def endpoints(cfg, run_dir, *args, **kwargs):  # stands in for the launch: the URLs of the mock server
        launched.append(cfg)
        yield [server.url]

    monkeypatch.setattr(process, "server_endpoints", endpoints)
    shared = ("generate.backend=vllm", "server@generate.server=vllm", "generate.server.port=31234", *FAST)
    with MockChatServer(latency_s=0.01, tool_every=7) as server:
        cfg, ctx = _prepare(tmp_path / "launched", *shared)
        [manifest] = GENERATE(cfg, ctx)
        connected_cfg, connected_ctx = _prepare(tmp_path / "connected", *shared, _urls(server.url))
        [connected] = GENERATE(connected_cfg, connected_ctx)
    [launch] = launched  # the connecting run launched nothing
    assert (launch.server.backend, launch.server.port) == ("vllm", 31234)
    assert launch.server.speculative.algorithm is None and launch.generate.server.speculative.algorithm == "EAGLE3"
    assert not cfg.generate.server.urls  # the caller's config is untouched
    assert manifest.extra["backend"]["urls"] == [server.url]
    _check_complete_and_exact(manifest, _prep_ids(cfg, ctx))
    assert manifest.dir.name == connected.dir.name  # the URLs are not part of the fingerprint
    assert (manifest.dir / CONVERSATIONS_FILE).read_bytes() == (connected.dir / CONVERSATIONS_FILE).read_bytes()


def test_d_a_grown_sample_reuses_earlier_batches_in_order_and_equals_a_fresh_run(tmp_path):
    fixture = FIXTURES / "demo_prompts_small.jsonl"  # a fixed pool of 30
    server = MockChatServer(latency_s=0.01, tool_every=7, length_every=5).start()
    try:
        shared = ("dataset=demo_prompts", f"dataset.sources.demo_prompts.data_files=[{fixture}]",
                  "dataset.sources.demo_prompts.generator=null", "generate.batch_size=4",
                  "generate.length_policy=drop", "generate.backend=vllm", *FAST, "generate.http.inflight_batches=3",
                  _urls(server.url))

        def generate(root: Path, n: int, *overrides: str) -> Manifest:
            cfg = compose_settings([*shared, f"dataset.sources.demo_prompts.num_samples={n}", f"paths.root={root}",
                                    *overrides])
            ctx = StageContext(root=root, run_dir=root / "run")
            PREP(cfg, ctx)
            [manifest] = GENERATE(cfg, ctx)
            return manifest

        served = []
        for root, n in (("grown", 12), ("grown", 30), ("fresh", 30)):
            before = server.stats["ok"]
            served.append((generate(tmp_path / root, n), server.stats["ok"] - before))
        # All batches of a sample of 8 ran before: no server is launched (none could be: the
        # test's interpreter has no vLLM) and none is asked.
        before = server.stats["ok"]
        shrunk = generate(tmp_path / "fresh", 8, "generate.server.urls=[]")
        assert server.stats["ok"] == before and shrunk.extra["backend"]["loaded"] is False
        assert shrunk.extra["this_run"]["batches_reused"] == 2 and shrunk.counts["in"] == 8
    finally:
        server.stop()
    (small, served_small), (grown, served_growth), (fresh, served_fresh) = served
    this_run = grown.extra["this_run"]
    assert this_run["batches_reused"] == 3 and this_run["batches_run"] == 5
    assert grown.extra["reused_from"] == {str(small.dir): 12}
    assert small.counts["rejected"].get("length_cut"), "the reused batches hold rejects too"
    assert 0 < served_growth == served_fresh - served_small  # no request for a reused conversation
    for name in (CONVERSATIONS_FILE, "rejects.jsonl"):
        assert (grown.dir / name).read_bytes() == (fresh.dir / name).read_bytes(), name
    assert grown.counts == fresh.counts and grown.counts["in"] == 30


# ----------------------------------------------------------------------------- through an outage
# Stage `generate` over HTTP through a server outage: nothing is lost to it, nothing is rejected for it.
#
# A request that fails after all its retries (`request_failed`) says nothing about its conversation:
# the server was down. Such conversations are left undone (not rejected), the unit is not finalized
# (the CLI exits 3 with one line saying how many and to rerun), and the rerun sends exactly those
# conversations, then restores the source order, so the unit ends byte-equal to a run that never
# saw the outage. Outputs of earlier versions, which did write `request_failed` rejects, are
# healed the same way on resume, and reuse never copies such a reject. A server that answers with
# something unusable (an unknown finish reason, bytes that are not UTF-8) is not down: that
# conversation is rejected with the reason, and nothing garbled reaches the training text.

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


FIXTURE = FIXTURES / "demo_prompts_small.jsonl"  # a fixed pool of 30


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
