"""The `vllm` / `sglang` generation backend: an async client of OpenAI-compatible servers.

One `HTTPBackend` talks to one or many endpoints (`generate.server.urls`, or the URLs a launcher
passes to `make_backend`) and behaves like any other GenerationBackend: `generate` takes a
batch of requests and returns results in request order. Underneath, every request is its own
asyncio task on one event loop (a daemon thread owned by the backend), so several stage threads
can call `generate` at once and the requests of all their batches share the endpoints:

* **Partitions.** A request's prompt tokens are estimated from characters and the request
  waits for a slot of the first partition it fits (`generate.http.partitions`: short prompts at a
  high concurrency, long ones at a low one): long prompts hold more KV cache.
* **Endpoints.** Each attempt goes to the least busy endpoint (fewest requests in flight, ties
  in turn) or round-robin; a retry avoids the endpoint that just failed when there is another,
  and an endpoint that refused connections rests for a moment.
* **Retries.** Timeouts (`request_timeout_s` per attempt), lost connections, HTTP 429/5xx and
  aborted or unreadable responses are retried up to `max_attempts` with exponential backoff and
  jitter (a `Retry-After` header is honoured up to the cap). A prompt the server says is too
  long comes back as `error="prompt_too_long"`; a request that still fails comes back as
  `error="request_failed"` with the last error in `error_detail`, and the stage leaves its
  conversation undone (not rejected) and goes on; the unit then ends unfinished, for a rerun.
  Only when `max_consecutive_failures` requests in a row failed for good (the endpoints are
  down, not one request bad) does `generate` raise BackendUnavailable, so a dead server stops
  the run instead of failing the rest of the data; a rerun resumes. A server that eagle3 itself
  launched (`eagle3.serving.exits.dead_server`) and that has exited stops it at the first failed
  request, with a line that names it: engine, exit code, pid, the error line of its log, the log.
* **Unusable answers.** A 200 reply that is not valid UTF-8, or whose finish reason is none of
  stop/length/tool_calls, comes back as `error="invalid_utf8"` / `"unknown_finish_reason"`: the
  server answered (it is not down), so this is not retried, and the stage rejects the
  conversation rather than train on replacement characters or a turn of unknown ending.

Determinism: a request's body is a pure function of the request and `SamplingParams` (the seed
derived per request from the batch seed and the request id), whichever endpoint, attempt or thread
sends it, and never of the other requests of its batch (the backend says `independent_requests`: a
rerun sends only the conversations still missing). Whether the server samples deterministically is
its business (vLLM and SGLang honour `seed`); resume never depends on it (it skips ids written).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Optional

from eagle3.config.client_schema import GenerateHTTPConfig, GeneratePartitionConfig
from eagle3.config.schema import Eagle3Config
from eagle3.generation.http_settings import ROUND_ROBIN, partition_name, sorted_partitions
from eagle3.generation.openai_chat import (
    BadResponse,
    build_body,
    chat_url,
    estimate_prompt_tokens,
    is_context_error,
    to_result,
)
from eagle3.generation.types import (
    ERROR_INVALID_UTF8,
    ERROR_PROMPT_TOO_LONG,
    ERROR_REQUEST_FAILED,
    BackendUnavailable,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from eagle3.serving.exits import dead_server
from eagle3.serving.http import (
    ERROR_TEXT_CHARS,
    RETRY_STATUS,
    BackgroundLoop,
    Client,
    HTTPFailure,
    backoff_delay,
    retry_after_seconds,
    served_model,
)

__all__ = ["HTTPBackend"]

log = logging.getLogger("eagle3")

# An endpoint that refused a connection is skipped this long (when another one is up).
ENDPOINT_REST_S = 2.0
_PROBE_TIMEOUT_S = 5.0
IN_FLIGHT = "while generate's requests were in flight"  # when a launched server that died did


class _Endpoint:
    def __init__(self, url: str) -> None:
        self.url = url
        self.chat_url = chat_url(url)
        self.inflight = 0
        self.requests = 0  # attempts sent
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self.rest_until = 0.0
        self.alive: Optional[bool] = None  # from the start-up probe

    def stats(self) -> dict[str, Any]:
        return {"attempts": self.requests, "ok": self.ok, "errors": dict(sorted(self.errors.items())),
                "alive_at_start": self.alive}


class _Failure(Exception):
    """One failed attempt: `kind` for counting, `retryable`, and a server's Retry-After."""

    def __init__(self, kind: str, detail: str, retryable: bool = True, retry_after: Optional[float] = None):
        super().__init__(detail)
        self.kind, self.detail, self.retryable, self.retry_after = kind, detail, retryable, retry_after


