"""Stage `bench`: the served target without and with the EAGLE-3 draft -- tok/s and accept length.

Standalone (not part of `stage=all`). The same held-out prompts the in-process eval decodes
(the first assistant turn of the merged eval split, as token ids, `eval.heldout_prompts`) are
sent greedily (temperature 0, `bench.max_new_tokens` each, `bench.concurrency` at a time) to

1. the target alone (`server.speculative.algorithm` off), then
2. the target with the draft (`server.speculative.*`; the export for this engine of this
   config's train output unless `server.speculative.draft_path` names one),

each launched with the project's launcher (`eagle3.serving`; the draft and the EAGLE/EAGLE3
choice are checked before launch, so an EAGLE-3 draft is never served with EAGLE) and stopped
afterwards. With `server.urls` nothing is launched: those URLs are the speculative server and
`bench.baseline_urls` the baseline (neither's flags can be checked then).

Reported: output tokens/s of both, the speedup, and the accept length read from the engine's own
counters -- tokens per target forward, excluding the prefill token, as `stage=eval` counts it:

* vLLM: deltas of `/metrics` over the measured requests,
  `1 + vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_drafts_total`
  (each draft round is one target forward that commits the accepted tokens plus one);
* SGLang: per request `meta_info`, `sum(completion_tokens - 1) / sum(spec_verify_ct)`
  (`completion_tokens / spec_verify_ct` would count the prefill's token too), or else
  `/get_server_info` `internal_states[i].avg_spec_accept_length`.

An accept length <= `bench.min_accept_length` (1.05) under speculation means the draft is not
used at all; it is reported as a FAILED benchmark with the likely causes, not as a number, and
the job exits non-zero. The chain's outputs (prompts, draft, eval) are looked up under the
benchmarked `server.backend`, else under the one other backend that generated a chain (the demo
chain runs on `hf`; `bench.data_backend` chooses when several did; `eagle3.stages.chain`).
When the in-process eval of this config is complete, its accept length at the same K (`server.speculative.num_steps`) is put beside the engine's, with the relative
difference. Whether both servers produced the same greedy tokens is reported too.

Results: `bench_report.json`, `bench_report.md`, `bench.png` in the unit directory and the run
directory, logged to the job's loggers; the server logs are `bench-<mode>-<backend>.log` in the
run directory.

    python scripts/run.py stage=bench server=vllm server.python=.vllm-venv/bin/python
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import math
import re
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput
from eagle3.errors import Eagle3Error
from eagle3.stages.base import MissingInput, StageContext, UnitStage, require

log = logging.getLogger("eagle3")

FORMAT_VERSION = 1
REPORT_FILES = {"json": "bench_report.json", "md": "bench_report.md", "png": "bench.png"}
MODES = ("baseline", "speculative")
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_SPEC_COUNTERS = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED)
ACCEPT_LENGTH_DEFINITION = ("tokens committed per target forward under speculation, the prefill's token "
                            "excluded (as stage=eval counts it)")
LIKELY_CAUSES = (
    "the server runs the draft with the EAGLE algorithm although it is an EAGLE-3 draft (the fc fusion "
    "layer is bypassed; use EAGLE3 / vLLM method eagle3)",
    "wrong aux layer ids in the draft's config.json (SGLang adds 1 to eagle_aux_hidden_state_layer_ids, "
    "vLLM uses them as written; each export is numbered for its engine)",
    "the draft was trained for another target (other weights, tokenizer or chat template)",
    "the draft is not trained (too few steps, or a fresh checkpoint)",
)


class BenchmarkFailed(Eagle3Error):
    """A benchmark whose result must not be read as a number (reports are written first)."""


# ---------------------------------------------------------------------------------------------
# Engine counters


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: `(name, labels, value)`; comments skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_RE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL_RE.findall(match.group(3) or ""))
        samples.append((match.group(1), labels, value))
    return samples


def vllm_spec_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from `/metrics`, summed over engines and models.

    Returns:
        `{"drafts", "draft_tokens", "accepted"}` (None where the server does not expose the
        counter, e.g. no speculation configured) and `"accepted_per_pos"`: position -> count.
    """
    totals: dict[str, Optional[float]] = {name: None for name in VLLM_SPEC_COUNTERS}
    per_pos: dict[int, float] = {}
    for name, labels, value in parse_prometheus(text):
        if name in totals:
            totals[name] = (totals[name] or 0.0) + value
        elif name == VLLM_ACCEPTED_PER_POS and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    return {"drafts": totals[VLLM_DRAFTS], "draft_tokens": totals[VLLM_DRAFT_TOKENS],
            "accepted": totals[VLLM_ACCEPTED], "accepted_per_pos": dict(sorted(per_pos.items()))}


