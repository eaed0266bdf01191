"""The served target without and with its EAGLE-3 draft: output tok/s, speedup, engine accept length.

`run_benchmark` measures both modes on the same held-out prompts (greedy, the median of
`repeats` timed passes each) and assembles the report as plain data; the caller says how a mode's
server is had (launched with the project's launcher, or a running one) and writes the report.
An accept length at or below `min_accept_length` under speculation means the draft is not used
at all: the report's status is FAILED with the likely causes, never a number to read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Optional

from eagle3.errors import Eagle3Error
from eagle3.serving.engine_client import EngineClient, accept_length_of, run_requests
from eagle3.serving.engine_metrics import ACCEPT_LENGTH_DEFINITION
from eagle3.serving.http import Client, HTTPFailure

if TYPE_CHECKING:
    from eagle3.config.server_schema import BenchConfig

__all__ = ["BASELINE", "LIKELY_CAUSES", "MODES", "SPECULATIVE", "BenchmarkFailed",
           "failure_message", "outputs_match", "run_benchmark"]

log = logging.getLogger("eagle3")

BASELINE, SPECULATIVE = "baseline", "speculative"
MODES = (BASELINE, SPECULATIVE)
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


async def _measure(backend: str, url: str, prompts: Sequence[dict], s: BenchConfig) -> dict[str, Any]:
    async with Client(limit=max(s.concurrency, 1) + 2) as http:
        client = await EngineClient.connect(http, backend, url, s.request_timeout_s)
        return await run_requests(client, prompts, s.max_new_tokens, s.concurrency, s.warmup_requests, s.repeats)


def _output_ids(phase: Mapping[str, Any]) -> Optional[list[list[int]]]:
    """The greedy tokens of each prompt (the last timed pass), or None when the engine did not return them."""
    ids = [r.get("output_ids") for r in phase["results"]]
    return None if any(i is None for i in ids) else [list(i) for i in ids]


def outputs_match(base: Optional[Sequence[Sequence[int]]],
                  spec: Optional[Sequence[Sequence[int]]]) -> Optional[dict[str, Any]]:
    """`{"identical", "of"}` prompts whose greedy tokens agree; None when there is nothing to compare
    (no tokens, or not the same prompts: the report says so, it does not raise)."""
    if not base or not spec or len(base) != len(spec):
        return None
    return {"identical": sum(1 for b, s in zip(base, spec, strict=True) if list(b) == list(s)), "of": len(base)}


def run_benchmark(backend: str, prompts: Sequence[dict], settings: BenchConfig,
                  server: Callable[[str], AbstractContextManager[dict[str, Any]]], header: Mapping[str, Any],
                  eval_figure: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Measure both modes and assemble the report (nothing written, nothing raised on a bad figure).

    Args:
        backend: `sglang` or `vllm` (how to ask and which counters to read).
        prompts: `{"id", "input_ids"}` of the held-out prompts.
        settings: `bench.*`.
        server: `server(mode)` -> a context manager yielding `{"url", ...}` of that mode's server
            (launched for the block, or a running one); the yielded dict goes into the report.
        header: What the report says about the setup (dataset, K, algorithm, draft, ...).
        eval_figure: The in-process eval's accept length at the same K, to compare with.

    Raises:
        BenchmarkFailed: A server did not answer (the message names the URL).
    """
    modes = MODES if settings.baseline else (SPECULATIVE,)
    report: dict[str, Any] = {
        **header, "backend": backend, "num_prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
        "concurrency": settings.concurrency, "warmup_requests": settings.warmup_requests,
        "repeats": settings.repeats, "prompt_ids": [p["id"] for p in prompts],
        "accept_length_definition": ACCEPT_LENGTH_DEFINITION, "servers": {}, "phases": {},
    }
    raw: dict[str, dict] = {}
    for mode in modes:
        with server(mode) as info:
            try:
                phase = asyncio.run(_measure(backend, info["url"], prompts, settings))
            except HTTPFailure as exc:
                raise BenchmarkFailed(f"bench ({mode} server): {exc}") from None
        raw[mode] = phase
        report["servers"][mode] = info
        report["phases"][mode] = {k: v for k, v in phase.items() if k != "results"}
        log.info("bench: %s: %d output tokens in %.1f s = %.1f tok/s (median of %s)", mode, phase["output_tokens"],
                 phase["wall_s"], phase["tokens_per_s"] or 0.0,
                 ", ".join(f"{p['tokens_per_s']:.1f}" for p in phase["passes"]))
    spec, base = raw[SPECULATIVE], raw.get(BASELINE)
    report["accept"] = accept_length_of(backend, spec)
    accept = report["accept"]["accept_length"]
    report["baseline_tokens_per_s"] = base["tokens_per_s"] if base else None
    report["speculative_tokens_per_s"] = spec["tokens_per_s"]
    report["speedup"] = (spec["tokens_per_s"] / base["tokens_per_s"]
                         if base and base["tokens_per_s"] and spec["tokens_per_s"] else None)
    # Each mode's greedy tokens per prompt (in `prompt_ids` order): what `outputs_match` compares, and
    # what a bench with `bench.baseline=false` compares against an earlier baseline of the same prompts.
    report["output_ids"] = {mode: _output_ids(phase) for mode, phase in raw.items()}
    report["outputs_match"] = outputs_match(report["output_ids"].get(BASELINE), report["output_ids"][SPECULATIVE])
    report["eval"] = eval_figure
    if eval_figure and eval_figure.get("accept_length") and accept is not None:
        eval_figure["relative_difference"] = (accept - eval_figure["accept_length"]) / eval_figure["accept_length"]
    threshold = settings.min_accept_length
    if accept is None or accept <= threshold:
        report["status"] = "FAILED"
        shown = "no speculative counters" if accept is None else f"accept length {accept:.3f}"
        report["failure"] = (f"{shown} under speculation (<= {threshold:g} means the draft is effectively "
                             f"unused); not a benchmark result")
        report["likely_causes"] = list(LIKELY_CAUSES)
    else:
        report["status"] = "ok"
    return report


def failure_message(report: Mapping[str, Any], report_file: Any) -> str:
    """The one-line error of a FAILED report: what was measured, the likely causes, where the report is."""
    causes = "; ".join(f"({i}) {c}" for i, c in enumerate(report["likely_causes"], 1))
    return f"bench FAILED: {report['failure']}. Likely causes: {causes}. Report: {report_file}"
