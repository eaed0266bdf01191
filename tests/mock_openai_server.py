"""A small OpenAI-compatible chat server for tests and the client benchmark (a test fake, not a model).

It answers `/v1/chat/completions` the way vLLM/SGLang do with their reasoning and tool-call
parsers on: an assistant message with `reasoning_content` (or `reasoning`, as newer vLLM names
it) when the request's `chat_template_kwargs.thinking` is on, sometimes `tool_calls`, sometimes a
cut at `max_tokens` (`finish_reason: length`), and token usage. Every answer is a pure function
of the request body, so two runs that send the same requests get the same answers.

Faults are injected on a seeded schedule, a pure function of (request, attempt number): the
connection dropped without an answer, HTTP 500/503/429, or a stall longer than the client's
timeout; a few requests fail on every attempt. `reset()` forgets the attempt counts, so a rerun
against the same server sees the same schedule as a fresh one. An outage (`outage`: HTTP 503 for
chosen arrivals, whatever the request) and broken answers (`reply_hook`: an unknown finish reason,
bytes that are not UTF-8) are scripted by the test; `conversations` counts requests per
conversation, so a test can tell which conversations a rerun asked for.

Runs in a background thread of the calling process (`MockChatServer(...).start()`), or as its
own process for benchmarks: `python -m tests.mock_openai_server --trivial --port 8000` (from the
repository root; `scripts/bench_http_client.py` starts it that way). It lives with the tests, not
in the product package: it is fault injection, never a stand-in for a server.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["FaultPlan", "MockChatServer", "TOO_LONG_MARKER", "conversation_key"]

#: A message containing this makes the server refuse the request as vLLM does a too-long prompt.
TOO_LONG_MARKER = "@@TOO_LONG@@"
FAULT_KINDS = ("drop", "http_500", "http_503", "http_429", "stall")
_TRIVIAL = json.dumps({
    "id": "cmpl-0", "object": "chat.completion", "model": "mock",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "ok", "reasoning_content": "r"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}).encode()


@dataclass(frozen=True)
class FaultPlan:
    """Which attempts of which requests fail, and how.

    Attributes:
        seed: Seed of the schedule.
        p_fault: Probability that a request fails on its first 1..max_faulty_attempts attempts.
        max_faulty_attempts: Most failed attempts of a request that then succeeds.
        p_permanent: Probability that a request fails on every attempt (HTTP 500).
        kinds: Fault kinds to draw from (see FAULT_KINDS).
        stall_s: How long a `stall` holds the request before answering (past the client timeout).
    """

    seed: int = 0
    p_fault: float = 0.0
    max_faulty_attempts: int = 2
    p_permanent: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS
    stall_s: float = 2.0

    def fault(self, key: str, attempt: int) -> Optional[str]:
        """The fault of attempt `attempt` (1-based) of the request with hash `key`, or None."""
        rng = random.Random(f"{self.seed}:{key}")
        if rng.random() < self.p_permanent:
            return "http_500"
        if rng.random() >= self.p_fault:
            return None
        n_faults = rng.randint(1, self.max_faulty_attempts)
        kinds = [rng.choice(self.kinds) for _ in range(n_faults)]
        return kinds[attempt - 1] if attempt <= n_faults else None


def request_key(body: dict[str, Any]) -> str:
    """Hash of everything in a request that decides the answer."""
    keep = {k: body.get(k) for k in ("messages", "tools", "max_tokens", "temperature", "top_p", "seed",
                                     "chat_template_kwargs")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def conversation_key(messages: Sequence[dict[str, Any]]) -> str:
    """Which conversation a request belongs to: its messages up to the first user turn.

    Every turn of a regenerated conversation starts with them, and a prompt record's own messages
    give the same key, so a test maps requests back to conversation ids.
    """
    head = []
    for message in messages:
        if message.get("role") in ("system", "user"):
            head.append([message.get("role"), message.get("content")])
        if message.get("role") == "user":
            break
    return hashlib.sha256(json.dumps(head, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _chars(body: dict[str, Any]) -> int:
    return sum(len(str(m.get("content") or "")) for m in body.get("messages") or [])


class MockChatServer:
    """An OpenAI-compatible chat server on 127.0.0.1 (random port) with scripted behaviour.

    Attributes:
        url: `http://127.0.0.1:PORT` once started.
        stats: Counter of `requests`, `ok`, fault kinds, `finish_<reason>`, `too_long`, `outage`.
        conversations: Chat requests per `conversation_key`, attempts included.
        outage: Given a chat request's arrival number (1-based since start or `reset`), whether
            the server is down for it (HTTP 503); None = never. Settable while serving.
        reply_hook: Given a request body and the completion about to be sent, the completion to
            send instead (a dict, or raw bytes); None = send it as is. Settable while serving.
        max_inflight: Highest number of requests in flight at once, per size class
            (`short` / `long`, split at `long_chars` message characters) and `all`.
        bodies: Request bodies received (when `record_bodies`).
    """

    def __init__(self, *, model: str = "mock-target", latency_s: float = 0.0, faults: FaultPlan = FaultPlan(),
                 reasoning_field: str = "reasoning_content", tool_every: int = 0, length_every: int = 0,
                 long_chars: int = 10**9, record_bodies: bool = False, trivial: bool = False,
                 port: int = 0, outage: Optional[Callable[[int], bool]] = None,
                 reply_hook: Optional[Callable[[dict[str, Any], dict[str, Any]], Any]] = None) -> None:
        """
        Args:
            model: Name listed by /v1/models.
            latency_s: Time each answer takes (holds the request in flight).
            faults: Fault schedule.
            reasoning_field: `reasoning_content` (SGLang, older vLLM) or `reasoning` (newer vLLM).
            tool_every: About one answer in this many is a tool call (0 = never).
            length_every: About one answer in this many is cut at max_tokens (0 = never).
            long_chars: Message characters above which a request counts as `long` in max_inflight.
            record_bodies: Keep every request body in `bodies`.
            trivial: Answer every chat request with one fixed completion (client benchmark).
            port: TCP port (0 = any free one).
            outage: See the attribute.
            reply_hook: See the attribute.
        """
        self.model, self.latency_s, self.faults = model, latency_s, faults
        self.reasoning_field, self.tool_every, self.length_every = reasoning_field, tool_every, length_every
        self.long_chars, self.record_bodies, self.trivial, self.port = long_chars, record_bodies, trivial, port
        self.outage, self.reply_hook = outage, reply_hook
        self.url: Optional[str] = None
        self.stats: Counter[str] = Counter()
        self.conversations: Counter[str] = Counter()
        self.max_inflight: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self._attempts: Counter[str] = Counter()
        self._inflight: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._runner: Any = None

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Forget attempt counts, statistics and recorded bodies (a rerun sees a fresh server)."""
        with self._lock:
            self._attempts.clear()
            self.stats.clear()
            self.conversations.clear()
            self.max_inflight.clear()
            self.bodies.clear()

    def start(self) -> MockChatServer:
        """Serve from a daemon thread; returns self (with `url` set)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve(sock))
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="mock-chat-server", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("mock server did not start")
        return self

    async def _serve(self, sock: socket.socket) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        """Stop serving and close the port."""
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=30)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]  # e.g. stalls still sleeping
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> MockChatServer:
        return self.start() if self._loop is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ handlers
    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="ok")

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        if self.trivial:
            await request.read()
            self.stats["requests"] += 1
            return web.Response(body=_TRIVIAL, content_type="application/json")
        body = await request.json()
        key = request_key(body)
        size = "long" if _chars(body) > self.long_chars else "short"
        with self._lock:
            self.stats["requests"] += 1
            arrival = self.stats["requests"]
            self.conversations[conversation_key(body.get("messages") or [])] += 1
            self._attempts[key] += 1
            attempt = self._attempts[key]
            if self.record_bodies:
                self.bodies.append(body)
        if self.outage is not None and self.outage(arrival):
            self.stats["outage"] += 1
            return web.json_response({"object": "error", "message": "server down", "code": 503}, status=503)
        fault = self.faults.fault(key, attempt)
        self._enter(size)
        try:
            if fault is not None:
                self.stats[fault] += 1
            if fault == "drop":
                request.transport.abort()  # the client sees the connection die without an answer
                raise asyncio.CancelledError()  # aiohttp: a premature disconnection, not logged
            if fault in ("http_500", "http_503"):
                return web.json_response({"object": "error", "message": "injected fault", "code": int(fault[5:])},
                                         status=int(fault[5:]))
            if fault == "http_429":
                return web.json_response({"object": "error", "message": "too many requests"}, status=429,
                                         headers={"Retry-After": "0"})
            if fault == "stall":
                await asyncio.sleep(self.faults.stall_s)
            if any(TOO_LONG_MARKER in str(m.get("content")) for m in body.get("messages") or []):
                self.stats["too_long"] += 1
                return web.json_response(
                    {"object": "error", "type": "BadRequestError", "code": 400,
                     "message": "This model's maximum context length is 2048 tokens. However, you requested "
                                "4096 tokens in the messages. Please reduce the length of the messages."},
                    status=400)
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            completion = self.complete(body, key)
            if self.reply_hook is not None:
                completion = self.reply_hook(body, completion)
            self.stats["ok"] += 1
            if isinstance(completion, bytes):
                return web.Response(body=completion, content_type="application/json")
            self.stats[f"finish_{completion['choices'][0]['finish_reason']}"] += 1
            return web.json_response(completion)
        finally:
            self._exit(size)

    def _enter(self, size: str) -> None:
        with self._lock:
            for cls in (size, "all"):
                self._inflight[cls] += 1
                self.max_inflight[cls] = max(self.max_inflight[cls], self._inflight[cls])

    def _exit(self, size: str) -> None:
        with self._lock:
            for cls in (size, "all"):
                self._inflight[cls] -= 1

    # ------------------------------------------------------------------ answers
    def complete(self, body: dict[str, Any], key: Optional[str] = None) -> dict[str, Any]:
        """The deterministic completion of a request body."""
        key = key or request_key(body)
        num = int(key[:8], 16)
        messages = body.get("messages") or []
        users = [m for m in messages if m.get("role") == "user"]
        question = str(users[-1].get("content") if users else "")[:60]
        thinking = (body.get("chat_template_kwargs") or {}).get("thinking", True)
        max_tokens = int(body.get("max_tokens") or 16)
        reasoning = f"The user asks: {question} Plan {key[:6]}."
        content = f"Answer {key[:10]} to turn {len(users)}."
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = "stop"
        if self.tool_every and num % self.tool_every == 0:
            message.update(content=None, tool_calls=[{
                "id": f"functions.lookup:{len(users) - 1}", "type": "function", "index": 0,
                "function": {"name": "lookup", "arguments": json.dumps({"query": key[:8]})}}])
            finish = "tool_calls"
        elif self.length_every and num % self.length_every == 1:
            reasoning = reasoning + " and so on"  # cut inside the reasoning (thinking) or the answer
            message["content"] = "" if thinking else content[: len(content) // 2]
            finish = "length"
        if thinking:
            message[self.reasoning_field] = reasoning
        text = (reasoning if thinking else "") + (message.get("content") or "")
        completion_tokens = max_tokens if finish == "length" else min(max_tokens, len(text) // 4 + 1)
        prompt_tokens = _chars(body) // 4 + 4 * len(messages)
        return {"id": f"chatcmpl-{key[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}


def main(argv: Optional[list[str]] = None) -> None:
    """Serve until killed (for benchmarks): prints the URL on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--trivial", action="store_true", help="one fixed answer, no hashing")
    parser.add_argument("--latency-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    server = MockChatServer(port=args.port, trivial=args.trivial, latency_s=args.latency_s).start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
