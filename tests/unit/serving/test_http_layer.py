"""The one HTTP layer (`eagle3.serving.http`): the proxy rule, the served model, one-line failures.

Real sockets on 127.0.0.1: a plain HTTP server standing for an engine, and a forward proxy that
records what it was asked. The rule under test: loopback URLs (every server eagle3 launches)
never go through the environment's proxy; other URLs (a fleet in `server.urls`) do.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3.serving.http import Client, HTTPFailure, is_loopback_url, models_url, request_sync, served_model


class Recorder:
    """An HTTP server on 127.0.0.1 that answers every GET with `{"data": [{"id": name}]}` and keeps the
    request lines it saw (a forward proxy sees absolute URLs in them)."""

    def __init__(self, name: str) -> None:
        self.name, self.seen = name, []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                recorder.seen.append(self.path)
                body = json.dumps({"data": [{"id": recorder.name}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("retry-after", "7")  # lowercase, as h11-based servers (uvicorn) send names
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxied(monkeypatch):
    """An engine and a proxy, with the proxy set in the environment the way a corporate machine has it."""
    engine, proxy = Recorder("engine-model"), Recorder("via-proxy")
    for var in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    yield engine, proxy
    engine.close()
    proxy.close()


def test_loopback_urls_never_go_through_the_environments_proxy(proxied):
    engine, proxy = proxied
    reply = request_sync("GET", engine.url + "/v1/models", timeout=10)
    assert reply.status == 200 and reply.json()["data"][0]["id"] == "engine-model"
    assert reply.headers.get("Retry-After") == "7"  # header names are case-insensitive
    localhost = engine.url.replace("127.0.0.1", "localhost")
    assert request_sync("GET", localhost + "/health", timeout=10).status == 200
    assert engine.seen == ["/v1/models", "/health"] and proxy.seen == []


def test_other_urls_follow_the_environments_proxy(proxied):
    engine, proxy = proxied
    reply = request_sync("GET", "http://fleet-node.invalid:30000/v1/models", timeout=10)
    assert reply.json()["data"][0]["id"] == "via-proxy"
    assert proxy.seen == ["http://fleet-node.invalid:30000/v1/models"] and engine.seen == []


def test_served_model_and_one_line_failures():
    engine = Recorder("/models/demo_target")
    try:
        async def ask(url):
            async with Client() as client:
                return await served_model(client, url, timeout=10)

        assert asyncio.run(ask(engine.url + "/v1")) == "/models/demo_target"  # a /v1 base URL works too
    finally:
        engine.close()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(HTTPFailure) as failure:
        request_sync("GET", dead + "/health", timeout=5)
    assert str(failure.value).startswith(f"{dead}/health: ") and "\n" not in str(failure.value)
    assert failure.value.status is None


def test_url_helpers():
    assert is_loopback_url("http://127.0.0.2:8000") and is_loopback_url("http://[::1]:1") and is_loopback_url(
        "http://localhost:30000/v1")
    assert not is_loopback_url("http://10.0.0.5:30000") and not is_loopback_url("http://example.com")
    assert models_url("http://h:1/v1/") == models_url("http://h:1") == "http://h:1/v1/models"


def test_a_connection_the_server_closes_unanswered_is_tried_once_more():
    """A kept-alive connection dropped by the server as the request goes out (aiohttp's
    ServerDisconnectedError): the request is sent again on a new connection, once."""
    answered, cut = [], []

    async def scenario(cuts: int):
        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if len(cut) < cuts:  # read the request, close without a byte of answer
                cut.append(1)
                writer.close()
                return
            answered.append(1)
            body = b'{"ok": true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        try:  # a POST, as completions are (aiohttp itself retries some idempotent GETs)
            async with Client() as client:
                return await client.get_json("POST", url, json_body={"prompt": [1, 2]}, timeout=10)
        finally:
            server.close()

    assert asyncio.run(scenario(cuts=1)) == {"ok": True} and len(cut) == 1 and len(answered) == 1
    cut.clear()
    with pytest.raises(HTTPFailure) as failure:  # cut twice: a real failure, one line
        asyncio.run(scenario(cuts=2))
    assert "ServerDisconnectedError" in str(failure.value) and "\n" not in str(failure.value)
    assert len(cut) == 2 and len(answered) == 1