def vllm_accept_length(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Accept length from two `vllm_spec_counters` snapshots around the measured requests.

    `accept_length = 1 + accepted / drafts`: every draft round is one verify forward of the
    target, committing the accepted draft tokens plus one token of its own. None when the
    counters are missing or no draft round happened.
    """
    def delta(key: str) -> Optional[float]:
        if after.get(key) is None:
            return None
        return float(after[key]) - float(before.get(key) or 0.0)

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted")
    result: dict[str, Any] = {"source": "vllm /metrics", "drafts": drafts, "draft_tokens": draft_tokens,
                              "accepted": accepted, "accept_length": None, "acceptance_rate": None,
                              "acceptance_per_position": []}
    if drafts is None or accepted is None or drafts <= 0:
        return result
    result["accept_length"] = 1.0 + accepted / drafts
    if draft_tokens:
        result["acceptance_rate"] = accepted / draft_tokens
    pos_before = before.get("accepted_per_pos") or {}
    per_pos = after.get("accepted_per_pos") or {}
    # Fraction of draft rounds whose position-p draft was accepted (p = 0 first).
    result["acceptance_per_position"] = [(float(v) - float(pos_before.get(p, 0.0))) / drafts
                                         for p, v in sorted(per_pos.items())]
    return result


def sglang_accept_length_from_meta(meta_infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accept length from SGLang's per-request `meta_info` (native `/generate` responses).

    `sum(completion_tokens - 1) / sum(spec_verify_ct)` over the requests that had a verify
    step: the prefill's token is not committed by a verify forward. None without any.
    """
    tokens = verifies = requests = 0
    for meta in meta_infos:
        verify = meta.get("spec_verify_ct")
        completion = meta.get("completion_tokens")
        if verify is None or completion is None or int(verify) <= 0:
            continue
        tokens += int(completion) - 1
        verifies += int(verify)
        requests += 1
    return {"source": "sglang meta_info", "requests": requests, "verify_forwards": verifies,
            "committed_tokens": tokens, "accept_length": (tokens / verifies) if verifies else None}


def sglang_accept_length_from_server_info(info: Mapping[str, Any]) -> Optional[float]:
    """`/get_server_info` `internal_states[i].avg_spec_accept_length`, averaged over the
    data-parallel ranks that report one; None when none does (speculation off)."""
    states = info.get("internal_states") or []
    if isinstance(states, Mapping):
        states = [states]
    values = [float(s["avg_spec_accept_length"]) for s in states
              if isinstance(s, Mapping) and s.get("avg_spec_accept_length") is not None]
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------------------------
# Client


def _opener(url: str):
    # Benchmarked servers are on loopback: never go through a proxy from the environment.
    from eagle3.serving.process import _is_loopback_url

    return urllib.request.build_opener(urllib.request.ProxyHandler({})) if _is_loopback_url(url) \
        else urllib.request.build_opener()


def _request(url: str, body: Optional[dict] = None, timeout: float = 600.0) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with _opener(url).open(req, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:300]
        raise BenchmarkFailed(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise BenchmarkFailed(f"{url}: {getattr(exc, 'reason', exc)}") from None


class EngineClient:
    """Greedy completions of token-id prompts and the engine's speculative counters."""

    def __init__(self, backend: str, url: str, timeout_s: float) -> None:
        self.backend, self.url, self.timeout_s = backend, url.rstrip("/"), float(timeout_s)
        self.model: Optional[str] = None
        if backend == "vllm":
            models = json.loads(_request(self.url + "/v1/models", timeout=30))
            self.model = models["data"][0]["id"]

    def complete(self, input_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        """`{"output_ids", "completion_tokens", "latency_s", "meta_info"?}` of one greedy request."""
        started = time.perf_counter()
        if self.backend == "vllm":
            body = {"model": self.model, "prompt": list(input_ids), "max_tokens": int(max_new_tokens),
                    "temperature": 0.0, "return_token_ids": True, "skip_special_tokens": False}
            data = json.loads(_request(self.url + "/v1/completions", body, self.timeout_s))
            choice = data["choices"][0]
            result = {"output_ids": choice.get("token_ids"),
                      "completion_tokens": int(data["usage"]["completion_tokens"])}
        else:
            body = {"input_ids": list(input_ids),
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": int(max_new_tokens)}}
            data = json.loads(_request(self.url + "/generate", body, self.timeout_s))
            if isinstance(data, list):
                data = data[0]
            meta = data.get("meta_info") or {}
            result = {"output_ids": data.get("output_ids"), "completion_tokens": int(meta["completion_tokens"]),
                      "meta_info": meta}
        result["latency_s"] = time.perf_counter() - started
        return result

    def counters(self) -> dict[str, Any]:
        """A snapshot of the engine's speculative counters (vLLM `/metrics`; SGLang server info)."""
        if self.backend == "vllm":
            return vllm_spec_counters(_request(self.url + "/metrics", timeout=30).decode("utf-8", "replace"))
        with contextlib.suppress(BenchmarkFailed, ValueError):
            info = json.loads(_request(self.url + "/get_server_info", timeout=30))
            return {"avg_spec_accept_length": sglang_accept_length_from_server_info(info)}
        return {}


def run_requests(client: EngineClient, prompts: Sequence[dict], max_new_tokens: int, concurrency: int,
                 warmup: int, repeats: int = 1) -> dict[str, Any]:
    """Warm up, then send all prompts `repeats` times; counters are read around the timed passes.

    The figure of a phase is the median pass (tok/s), so one pass disturbed by another job on
    shared cores does not decide it; every pass is kept in `passes`.
    """
    for prompt in list(prompts)[:warmup]:
        client.complete(prompt["input_ids"], max_new_tokens)
    before = client.counters()
    passes = []
    results: list[dict] = []
    for _ in range(max(int(repeats), 1)):
        started = time.perf_counter()
        if concurrency > 1:
            with ThreadPoolExecutor(concurrency, thread_name_prefix="bench") as pool:
                results = list(pool.map(lambda p: client.complete(p["input_ids"], max_new_tokens), prompts))
        else:
            results = [client.complete(p["input_ids"], max_new_tokens) for p in prompts]
        wall = time.perf_counter() - started
        tokens = sum(r["completion_tokens"] for r in results)
        passes.append({"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
                       "latency_s": [r["latency_s"] for r in results]})
    after = client.counters()
    median = sorted(passes, key=lambda p: p["tokens_per_s"] or 0.0)[(len(passes) - 1) // 2]
    return {"url": client.url, "requests": len(results), "output_tokens": median["output_tokens"],
            "wall_s": median["wall_s"], "tokens_per_s": median["tokens_per_s"],
            "mean_latency_s": sum(median["latency_s"]) / max(len(results), 1), "passes": passes,
            "completion_tokens": [r["completion_tokens"] for r in results],
            "counters_before": before, "counters_after": after, "results": results}


def accept_length_of(backend: str, phase: Mapping[str, Any]) -> dict[str, Any]:
    """The engine-reported accept length of a measured speculative phase."""
    if backend == "vllm":
        return vllm_accept_length(phase["counters_before"], phase["counters_after"])
    found = sglang_accept_length_from_meta([r.get("meta_info") or {} for r in phase["results"]])
    if found["accept_length"] is None:
        found = {"source": "sglang /get_server_info",
                 "accept_length": phase["counters_after"].get("avg_spec_accept_length")}
    return found


# ---------------------------------------------------------------------------------------------
# Stage


def _units(cfg: DictConfig) -> list[str]:
    return [cfg.dataset.name]


def _connect_mode(cfg: DictConfig) -> bool:
    return bool(cfg.server.urls)


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    server = OmegaConf.to_container(cfg.server, resolve=True)
    # Where and how long, not what is measured: a bench on another port is the same bench.
    for key in ("python", "host", "port", "startup_timeout_s"):
        server.pop(key, None)
    if not _connect_mode(cfg):
        server.pop("urls", None)
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    bench.pop("request_timeout_s", None)
    if not _connect_mode(cfg):
        bench.pop("baseline_urls", None)
    return {"bench": bench, "server": server, "model": {"path": str(cfg.model.path), "revision": cfg.model.revision},
            "format": FORMAT_VERSION}


def _chain(cfg: DictConfig, ctx: StageContext, unit: str) -> DictConfig:
    """The config under which this bench's chain (merge, train, eval) is found (`eagle3.stages.chain`)."""
    from eagle3.stages.chain import chain_config
    from eagle3.stages.merge import MERGE

    return chain_config(cfg, ctx, MERGE, unit, cfg.bench.data_backend, key="bench.data_backend")


def _require(stage: UnitStage, cfg: DictConfig, ctx: StageContext, unit: str) -> Manifest:
    return require(stage, _chain(cfg, ctx, unit), ctx, unit)


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    from eagle3.stages.merge import MERGE
    from eagle3.stages.train import TRAIN

    inputs = {"merged": _require(MERGE, cfg, ctx, unit)}
    if not _connect_mode(cfg) and cfg.server.speculative.draft_path is None:
        inputs["train"] = _require(TRAIN, cfg, ctx, unit)
    return inputs


def resolve_bench_draft(cfg: DictConfig, ctx: StageContext, unit: str) -> Optional[Path]:
    """`server.speculative.draft_path`, else this chain's export for the benchmarked engine."""
    from eagle3.stages.train import EXPORT_DIR

    spec = cfg.server.speculative
    if spec.draft_path is not None:
        return Path(str(spec.draft_path)).expanduser()
    if _connect_mode(cfg):
        return None  # someone else's server: whatever it serves
    return Path(_unit_inputs(cfg, ctx, unit)["train"].dir) / EXPORT_DIR / str(cfg.server.backend)


def _mode_config(cfg: DictConfig, mode: str) -> DictConfig:
    """The config of one benchmarked server: `baseline` = the target alone."""
    mode_cfg = copy.deepcopy(cfg)
    if mode == "baseline":
        OmegaConf.update(mode_cfg, "server.speculative.algorithm", None, merge=False)
    return mode_cfg


@contextlib.contextmanager
def _server(cfg: DictConfig, ctx: StageContext, mode: str, draft: Optional[Path]) -> Iterator[dict[str, Any]]:
    """`{"url", "command"}` of the server for `mode`, launched (and stopped) unless connecting."""
    from eagle3.serving import ServerProcess, build_command, check_health

    server = cfg.server
    if _connect_mode(cfg):
        urls = list(cfg.bench.baseline_urls) if mode == "baseline" else list(server.urls)
        healthy = check_health(urls, str(server.backend), timeout_s=30.0)
        yield {"url": healthy[0], "command": None, "launched": False}
        return
    command = build_command(_mode_config(cfg, mode), draft if mode == "speculative" else None)
    log_path = ctx.run_dir / f"bench-{mode}-{command.backend}.log"
    log.info("bench: starting the %s server: %s (log %s)", mode, command.shell(), log_path)
    started = time.perf_counter()
    with ServerProcess(command, log_path, startup_timeout_s=float(server.startup_timeout_s)) as proc:
        log.info("bench: %s server ready at %s after %.0f s", mode, proc.url, time.perf_counter() - started)
        yield {"url": proc.url, "command": command.shell(), "launched": True,
               "startup_s": time.perf_counter() - started, "log": str(log_path)}


def _eval_figure(cfg: DictConfig, ctx: StageContext, unit: str, k: int) -> Optional[dict[str, Any]]:
    """The in-process eval's accept length at K drafted tokens, when its output is complete."""
    from eagle3.stages.eval import EVAL

    try:
        where, manifest = EVAL.locate(_chain(cfg, ctx, unit), ctx, unit)
    except MissingInput:
        return None
    report_path = where / "eval_report.json"
    if manifest is None or not report_path.is_file():
        return None
    real = json.loads(report_path.read_text()).get("real") or {}
    row = real.get(str(k))
    if not row or row.get("accept_length") is None:
        return {"dir": str(where), "accept_length": None, "k": k, "ks": sorted(real, key=int)}
    return {"dir": str(where), "k": k, "accept_length": float(row["accept_length"]),
            "num_prompts": row.get("num_prompts"), "max_new_tokens": row.get("max_new_tokens")}


def _outputs_match(base: Mapping[str, Any], spec: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    pairs = [(b.get("output_ids"), s.get("output_ids")) for b, s in zip(base["results"], spec["results"])]
    if not pairs or any(b is None or s is None for b, s in pairs):
        return None
    same = sum(1 for b, s in pairs if list(b) == list(s))
    return {"identical": same, "of": len(pairs)}


def _summary(phase: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in phase.items() if k != "results"}


def run_benchmark(cfg: DictConfig, ctx: StageContext, unit: str, prompts: Sequence[dict],
                  draft: Optional[Path]) -> dict[str, Any]:
    """Measure both modes and assemble the report (nothing written, nothing raised on a bad figure)."""
    bench, server = cfg.bench, cfg.server
    backend = str(server.backend)
    k = int(server.speculative.num_steps)
    modes = MODES if bool(bench.baseline) else ("speculative",)
    report: dict[str, Any] = {
        "dataset": unit, "backend": backend, "algorithm": server.speculative.algorithm, "k": k,
        "draft": None if draft is None else str(draft), "connect_mode": _connect_mode(cfg),
        "num_prompts": len(prompts), "max_new_tokens": int(bench.max_new_tokens),
        "concurrency": int(bench.concurrency), "warmup_requests": int(bench.warmup_requests),
        "repeats": int(bench.repeats),
        "prompt_ids": [p["id"] for p in prompts], "accept_length_definition": ACCEPT_LENGTH_DEFINITION,
        "servers": {}, "phases": {},
    }
    raw: dict[str, dict] = {}
    for mode in modes:
        with _server(cfg, ctx, mode, draft) as info:
            client = EngineClient(backend, info["url"], float(bench.request_timeout_s))
            phase = run_requests(client, prompts, int(bench.max_new_tokens), int(bench.concurrency),
                                 int(bench.warmup_requests), int(bench.repeats))
        raw[mode] = phase
        report["servers"][mode] = info
        report["phases"][mode] = _summary(phase)
        log.info("bench: %s: %d output tokens in %.1f s = %.1f tok/s (median of %s)", mode, phase["output_tokens"],
                 phase["wall_s"], phase["tokens_per_s"] or 0.0,
                 ", ".join(f"{p['tokens_per_s']:.1f}" for p in phase["passes"]))
    spec = raw["speculative"]
    report["accept"] = accept_length_of(backend, spec)
    accept = report["accept"]["accept_length"]
    base = raw.get("baseline")
    report["baseline_tokens_per_s"] = base["tokens_per_s"] if base else None
    report["speculative_tokens_per_s"] = spec["tokens_per_s"]
    report["speedup"] = (spec["tokens_per_s"] / base["tokens_per_s"]
                         if base and base["tokens_per_s"] and spec["tokens_per_s"] else None)
    report["outputs_match"] = _outputs_match(base, spec) if base else None
    ev = _eval_figure(cfg, ctx, unit, k)
    report["eval"] = ev
    if ev and ev.get("accept_length") and accept is not None:
        ev["relative_difference"] = (accept - ev["accept_length"]) / ev["accept_length"]
    threshold = float(bench.min_accept_length)
    if accept is None or accept <= threshold:
        report["status"] = "FAILED"
        shown = "no speculative counters" if accept is None else f"accept length {accept:.3f}"
        report["failure"] = (f"{shown} under speculation (<= {threshold:g} means the draft is effectively "
                             f"unused); not a benchmark result")
        report["likely_causes"] = list(LIKELY_CAUSES)
    else:
        report["status"] = "ok"
    return report


# ---------------------------------------------------------------------------------------------
# Report files


def _fmt(x: Any, digits: int = 2, suffix: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return ("nan" if math.isnan(x) else f"{x:.{digits}f}") + suffix
    return f"{x}{suffix}"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The benchmark for a human: status, tok/s, speedup, accept length vs the in-process eval."""
    backend, k = report.get("backend"), report.get("k")
    lines = [f"# Serving benchmark: {backend}, {report.get('algorithm')} K={k}", ""]
    lines += [f"{report.get('num_prompts')} held-out prompts (first assistant turns of the eval split), greedy, "
              f"up to {report.get('max_new_tokens')} new tokens each, concurrency {report.get('concurrency')}, "
              f"{report.get('warmup_requests')} warm-up request(s) not timed; the median of "
              f"{report.get('repeats', 1)} timed pass(es) over all prompts.", ""]
    if report.get("status") == "FAILED":
        lines += [f"**FAILED**: {report.get('failure')}.", "", "Likely causes:"]
        lines += [f"- {cause}" for cause in report.get("likely_causes", [])]
        lines.append("")
    phases = report.get("phases", {})
    accept = (report.get("accept") or {}).get("accept_length")
    failed = report.get("status") == "FAILED"
    lines += ["| server | output tokens | wall s | tok/s | tok/s of each pass | accept length |",
              "|---|---|---|---|---|---|"]
    for mode in MODES:
        phase = phases.get(mode)
        if phase is None:
            continue
        acc = "–" if mode == "baseline" else ("FAILED" if failed else _fmt(accept, 3))
        name = "target alone" if mode == "baseline" else f"target + draft ({report.get('algorithm')})"
        each = ", ".join(_fmt(p.get("tokens_per_s"), 1) for p in phase.get("passes", []))
        lines.append(f"| {name} | {phase['output_tokens']} | {_fmt(phase['wall_s'], 1)} | "
                     f"{_fmt(phase['tokens_per_s'], 1)} | {each} | {acc} |")
    lines.append("")
    if not failed:
        lines.append(f"Speedup: **{_fmt(report.get('speedup'), 2, 'x')}** (output tokens/s with the draft / without).")
    source = (report.get("accept") or {}).get("source")
    lines.append(f"Accept length = {report.get('accept_length_definition')}; read from {source}.")
    ev = report.get("eval")
    if ev and ev.get("accept_length") is not None:
        rel = ev.get("relative_difference")
        lines.append(f"In-process eval at K={ev['k']}: accept length {_fmt(ev['accept_length'], 3)}"
                     + (f"; the server's differs by {_fmt(100 * rel, 1, '%')}" if rel is not None and not failed else "")
                     + f" ({ev['dir']}).")
    elif ev:
        lines.append(f"In-process eval has no K={ev['k']} (it ran K={ev.get('ks')}).")
    else:
        lines.append("No complete in-process eval output for this config (stage=eval) to compare with.")
    match = report.get("outputs_match")
    if match:
        lines.append(f"Greedy outputs identical with and without the draft: {match['identical']}/{match['of']} "
                     "prompts (reduced-precision kernels may differ in near-ties).")
    lines.append("")
    for mode, info in (report.get("servers") or {}).items():
        if info and info.get("command"):
            lines += [f"{mode} server:", "", "```", info["command"], "```", ""]
    return "\n".join(lines) + "\n"


def _plot(report: Mapping[str, Any]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg canvas: no pyplot, no display
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    phases = report.get("phases", {})
    names = [m for m in MODES if m in phases]
    values = [float(phases[m]["tokens_per_s"] or 0.0) for m in names]
    bars = ax1.bar(["target alone" if m == "baseline" else "+ draft" for m in names], values,
                   color=["#888888", "#1f77b4"][:len(names)])
    for bar, value in zip(bars, values):
        ax1.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
    ax1.set_ylabel("output tokens/s")
    speedup = report.get("speedup")
    ax1.set_title(f"{report.get('backend')}: speedup {speedup:.2f}x" if speedup and report.get("status") == "ok"
                  else f"{report.get('backend')}")
    accept = (report.get("accept") or {}).get("accept_length")
    labels, accepts = [], []
    if accept is not None:
        labels.append(f"{report.get('backend')} counters")
        accepts.append(float(accept))
    ev = report.get("eval") or {}
    if ev.get("accept_length") is not None:
        labels.append("in-process eval")
        accepts.append(float(ev["accept_length"]))
    if accepts:
        bars = ax2.bar(labels, accepts, color=["#1f77b4", "#2ca02c"][:len(accepts)])
        for bar, value in zip(bars, accepts):
            ax2.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_ylabel("accept length (tokens / target forward)")
    ax2.set_title(f"K={report.get('k')}" + (" FAILED" if report.get("status") == "FAILED" else ""))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_bench_report(report: dict, out_dir) -> dict[str, Path]:
    """`bench_report.json`, `bench_report.md`, `bench.png` in `out_dir` (atomic writes)."""
    from eagle3.draft.report import write_report_files

    return write_report_files(out_dir, REPORT_FILES, report, render_markdown(report), _plot(report))


def _log_report(cfg: DictConfig, ctx: StageContext, report: Mapping[str, Any], files: Mapping[str, Path]) -> None:
    from eagle3.tracking import job_loggers

    ok = report.get("status") == "ok"
    flat: dict[str, float] = {"bench/failed": 0.0 if ok else 1.0}
    for key, name in (("baseline_tokens_per_s", "baseline_tok_s"), ("speculative_tokens_per_s", "spec_tok_s")):
        if report.get(key) is not None:
            flat[f"bench/{name}"] = float(report[key])
    if ok:
        if report.get("speedup") is not None:
            flat["bench/speedup"] = float(report["speedup"])
        flat["bench/accept_length"] = float(report["accept"]["accept_length"])
        ev = report.get("eval") or {}
        if ev.get("accept_length") is not None:
            flat["bench/eval_accept_length"] = float(ev["accept_length"])
        if ev.get("relative_difference") is not None:
            flat["bench/accept_length_rel_diff"] = float(ev["relative_difference"])
    for logger in job_loggers(cfg, ctx.run_dir):
        logger.log_metrics(flat)
        if type(logger).__name__ == "WandbLogger":
            logger.log_image(key="bench/throughput", images=[str(files["png"])])
            logger.experiment.summary.update({k.replace("/", "_"): v for k, v in flat.items()})


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    from eagle3.stages.eval import heldout_prompts
    from eagle3.stages.merge import EVAL_FILE

    inputs = _unit_inputs(cfg, ctx, unit)
    prompts = heldout_prompts(Path(inputs["merged"].dir) / EVAL_FILE, int(cfg.bench.num_prompts))
    if not prompts:
        raise BenchmarkFailed(f"bench: the eval split of {inputs['merged'].dir} has no prompt to send "
                              "(data.eval_size=0?)")
    out.count_in(len(prompts))
    draft = resolve_bench_draft(cfg, ctx, unit)
    report = run_benchmark(cfg, ctx, unit, prompts, draft)
    files = write_bench_report(report, out.dir)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    for path in files.values():
        shutil.copy2(path, ctx.run_dir / Path(path).name)
    _log_report(cfg, ctx, report, files)
    if report["status"] != "ok":
        causes = "; ".join(f"({i}) {c}" for i, c in enumerate(report["likely_causes"], 1))
        raise BenchmarkFailed(f"bench FAILED: {report['failure']}. Likely causes: {causes}. "
                              f"Report: {ctx.run_dir / REPORT_FILES['md']}")
    out.count_out(len(prompts))
    ev = report.get("eval") or {}
    line = (f"bench: {report['backend']} K={report['k']}: baseline {_fmt(report['baseline_tokens_per_s'], 1)} tok/s, "
            f"{report['algorithm']} {_fmt(report['speculative_tokens_per_s'], 1)} tok/s, speedup "
            f"{_fmt(report['speedup'], 2, 'x')}, accept length {report['accept']['accept_length']:.3f} "
            f"({report['accept']['source']})")
    if ev.get("accept_length") is not None:
        line += f"; in-process eval {ev['accept_length']:.3f} ({100 * ev['relative_difference']:+.1f}%)"
    print(line, flush=True)
    summary = {key: report.get(key) for key in ("baseline_tokens_per_s", "speculative_tokens_per_s", "speedup")}
    summary["accept_length"] = report["accept"]["accept_length"]
    summary["eval_accept_length"] = ev.get("accept_length")
    return {"summary": summary, "files": {name: Path(p).name for name, p in files.items()}}


BENCH = UnitStage(
    name="bench",
    help="serve the target without and with the draft: output tokens/s, speedup, engine-reported accept length",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
