"""The one HTTP layer every client of an engine uses: health checks, the bench client, generation.

aiohttp underneath (declared in pyproject), async first; `request_sync` runs one request on a
short-lived loop for the synchronous callers (health checks while a server starts).

The proxy rule, written only here: a URL on loopback (127.0.0.0/8, ::1, localhost: every server
this project launches) never goes through a proxy from the environment -- most `no_proxy` lists
do not name 127.0.0.1, and a health check answered by a corporate proxy would "find" a server
that is not there. Any other URL (a fleet in `server.urls`) follows the environment's
`HTTP(S)_PROXY` / `NO_PROXY`, as curl would. `Client` keeps one session per side of that rule.

Importing this module is cheap: aiohttp is imported when the first session opens.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, Union
from urllib.parse import urlsplit

__all__ = ["RETRY_STATUS", "BackgroundLoop", "Client", "HTTPFailure", "Reply", "backoff_delay", "is_loopback_host",
           "is_loopback_url", "models_url", "openai_base", "request_sync", "retry_after_seconds", "served_model"]

log = logging.getLogger("eagle3")
T = TypeVar("T")

#: Characters of an error body quoted in a one-line error.
ERROR_TEXT_CHARS = 300
#: Statuses worth a retry: a timeout, too many requests, a server error or a proxy's.
RETRY_STATUS = (408, 429, 500, 502, 503, 504)
Timeout = Union[float, Any]  # seconds, or an aiohttp.ClientTimeout


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random,
                  retry_after: Optional[float] = None) -> float:
    """Wait before retry number `attempt` (1 = the first retry): exponential, capped, jittered.

    "Equal jitter": half the exponential step is fixed, half random, so retries of many
    requests that failed together spread out but none retries immediately. A server's
    `Retry-After` raises the wait (never above `cap`).
    """
    step = min(cap, base * 2 ** (attempt - 1))
    delay = step / 2 + rng.uniform(0, step / 2)
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay


def retry_after_seconds(headers: Mapping[str, str]) -> Optional[float]:
    """A response's `Retry-After` in seconds (the delay form; None when absent or a date)."""
    value = headers.get("Retry-After")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def is_loopback_host(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (the hosts a launched server may bind)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is on loopback (see the module docstring: then never proxied)."""
    return is_loopback_host(urlsplit(str(url)).hostname or "")


def openai_base(url: str) -> str:
    """`http://host:port` or `http://host:port/v1` -> `http://host:port` (no trailing slash)."""
    url = str(url).rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def models_url(url: str) -> str:
    """The OpenAI model list of a server base URL (also its cheapest liveness probe)."""
    return openai_base(url) + "/v1/models"


class HTTPFailure(Exception):
    """A request that got no usable answer: one line naming the URL and what happened.

    Attributes:
        url: The requested URL.
        status: The HTTP status, or None when no response came (refused, timed out, cut).
        detail: The error body (cut) or the exception.
    """

    def __init__(self, url: str, detail: str, status: Optional[int] = None) -> None:
        shown = f"HTTP {status}: {detail}" if status is not None else detail
        super().__init__(f"{url}: {shown}")
        self.url, self.status, self.detail = url, status, detail


@dataclass(frozen=True)
class Reply:
    """A whole response: status, body bytes and headers (case-insensitive, as HTTP's are)."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def raise_for_status(self, url: str) -> Reply:
        """This reply if 2xx, else an HTTPFailure with the start of the body."""
        if not 200 <= self.status < 300:
            raise HTTPFailure(url, self.text()[:ERROR_TEXT_CHARS], self.status)
        return self


class Client:
    """Sessions to any number of endpoints, applying the proxy rule per URL.

    Args:
        limit: Connections at once per session (aiohttp's connector limit).

    Use as `async with Client() as client: reply = await client.request("GET", url, timeout=5)`.
    Errors are aiohttp's own (`aiohttp.ClientConnectorError` for a refused connection, other
    `aiohttp.ClientError`s for lost ones, `asyncio.TimeoutError`), so a caller with a retry
    policy can tell them apart; `get_json` / `request_sync` turn them into `HTTPFailure`.
    """

    def __init__(self, *, limit: int = 100) -> None:
        self.limit = int(limit)
        self._sessions: dict[bool, Any] = {}
        self._direct: dict[str, bool] = {}  # url -> on loopback (decided once per URL)

    def session_for(self, url: str) -> Any:
        """The session for `url`: loopback ones ignore proxy variables, others follow them."""
        import aiohttp

        direct = self._direct.get(url)
        if direct is None:
            direct = self._direct[url] = is_loopback_url(url)
        if direct not in self._sessions:
            connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, ttl_dns_cache=300)
            self._sessions[direct] = aiohttp.ClientSession(connector=connector, trust_env=not direct,
                                                           json_serialize=json.dumps)
        return self._sessions[direct]

    async def request(self, method: str, url: str, *, json_body: Any = None, data: Optional[bytes] = None,
                      headers: Optional[dict[str, str]] = None, timeout: Timeout = 30.0) -> Reply:
        """Send one request and read the whole body (aiohttp errors propagate, see the class)."""
        import aiohttp

        if not isinstance(timeout, aiohttp.ClientTimeout):
            timeout = aiohttp.ClientTimeout(total=float(timeout))
        if json_body is not None:
            data = json.dumps(json_body, ensure_ascii=False).encode("utf-8")
            headers = {"Content-Type": "application/json", **(headers or {})}
        async with self.session_for(url).request(method, url, data=data, headers=headers, timeout=timeout) as resp:
            body = await resp.read()
            return Reply(resp.status, body, resp.headers)

    async def answer(self, method: str, url: str, *, json_body: Any = None, timeout: Timeout = 30.0) -> Reply:
        """`request`, with "no response" (refused, timed out, cut) raised as one HTTPFailure.

        A connection the server closed without answering is tried once more, on a new connection:
        servers drop kept-alive connections that sat idle (uvicorn after 5 s), and one picked from
        the pool just as the server closes it is cut before the request is read, which aiohttp
        reports as `ServerDisconnectedError` (it killed a vLLM benchmark on busy cores). The
        requests sent this way are greedy or seeded, so a request that did reach the engine gives
        the same answer twice.
        """
        import aiohttp

        try:
            try:
                return await self.request(method, url, json_body=json_body, timeout=timeout)
            except aiohttp.ServerDisconnectedError:
                return await self.request(method, url, json_body=json_body, timeout=timeout)
        except asyncio.TimeoutError:
            raise HTTPFailure(url, f"no answer within {_seconds(timeout)} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise HTTPFailure(url, f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_CHARS]) from None

    async def get_json(self, method: str, url: str, *, json_body: Any = None, timeout: Timeout = 30.0) -> Any:
        """The JSON of a 2xx answer; no answer, an error status or a body that is not JSON is an HTTPFailure."""
        reply = (await self.answer(method, url, json_body=json_body, timeout=timeout)).raise_for_status(url)
        try:
            return reply.json()
        except ValueError as exc:
            raise HTTPFailure(url, f"not JSON: {exc}") from None

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _seconds(timeout: Timeout) -> str:
    total = getattr(timeout, "total", timeout)
    return f"{float(total):g}" if total is not None else "?"


async def served_model(client: Client, url: str, timeout: Timeout = 30.0) -> Optional[str]:
    """The first model id a server's `/v1/models` lists (the name requests must use).

    None when the server answers but lists none, or has no such endpoint (a status below 500);
    HTTPFailure when it does not answer or answers 5xx -- it is not serving yet.
    """
    target = models_url(url)
    reply = await client.answer("GET", target, timeout=timeout)
    if reply.status >= 500:
        raise HTTPFailure(target, reply.text()[:ERROR_TEXT_CHARS], reply.status)
    if reply.status != 200:
        return None
    try:
        data = reply.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        return None


def request_sync(method: str, url: str, *, json_body: Any = None, timeout: Timeout = 30.0) -> Reply:
    """One request from synchronous code (no event loop running in this thread).

    Raises:
        HTTPFailure: No response (refused, timed out, cut); an error status is returned, not raised.
    """
    async def send() -> Reply:
        async with Client(limit=1) as client:
            return await client.answer(method, url, json_body=json_body, timeout=timeout)

    return asyncio.run(send())


class BackgroundLoop:
    """An event loop in a daemon thread, so synchronous callers (stage threads) can drive one async
    client: every `run` from any thread lands on the same loop and shares its connections.

    Args:
        name: Names the thread (`eagle3-<name>-client`).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._loop is not None

    def start(self, first: Optional[Callable[[], Coroutine[Any, Any, Any]]] = None) -> None:
        """Start the loop if it is not running, then run `first()` on it (a failure stops the loop again)."""
        with self._lock:
            if self._loop is not None:
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"eagle3-{self.name}-client", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            if first is not None:
                try:
                    asyncio.run_coroutine_threadsafe(first(), loop).result()
                except BaseException:
                    self._stop()
                    raise

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for it; interrupting the wait cancels it."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self.name} client: the loop is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self, cleanup: Optional[Callable[[], Awaitable[Any]]] = None, timeout: float = 30.0) -> None:
        """Cancel what is in flight, await `cleanup()` (closing sessions), stop the loop (idempotent)."""
        with self._lock:
            if self._loop is None:
                return

            async def shutdown() -> None:
                current = asyncio.current_task()
                tasks = [t for t in asyncio.all_tasks() if t is not current]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if cleanup is not None:
                    await cleanup()

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=timeout)
            except Exception as exc:  # closing must not mask the error that got us here
                log.warning("%s client: unclean shutdown: %s", self.name, exc)
            self._stop()

    def _stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=30)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = None
