"""A benchmark client of a served engine: greedy completions of token-id prompts and its counters.

Token ids in, token ids out (vLLM `/v1/completions` with `return_token_ids`; SGLang's native
`/generate`), so the baseline and the speculative server decode exactly the same prompts and
their outputs can be compared token for token. HTTP through `eagle3.serving.http`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from eagle3.engines import VLLM
from eagle3.serving.engine_metrics import (
    sglang_accept_length_from_meta,
    sglang_accept_length_from_server_info,
    vllm_accept_length,
    vllm_spec_counters,
)
from eagle3.serving.http import Client, HTTPFailure, served_model

__all__ = ["EngineClient", "accept_length_of", "run_requests"]

_INFO_TIMEOUT_S = 30.0


class EngineClient:
    """One engine at `url`, spoken to through a shared `Client` (build with `connect`)."""

    def __init__(self, http: Client, backend: str, url: str, timeout_s: float, model: Optional[str]) -> None:
        self.http, self.backend, self.url = http, backend, url.rstrip("/")
        self.timeout_s, self.model = float(timeout_s), model

    @classmethod
    async def connect(cls, http: Client, backend: str, url: str, timeout_s: float) -> EngineClient:
        """The client; for vLLM the served model's name is looked up first (requests must name it).

        Raises:
            HTTPFailure: The server does not answer, or vLLM lists no model.
        """
        model = None
        if backend == VLLM:
            model = await served_model(http, url, timeout=_INFO_TIMEOUT_S)
            if model is None:
                raise HTTPFailure(url, "/v1/models lists no model to send requests to")
        return cls(http, backend, url, timeout_s, model)

    async def complete(self, input_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        """`{"output_ids", "completion_tokens", "latency_s", "meta_info"?}` of one greedy request."""
        started = time.perf_counter()
        if self.backend == VLLM:
            body: dict[str, Any] = {"model": self.model, "prompt": list(input_ids), "max_tokens": int(max_new_tokens),
                                    "temperature": 0.0, "return_token_ids": True, "skip_special_tokens": False}
            data = await self.http.get_json("POST", self.url + "/v1/completions", json_body=body,
                                            timeout=self.timeout_s)
            choice = data["choices"][0]
            result = {"output_ids": choice.get("token_ids"),
                      "completion_tokens": int(data["usage"]["completion_tokens"])}
        else:
            body = {"input_ids": list(input_ids),
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": int(max_new_tokens)}}
            data = await self.http.get_json("POST", self.url + "/generate", json_body=body, timeout=self.timeout_s)
            if isinstance(data, list):
                data = data[0]
            meta = data.get("meta_info") or {}
            result = {"output_ids": data.get("output_ids"), "completion_tokens": int(meta["completion_tokens"]),
                      "meta_info": meta}
        result["latency_s"] = time.perf_counter() - started
        return result

    async def counters(self) -> dict[str, Any]:
        """A snapshot of the engine's speculative counters (vLLM `/metrics`; SGLang server info)."""
        if self.backend == VLLM:
            reply = await self.http.answer("GET", self.url + "/metrics", timeout=_INFO_TIMEOUT_S)
            return vllm_spec_counters(reply.raise_for_status(self.url + "/metrics").text())
        try:
            info = await self.http.get_json("GET", self.url + "/get_server_info", timeout=_INFO_TIMEOUT_S)
        except HTTPFailure:
            return {}  # older SGLang: the per-request meta_info carries the counts
        return {"avg_spec_accept_length": sglang_accept_length_from_server_info(info)}


async def run_requests(client: EngineClient, prompts: Sequence[dict], max_new_tokens: int, concurrency: int,
                       warmup: int, repeats: int = 1) -> dict[str, Any]:
    """Warm up, then send all prompts `repeats` times; counters are read around the timed passes.

    At most `concurrency` requests are in flight; results keep the prompts' order. The figure
    of a phase is the median pass (tok/s), so one pass disturbed by another job on shared cores
    does not decide it; every pass is kept in `passes`.
    """
    for prompt in list(prompts)[:warmup]:
        await client.complete(prompt["input_ids"], max_new_tokens)
    slots = asyncio.Semaphore(max(int(concurrency), 1))

    async def one(prompt: Mapping[str, Any]) -> dict[str, Any]:
        async with slots:
            return await client.complete(prompt["input_ids"], max_new_tokens)

    before = await client.counters()
    passes = []
    results: list[dict] = []
    for _ in range(max(int(repeats), 1)):
        started = time.perf_counter()
        results = list(await asyncio.gather(*(one(p) for p in prompts)))
        wall = time.perf_counter() - started
        tokens = sum(r["completion_tokens"] for r in results)
        passes.append({"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
                       "latency_s": [r["latency_s"] for r in results]})
    after = await client.counters()
    median = sorted(passes, key=lambda p: p["tokens_per_s"] or 0.0)[(len(passes) - 1) // 2]
    return {"url": client.url, "requests": len(results), "output_tokens": median["output_tokens"],
            "wall_s": median["wall_s"], "tokens_per_s": median["tokens_per_s"],
            "mean_latency_s": sum(median["latency_s"]) / max(len(results), 1), "passes": passes,
            "completion_tokens": [r["completion_tokens"] for r in results],
            "counters_before": before, "counters_after": after, "results": results}


def accept_length_of(backend: str, phase: Mapping[str, Any]) -> dict[str, Any]:
    """The engine-reported accept length of a measured speculative phase."""
    if backend == VLLM:
        return vllm_accept_length(phase["counters_before"], phase["counters_after"])
    found = sglang_accept_length_from_meta([r.get("meta_info") or {} for r in phase["results"]])
    if found["accept_length"] is None:
        found = {"source": "sglang /get_server_info",
                 "accept_length": phase["counters_after"].get("avg_spec_accept_length")}
    return found
