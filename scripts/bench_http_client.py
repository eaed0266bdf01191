#!/usr/bin/env python
"""The HTTP generation client's own ceiling: requests/s against trivial local endpoints.

A real target answers a handful of requests per second (Kimi-K2.5 at concurrency ~200 with
answers of ~1K tokens); this shows the client (`eagle3.generation.http_backend`) is not what
limits generation. Trivial OpenAI-compatible servers (`tests/mock_openai_server.py --trivial`, one fixed
completion, no model) run as separate processes on 127.0.0.1; the client sends `--requests`
chat requests through its usual path (partition slot, endpoint choice, JSON body, retries
armed, response parsed into a canonical message) at `--concurrency`, and prints one markdown
row. `client CPU us/req` is the client process's CPU time per request: 1e6 / it is the
requests/s one core could drive if the servers were infinitely fast (on a small machine the
mock servers share the cores, so the wall-clock figure is a lower bound).

    python scripts/bench_http_client.py --requests 5000 --concurrency 200 --servers 1
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from eagle3.config.client_schema import GenerateHTTPConfig, GeneratePartitionConfig
from eagle3.generation.http_backend import HTTPBackend
from eagle3.generation.types import GenerationRequest, SamplingParams

REPO = Path(__file__).resolve().parent.parent  # the mock server is tests/mock_openai_server.py


def start_servers(n: int) -> tuple[list[subprocess.Popen], list[str]]:
    """`n` trivial mock servers in their own processes; returns them and their URLs."""
    procs, urls = [], []
    for _ in range(n):
        proc = subprocess.Popen([sys.executable, "-m", "tests.mock_openai_server", "--trivial"], cwd=REPO,
                                stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        assert proc.stdout is not None
        urls.append(proc.stdout.readline().strip())
        procs.append(proc)
    return procs, urls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--servers", type=int, default=1, help="trivial server processes (endpoints)")
    parser.add_argument("--prompt-chars", type=int, default=2000, help="characters of each request's prompt")
    args = parser.parse_args(argv)

    procs, urls = start_servers(args.servers)
    try:
        http = dataclasses.replace(GenerateHTTPConfig(), partitions=[GeneratePartitionConfig(None, args.concurrency)],
                                   request_timeout_s=60.0, connect_wait_s=30.0)
        backend = HTTPBackend(urls, http)
        text = ("How do I read a file line by line in Python? " * (args.prompt_chars // 45 + 1))[: args.prompt_chars]
        params = SamplingParams(max_new_tokens=256, temperature=0.6, top_p=0.95, seed=0)

        def batch(n: int, tag: str) -> list[GenerationRequest]:
            return [GenerationRequest(id=f"{tag}{i}:0", messages=[{"role": "user", "content": f"{i} {text}"}])
                    for i in range(n)]

        backend.generate(batch(min(500, args.requests), "warm"), params)  # connections, caches
        requests = batch(args.requests, "r")
        cpu0, t0 = time.process_time(), time.perf_counter()
        results = backend.generate(requests, params)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        failed = sum(r.error is not None for r in results)
        backend.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    print("| client | servers | concurrency | requests | prompt chars | failed | wall s | req/s | client CPU us/req |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| aiohttp HTTPBackend | {args.servers} trivial | {args.concurrency} | {args.requests} "
          f"| {args.prompt_chars} | {failed} | {wall:.2f} | {args.requests / wall:.0f} "
          f"| {1e6 * cpu / args.requests:.0f} |")


if __name__ == "__main__":
    main()
