"""What the clients of extraction servers share (`extract.backend=vllm|sglang`, and online training with them).

A `ServerStates` answers `states(seqs)` like every state source (`eagle3.extract.sources`): per
token sequence `(aux [T, C*H], final [T, H])` or `(reject reason, detail)`. Each engine's client
says how one prompt's states are asked for and read (`_fetch`) and how the answer becomes those
tensors (`_convert`); this class does the rest the same way for both:

Requests of a batch are in flight together (`extract.http.concurrency`), spread over the URLs in
turn, and retried with exponential backoff on timeouts, lost connections and 429/5xx, like
generate's. A prompt the server refuses for good (another 4xx: longer than its context, say) is a
reject and the run goes on; a prompt that still fails after `max_attempts` is reported back as a
reject reason; once `max_consecutive_failures` prompts in a row failed the server is taken to be
down and the run stops (`ServerDown`; a rerun resumes). A server eagle3 launched that has exited stops
the run at the first failed attempt, in one line naming it (`eagle3.serving.exits.dead_server`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import torch

from eagle3.errors import Eagle3Error
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

if TYPE_CHECKING:
    from eagle3.config.client_schema import ExtractHTTPConfig

__all__ = ["RetryRequest", "ServerDown", "ServerStates", "States", "post_json"]

#: How the line naming a launched server that died says when it died.
IN_FLIGHT = "while extract's requests were in flight"
#: What a prompt comes back as: its states, or why it has none (a reject reason and detail).
States = Union[tuple[torch.Tensor, torch.Tensor], tuple[str, str]]


class ServerDown(Eagle3Error):
    """The extraction server stopped answering (or does not hand out hidden states); one line."""


class RetryRequest(Exception):
    """This attempt failed in a way another attempt may not (a timeout, a lost connection, 429/5xx)."""

    def __init__(self, detail: str, retry_after: Optional[float] = None) -> None:
        super().__init__(detail)
        self.detail, self.retry_after = detail, retry_after


class RefusedPrompt(Exception):
    """The server refused this prompt for good (a 4xx that is not 408/429: e.g. longer than its context)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def post_json(client: Client, url: str, path: str, body: dict[str, Any], timeout_s: float,
                    what: str) -> dict[str, Any]:
    """POST `body` to `url + path`: the 200 reply's JSON object, or RetryRequest / RefusedPrompt (`what`: the
    prompt, for errors)."""
    import aiohttp

    try:
        reply = await client.request("POST", url + path, json_body=body, timeout=aiohttp.ClientTimeout(total=timeout_s))
    except asyncio.TimeoutError:
        raise RetryRequest(f"no answer from {url} within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise RetryRequest(f"{url}: {type(exc).__name__}: {exc}"[:ERROR_TEXT_CHARS]) from None
    if reply.status != 200:
        text = reply.text()[:ERROR_TEXT_CHARS]
        if reply.status not in RETRY_STATUS:
            raise RefusedPrompt(f"HTTP {reply.status} from {url} for {what}: {text}")
        raise RetryRequest(f"HTTP {reply.status} from {url}: {text}", retry_after_seconds(reply.headers))
    try:
        answer = reply.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise RetryRequest(f"{url}: an answer that is not a JSON object")
    return answer


class ServerStates:
    """Hidden states of token sequences from extraction servers (see the module docstring).

    Args:
        urls: Base URLs of the servers.
        settings: Concurrency, timeouts and retries (`extract.http`).
        n_capture: C, the capture layers the servers were started with.
    """

    name = "server"

    def __init__(self, urls: Sequence[str], settings: ExtractHTTPConfig, n_capture: int) -> None:
        if not urls:
            raise ServerDown(f"extract.backend={self.name}: no server URL")
        self.urls = [str(u).rstrip("/") for u in urls]
        self.settings, self.n_capture = settings, int(n_capture)
        self.model: Optional[str] = None
        self._runner = BackgroundLoop(f"{self.name}-states")
        self._client: Optional[Client] = None
        self._rng = random.Random()  # jitter only
        self._turn = 0
        self._failures_in_a_row = 0
        self.counters = {"prompts": 0, "tokens": 0, "retries": 0, "failed": 0, "seconds": 0.0}

    # ------------------------------------------------------------------ what an engine's client says
    async def _fetch(self, client: Client, url: str, ids: list[int]) -> tuple[Any, str]:
        """One attempt at one prompt's states: the engine's answer and where it came from (for messages).

        Raises RetryRequest, RefusedPrompt or ServerDown."""
        raise NotImplementedError

    def _convert(self, ids: list[int], data: Any, where: str) -> States:
        """The answer as `(aux [T, C*H], final [T, H])`, or `(reason, detail)` if it does not fit the prompt."""
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self._runner.start(self._connect)

    async def _connect(self) -> None:
        self._client = Client(limit=self.settings.concurrency + 4)
        deadline = time.monotonic() + self.settings.connect_wait_s
        while True:
            try:
                self.model = await served_model(self._client, self.urls[0], timeout=10.0)
                return
            except HTTPFailure as exc:
                if time.monotonic() >= deadline:
                    raise ServerDown(f"extract.server: {self.urls[0]} did not answer within "
                                     f"{self.settings.connect_wait_s:g} s (extract.http.connect_wait_s): "
                                     f"{exc}") from None
                await asyncio.sleep(1.0)

    def close(self) -> None:
        """Close the connections and stop the client's loop (idempotent)."""
        self._runner.stop(self._close_client)

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "urls": self.urls, "model": self.model,
                "concurrency": self.settings.concurrency, **self.counters}

    def _stop_if_dead(self) -> None:
        """Stop at once, naming it, when a server eagle3 launched at these URLs has exited (no retries into a
        dead server; `eagle3.serving.exits`)."""
        dead = dead_server(self.urls, IN_FLIGHT)
        if dead is not None:
            down = ServerDown(f"{dead}. Stopping; a rerun resumes where this one stopped")
            down.server_exited = dead  # type: ignore[attr-defined]  # named: ServerProcess leaves it as it is
            raise down

    # ------------------------------------------------------------------ states
    def states(self, seqs: Sequence[np.ndarray]) -> list[States]:
        """The states of each sequence, in order: `(aux [T, C*H], final [T, H])`, or `(reason, detail)`.

        Raises:
            ServerDown: The servers look down, or do not hand out hidden states.
        """
        if not seqs:
            return []
        self._start()
        started = time.perf_counter()
        results = self._runner.run(self._batch([np.asarray(s).tolist() for s in seqs]))
        self.counters["seconds"] += time.perf_counter() - started
        return results

    async def _batch(self, seqs: list[list[int]]) -> list[States]:
        slots = asyncio.Semaphore(self.settings.concurrency)

        async def one(ids: list[int]) -> States:
            async with slots:
                return await self._one(ids)

        return list(await asyncio.gather(*(one(ids) for ids in seqs)))

    async def _one(self, ids: list[int]) -> States:
        s = self.settings
        last: Optional[RetryRequest] = None
        for attempt in range(1, s.max_attempts + 1):
            if attempt > 1:
                self.counters["retries"] += 1
                await asyncio.sleep(backoff_delay(attempt - 1, s.backoff_s, s.max_backoff_s, self._rng,
                                                  last.retry_after if last else None))
            url = self.urls[self._turn % len(self.urls)]
            self._turn += 1
            assert self._client is not None
            try:
                data, where = await self._fetch(self._client, url, ids)
            except RetryRequest as exc:
                last = exc
                self._stop_if_dead()
                continue
            except RefusedPrompt as exc:  # this prompt, not the server: a reject, the run goes on
                self.counters["failed"] += 1
                return "server_refused", exc.detail
            self._failures_in_a_row = 0
            self.counters["prompts"] += 1
            self.counters["tokens"] += len(ids)
            return self._convert(ids, data, where)
        self.counters["failed"] += 1
        self._failures_in_a_row += 1
        if s.max_consecutive_failures and self._failures_in_a_row >= s.max_consecutive_failures:
            raise ServerDown(f"extract.server: {self._failures_in_a_row} prompts in a row failed after "
                             f"{s.max_attempts} attempts each (last: {last.detail if last else '?'}); the servers "
                             f"{', '.join(self.urls)} look down. Stopping; a rerun resumes "
                             "(extract.http.max_consecutive_failures)")
        return "request_failed", f"{last.detail if last else '?'} (after {s.max_attempts} attempts)"
