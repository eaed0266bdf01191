"""Hidden states from vLLM servers: the client of `extract.backend=vllm` (and online training with it).

Each prompt is one `/v1/completions` request (its token ids, one generated token) to a server
running vLLM's `extract_hidden_states` method with eagle3's connector
(`eagle3.extract.vllm_connector`); the answer's `kv_transfer_params["hidden_states_path"]` names
the file the server writes right after. The file is waited for, read, checked (its token ids are
the prompt's, its shape is `[T, C + 1, H]`, its values are finite) and removed. The `C` capture
states become `aux [T, C*H]`; the last one, vLLM's residual after the last layer, becomes the
teacher `final [T, H]` through the target's own final norm (transformers returns it normed).

Requests of a batch are in flight together (`extract.http.concurrency`), spread over the URLs, and
retried with exponential backoff on timeouts, lost connections and 429/5xx, like generate's. A
prompt that still fails is reported back as a reject reason; once `max_consecutive_failures`
prompts in a row failed the server is taken to be down and the run stops (a rerun resumes).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import torch

from eagle3.errors import Eagle3Error
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
    from eagle3.config.schema import ExtractHTTPConfig

__all__ = ["ServerDown", "VLLMStates"]

log = logging.getLogger("eagle3")
_POLL_S = 0.02
#: What a prompt comes back as: its states, or why it has none (a reject reason and detail).
States = Union[tuple[torch.Tensor, torch.Tensor], tuple[str, str]]


class ServerDown(Eagle3Error):
    """The extraction server stopped answering (or never ran eagle3's connector); one line."""


class _Retry(Exception):
    def __init__(self, detail: str, retry_after: Optional[float] = None) -> None:
        super().__init__(detail)
        self.detail, self.retry_after = detail, retry_after


class _Refused(Exception):
    """The server refused this prompt for good (a 4xx that is not 408/429: e.g. longer than its context)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class VLLMStates:
    """Hidden states of token sequences from vLLM servers (see the module docstring).

    Args:
        urls: Base URLs of the servers.
        settings: Concurrency, timeouts and retries (`extract.http`).
        n_capture: C, the capture layers the servers were started with (before the final id).
        final_norm: The target's final norm `(weight [H], eps)`.
    """

    name = "vllm"

    def __init__(self, urls: Sequence[str], settings: ExtractHTTPConfig, n_capture: int,
                 final_norm: tuple[torch.Tensor, float]) -> None:
        if not urls:
            raise ServerDown("extract.backend=vllm: no server URL")
        self.urls = [str(u).rstrip("/") for u in urls]
        self.settings, self.n_capture = settings, int(n_capture)
        self.norm_weight, self.norm_eps = final_norm
        self.model: Optional[str] = None
        self._runner = BackgroundLoop("vllm-states")
        self._client: Optional[Client] = None
        self._rng = random.Random()  # jitter only
        self._turn = 0
        self._failures_in_a_row = 0
        self.counters = {"prompts": 0, "tokens": 0, "retries": 0, "failed": 0, "seconds": 0.0}

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
        last: Optional[_Retry] = None
        for attempt in range(1, s.max_attempts + 1):
            if attempt > 1:
                self.counters["retries"] += 1
                await asyncio.sleep(backoff_delay(attempt - 1, s.backoff_s, s.max_backoff_s, self._rng,
                                                  last.retry_after if last else None))
            url = self.urls[self._turn % len(self.urls)]
            self._turn += 1
            try:
                path = await self._request(url, ids)
                data = await self._read(Path(path))
            except _Retry as exc:
                last = exc
                continue
            except _Refused as exc:  # this prompt, not the server: a reject, the run goes on
                self.counters["failed"] += 1
                return "server_refused", exc.detail
            self._failures_in_a_row = 0
            self.counters["prompts"] += 1
            self.counters["tokens"] += len(ids)
            return self._convert(ids, data, path)
        self.counters["failed"] += 1
        self._failures_in_a_row += 1
        if s.max_consecutive_failures and self._failures_in_a_row >= s.max_consecutive_failures:
            raise ServerDown(f"extract.server: {self._failures_in_a_row} prompts in a row failed after "
                             f"{s.max_attempts} attempts each (last: {last.detail if last else '?'}); the servers "
                             f"{', '.join(self.urls)} look down. Stopping; a rerun resumes "
                             "(extract.http.max_consecutive_failures)")
        return "request_failed", f"{last.detail if last else '?'} (after {s.max_attempts} attempts)"

    async def _request(self, url: str, ids: list[int]) -> str:
        """One completion request; the path of the states file it names."""
        import aiohttp

        assert self._client is not None
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout_s)
        try:
            reply = await self._client.request("POST", url + "/v1/completions", json_body=body, timeout=timeout)
        except asyncio.TimeoutError:
            raise _Retry(f"no answer from {url} within {self.settings.request_timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _Retry(f"{url}: {type(exc).__name__}: {exc}"[:ERROR_TEXT_CHARS]) from None
        if reply.status != 200:
            text = reply.text()[:ERROR_TEXT_CHARS]
            if reply.status not in RETRY_STATUS:
                raise _Refused(f"HTTP {reply.status} from {url} for {len(ids)} tokens: {text}")
            raise _Retry(f"HTTP {reply.status} from {url}: {text}", retry_after_seconds(reply.headers))
        try:
            params = reply.json().get("kv_transfer_params") or {}
        except (ValueError, AttributeError):
            raise _Retry(f"{url}: an answer that is not JSON") from None
        path = params.get("hidden_states_path")
        if not path:
            raise ServerDown(f"extract.server: {url} answers without kv_transfer_params.hidden_states_path: it does "
                             "not run vLLM's extract_hidden_states method with eagle3's connector; leave "
                             "extract.server.urls empty (the job launches it), or start it with "
                             "`python scripts/run.py stage=serve serve.hidden_states=true extract.backend=vllm`")
        return str(path)

    async def _read(self, path: Path) -> dict[str, torch.Tensor]:
        """Wait for the server's file (written whole, then renamed), load it, remove it."""
        from safetensors.torch import load_file

        deadline = time.monotonic() + self.settings.file_wait_s
        while not path.is_file():
            if time.monotonic() >= deadline:
                raise _Retry(f"{path}: not written within {self.settings.file_wait_s:g} s (extract.http.file_wait_s; "
                             "with extract.server.urls, extract.http.exchange_dir must be shared with the server)")
            await asyncio.sleep(_POLL_S)
        try:
            return load_file(str(path))
        finally:
            path.unlink(missing_ok=True)

    def _convert(self, ids: list[int], data: dict[str, torch.Tensor], path: str) -> States:
        from eagle3.draft.target_weights import rms_norm
        from eagle3.extract.vllm_connector import HIDDEN_STATES_KEY, TOKEN_IDS_KEY

        states, token_ids = data.get(HIDDEN_STATES_KEY), data.get(TOKEN_IDS_KEY)
        if states is None or token_ids is None:
            return "bad_hidden_states", f"{path} lacks {HIDDEN_STATES_KEY}/{TOKEN_IDS_KEY}: {sorted(data)}"
        if token_ids.tolist() != ids:
            return "hidden_states_mismatch", f"{path} holds the states of other token ids ({len(token_ids)} ids)"
        hidden = self.norm_weight.shape[0]
        want = (len(ids), self.n_capture + 1, hidden)
        if tuple(states.shape) != want:
            return "bad_hidden_states", f"{path} has shape {list(states.shape)}, expected {list(want)}"
        aux = states[:, : self.n_capture].reshape(len(ids), self.n_capture * hidden)  # [T, C*H]
        final = rms_norm(states[:, self.n_capture], self.norm_weight, self.norm_eps)  # [T, H]
        return aux, final