class HTTPBackend:
    """Generation through running OpenAI-compatible servers (vLLM, SGLang); thread-safe.

    Nothing connects until the first `generate`, so a resumed stage whose batches are all done
    never needs a server.
    """

    #: Each request is seeded on its own (`openai_chat.request_seed`): its answer does not depend on
    #: which other requests share its `generate` call.
    independent_requests = True

    def __init__(self, urls: Sequence[str], http: GenerateHTTPConfig, *, backend: str = "vllm",
                 fallback_model: str = "default",
                 token_counter: Optional[Callable[[GenerationRequest], int]] = None) -> None:
        """
        Args:
            urls: Base URLs of the endpoints.
            http: Partitions, retry policy and request knobs (`generate.http`).
            backend: `generate.backend` (vllm | sglang), for messages and the manifest.
            fallback_model: The model name sent when the server cannot say (no /v1/models): `model.path`.
            token_counter: Prompt-token estimate that picks the partition (a tokenizer-based count, say);
                default characters / `http.chars_per_token`.
        """
        self.urls = tuple(str(u) for u in urls)
        if not self.urls:
            raise BackendUnavailable(f"generate.backend={backend}: no endpoint URLs")
        self.http, self.name, self.fallback_model = http, backend, fallback_model
        self._count_tokens = token_counter or (lambda r: estimate_prompt_tokens(r, http.chars_per_token))
        self._partitions = sorted_partitions(http.partitions)
        self._endpoints = [_Endpoint(u) for u in self.urls]
        self._rr = 0
        self._rng = random.Random()  # jitter only; never feeds what is generated
        self._runner = BackgroundLoop(self.name)
        self._client: Optional[Client] = None
        self._semaphores: list[asyncio.Semaphore] = []  # one per partition, in `_partitions` order
        self._closed = False
        self._fatal: Optional[BackendUnavailable] = None
        self._tasks: set[asyncio.Task] = set()  # requests in flight, of every caller (loop thread only)
        self._consecutive_failures = 0
        self.model: Optional[str] = http.model
        self.counters: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.partition_requests: Counter[str] = Counter()
        self.inflight = 0
        self._started_at: Optional[float] = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: Eagle3Config, urls: Optional[Sequence[str]] = None) -> HTTPBackend:
        """The backend `generate.backend` at `urls` (None = `generate.server.urls`), with `generate.http`'s knobs.

        Raises:
            BackendUnavailable: No URL to talk to.
        """
        backend = str(cfg.generate.backend)
        urls = [str(u) for u in (urls if urls is not None else cfg.generate.server.urls)]
        if not urls:
            raise BackendUnavailable(
                f"generate.backend={backend}: no server to talk to; set generate.server.urls=[http://HOST:PORT,...] "
                f"to running {backend} servers (stage generate launches one itself when they are not set), "
                "or use generate.backend=hf (in-process transformers)")
        return cls(urls, cfg.generate.http, backend=backend, fallback_model=str(cfg.model.path))

    def describe(self) -> dict[str, Any]:
        """Backend, endpoints and served model, for the manifest."""
        return {"backend": self.name, "urls": list(self.urls), "model": self.model,
                "partitions": [{"max_context": p.max_context, "concurrency": self._capacity(p)}
                               for p in self._partitions],
                "endpoint_strategy": self.http.endpoint_strategy}

    def _capacity(self, partition: GeneratePartitionConfig) -> int:
        n = len(self._endpoints) if self.http.concurrency_per_endpoint else 1
        return partition.concurrency * n

    def suggested_inflight_batches(self, batch_size: int) -> int:
        """Batches the stage should keep going so the largest partition stays full (twice over)."""
        slots = max(self._capacity(p) for p in self._partitions)
        return max(2, math.ceil(2 * slots / max(batch_size, 1)))

    # ------------------------------------------------------------------ lifecycle
    def _ensure_started(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"{self.name} backend is closed")
        self._runner.start(self._start)

    async def _start(self) -> None:
        total = sum(self._capacity(p) for p in self._partitions)
        self._client = Client(limit=total + 8)
        self._semaphores = [asyncio.Semaphore(self._capacity(p)) for p in self._partitions]
        await self._probe(self._client)
        self._started_at = time.perf_counter()

    async def _probe(self, client: Client) -> None:
        """Wait (up to connect_wait_s) until an endpoint answers /v1/models; learn the model name."""
        deadline = time.monotonic() + self.http.connect_wait_s
        last: dict[str, str] = {}

        async def probe(ep: _Endpoint) -> Optional[str]:
            try:
                name = await served_model(client, ep.url, timeout=_PROBE_TIMEOUT_S)
            except HTTPFailure as exc:  # not answering, or 5xx: not serving yet
                last[ep.url] = str(exc)[:ERROR_TEXT_CHARS]
                ep.alive = False
                return None
            ep.alive = True  # a server without /v1/models (name None) still serves chat
            return name

        while True:
            names = await asyncio.gather(*(probe(ep) for ep in self._endpoints if not ep.alive))
            if any(ep.alive for ep in self._endpoints):
                break
            self._stop_if_dead(self.urls)
            if time.monotonic() >= deadline:
                raise BackendUnavailable(
                    f"generate.backend={self.name}: no endpoint answered within {self.http.connect_wait_s:g} s "
                    f"(generate.http.connect_wait_s): " + "; ".join(f"{u} -> {e}" for u, e in last.items()))
            await asyncio.sleep(1.0)
        for ep in self._endpoints:
            if not ep.alive:
                log.warning("%s endpoint %s does not answer (%s); requests go to the others",
                            self.name, ep.url, last.get(ep.url))
                ep.rest_until = time.monotonic() + ENDPOINT_REST_S
        if self.model is None:
            self.model = next((n for n in names if n), None) or self.fallback_model
        log.info("%s client: %d endpoint(s) (%d answering), model %r, partitions %s", self.name,
                 len(self._endpoints), sum(bool(ep.alive) for ep in self._endpoints), self.model,
                 ", ".join(f"{partition_name(p.max_context)}:{self._capacity(p)}" for p in self._partitions))

    def close(self) -> None:
        """Cancel requests in flight, close the connections and stop the loop (idempotent)."""
        self._closed = True
        self._runner.stop(self._close_client)

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.close()

    # ------------------------------------------------------------------ generation
    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Answer all requests concurrently (within the partitions' limits); results in request order.

        Raises:
            BackendUnavailable: The backend is closed, no endpoint answered at start, or
                `max_consecutive_failures` requests in a row failed for good.
        """
        if not requests:
            return []
        self._ensure_started()
        return self._runner.run(self._generate(list(requests), params))

    async def _generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        tasks = [asyncio.ensure_future(self._one(r, params)) for r in requests]
        self._tasks.update(tasks)
        try:
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            if self._fatal is not None and not self._closed:  # cut short by the stop, not by the caller
                raise self._fatal from None
            raise
        finally:
            for task in tasks:
                task.cancel()
            self._tasks.difference_update(tasks)

    def _partition_for(self, tokens: int) -> Optional[int]:  # the index of the first one it fits
        for i, part in enumerate(self._partitions):
            if part.max_context is None or tokens <= part.max_context:
                return i
        return None

    def _pick(self, avoid: Optional[_Endpoint]) -> _Endpoint:
        now = time.monotonic()
        up = [ep for ep in self._endpoints if ep.rest_until <= now] or self._endpoints
        if avoid is not None and len(up) > 1:
            up = [ep for ep in up if ep is not avoid] or up
        n = len(self._endpoints)
        if self.http.endpoint_strategy == ROUND_ROBIN:
            order = {id(ep): (self._endpoints.index(ep) - self._rr) % n for ep in up}
            chosen = min(up, key=lambda ep: order[id(ep)])
        else:  # least busy; ties go round the ring
            chosen = min(up, key=lambda ep: (ep.inflight, (self._endpoints.index(ep) - self._rr) % n))
        self._rr = (self._endpoints.index(chosen) + 1) % n
        return chosen

    async def _one(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        tokens = self._count_tokens(request)
        index = self._partition_for(tokens)
        if index is None:
            self.counters["prompt_too_long"] += 1
            return GenerationResult(id=request.id, error=ERROR_PROMPT_TOO_LONG, prompt_tokens=tokens,
                                    error_detail=f"~{tokens} prompt tokens exceed every partition's max_context")
        body = build_body(request, params, model=str(self.model), thinking_keys=self.http.thinking_keys,
                          chat_template_kwargs=self.http.chat_template_kwargs, extra_body=self.http.extra_body)
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.partition_requests[partition_name(self._partitions[index].max_context)] += 1
        async with self._semaphores[index]:
            return await self._attempts(request, payload, tokens)

    async def _attempts(self, request: GenerationRequest, payload: bytes, tokens: int) -> GenerationResult:
        settings = self.http
        endpoint: Optional[_Endpoint] = None
        failure: Optional[_Failure] = None
        for attempt in range(1, settings.max_attempts + 1):
            if self._fatal is not None:
                raise self._fatal
            if attempt > 1:
                self.counters["retries"] += 1
                assert failure is not None
                await asyncio.sleep(backoff_delay(attempt - 1, settings.backoff_s, settings.max_backoff_s,
                                                  self._rng, failure.retry_after))
            endpoint = self._pick(avoid=endpoint if failure is not None else None)
            try:
                result = await self._send(endpoint, request, payload)
            except _Failure as exc:
                failure = exc
                endpoint.errors[exc.kind] += 1
                self.errors[exc.kind] += 1
                self._stop_if_dead([endpoint.url])
                if exc.kind == "connect":  # refused: the server is not there (a lost connection is not that)
                    endpoint.rest_until = time.monotonic() + ENDPOINT_REST_S
                if exc.kind == ERROR_PROMPT_TOO_LONG:
                    self.counters["prompt_too_long"] += 1
                    return GenerationResult(id=request.id, error=ERROR_PROMPT_TOO_LONG, prompt_tokens=tokens,
                                            error_detail=exc.detail)
                if not exc.retryable:
                    break
                continue
            endpoint.ok += 1
            self._consecutive_failures = 0  # the server answered, even if the answer is unusable
            if result.error is not None:  # invalid_utf8 / unknown_finish_reason: the stage rejects it
                self.counters["unusable"] += 1
                return result
            self.counters["ok"] += 1
            self.counters["completion_tokens"] += result.completion_tokens
            self.counters["prompt_tokens"] += result.prompt_tokens
            return result
        assert failure is not None
        self.counters["failed"] += 1
        self._consecutive_failures += 1
        limit = settings.max_consecutive_failures
        if limit and self._consecutive_failures >= limit and self._fatal is None:
            self._stop(BackendUnavailable(
                f"generate.backend={self.name}: {self._consecutive_failures} requests in a row failed after "
                f"{settings.max_attempts} attempts each (last: {failure.kind}: {' '.join(failure.detail.split())}); "
                f"the endpoints {', '.join(self.urls)} look down. Stopping; a rerun resumes where this one stopped "
                "(generate.http.max_consecutive_failures)"))
        return GenerationResult(id=request.id, error=ERROR_REQUEST_FAILED, prompt_tokens=tokens,
                                error_detail=f"{failure.kind}: {failure.detail} (attempt {attempt} of "
                                             f"{settings.max_attempts})")

    def _stop(self, fatal: BackendUnavailable) -> None:
        """Stop every request of every caller with `fatal` (raised here, and by every request still going)."""
        self._fatal = fatal
        # The other requests in flight would only wait out timeouts or backoffs of a dead server:
        # end them now, so every caller stops at once (with what its batch had finished).
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        raise fatal

    def _stop_if_dead(self, urls: Sequence[str]) -> None:
        """Stop at once, naming it, when the server eagle3 launched at one of `urls` has exited."""
        dead = dead_server(urls, IN_FLIGHT) if self._fatal is None else None
        if dead is not None:
            fatal = BackendUnavailable(f"{dead}. Stopping; a rerun resumes where this one stopped")
            fatal.server_exited = dead  # type: ignore[attr-defined]  # named: ServerProcess leaves it as it is
            self._stop(fatal)

    async def _send(self, endpoint: _Endpoint, request: GenerationRequest, payload: bytes) -> GenerationResult:
        """One attempt; a _Failure says what went wrong and whether to retry."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.http.request_timeout_s, sock_connect=self.http.connect_timeout_s)
        assert self._client is not None  # opened by _start, before any request is sent
        endpoint.inflight += 1
        endpoint.requests += 1
        self.inflight += 1
        try:
            reply = await self._client.request("POST", endpoint.chat_url, data=payload, timeout=timeout,
                                               headers={"Content-Type": "application/json"})
            raw, status, wait = reply.body, reply.status, retry_after_seconds(reply.headers)
        except asyncio.TimeoutError:
            raise _Failure("timeout", f"no complete answer within {self.http.request_timeout_s:g} s "
                                      f"from {endpoint.url}") from None
        except aiohttp.ClientConnectorError as exc:
            raise _Failure("connect", f"{endpoint.url}: {exc}"[:ERROR_TEXT_CHARS]) from None
        except (aiohttp.ClientError, OSError) as exc:  # lost connection, cut payload, reset
            raise _Failure("connection", f"{endpoint.url}: {type(exc).__name__}: {exc}"[:ERROR_TEXT_CHARS]) from None
        finally:
            endpoint.inflight -= 1
            self.inflight -= 1
        if status == 200:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:  # an answer, not an outage: reject, do not retry
                return GenerationResult(
                    id=request.id, error=ERROR_INVALID_UTF8,
                    error_detail=f"{endpoint.url}: reply byte {exc.start} of {len(raw)}: {exc.reason}")
        else:  # error text only goes into messages: a replacement character there harms nothing
            text = raw.decode("utf-8", errors="replace")
        if status != 200:
            if is_context_error(status, text):
                raise _Failure(ERROR_PROMPT_TOO_LONG, f"HTTP {status}: {text[:ERROR_TEXT_CHARS]}", retryable=False)
            raise _Failure(f"http_{status}", f"HTTP {status} from {endpoint.url}: {text[:ERROR_TEXT_CHARS]}",
                           retryable=status in RETRY_STATUS, retry_after=wait)
        try:
            return to_result(request, json.loads(text))
        except (ValueError, BadResponse) as exc:  # json.JSONDecodeError is a ValueError
            raise _Failure("bad_response", f"{endpoint.url}: {exc}"[:ERROR_TEXT_CHARS]) from None

    # ------------------------------------------------------------------ reporting
    def stats(self) -> dict[str, Any]:
        """Counters of this backend's life so far (for the manifest's `this_run`)."""
        seconds = time.perf_counter() - self._started_at if self._started_at else 0.0
        c = self.counters
        return {
            "requests_ok": c["ok"], "requests_failed": c["failed"], "prompt_too_long": c["prompt_too_long"],
            "unusable_answers": c["unusable"],
            "retries": c["retries"], "errors": dict(sorted(self.errors.items())),
            "completion_tokens": c["completion_tokens"], "prompt_tokens": c["prompt_tokens"],
            "seconds": round(seconds, 3),
            "requests_per_s": round(c["ok"] / seconds, 3) if seconds else None,
            "tokens_per_s": round(c["completion_tokens"] / seconds, 2) if seconds else None,
            "partitions": dict(sorted(self.partition_requests.items())),
            "endpoints": {ep.url: ep.stats() for ep in self._endpoints},
        }

    def progress(self) -> dict[str, str]:
        """Short live figures for a progress bar postfix: req/s, tok/s, in flight, retries, failures."""
        seconds = time.perf_counter() - self._started_at if self._started_at else 0.0
        c = self.counters
        rate = (lambda n: f"{n / seconds:.1f}") if seconds else (lambda n: "-")
        return {"req/s": rate(c["ok"]), "tok/s": rate(c["completion_tokens"]), "inflight": str(self.inflight),
                "retries": str(c["retries"]), "failed": str(c["failed"])}
