"""Whether a vLLM or SGLang server answers: the health paths each engine serves (`eagle3.engines.HEALTH_PATHS`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

from eagle3.engines import HEALTH_PATHS
from eagle3.serving.exits import ServerError
from eagle3.serving.http import HTTPFailure, request_sync


def probe_health(url: str, paths: Sequence[str], timeout: float = 2.0) -> Optional[str]:
    """The first of `paths` under `url` that answers 200, or None."""
    for path in paths:
        try:
            if request_sync("GET", url.rstrip("/") + path, timeout=timeout).status == 200:
                return path
        except (HTTPFailure, ValueError):  # ValueError: not a URL aiohttp can send to
            continue
    return None


def check_health(urls: Sequence[str], backend: str, timeout_s: float = 10.0, poll_s: float = 0.5) -> list[str]:
    """Wait up to `timeout_s` for every URL to be healthy; the URLs (no trailing slash).

    Raises:
        ServerError: Naming every URL that never answered, in one line.
    """
    paths = HEALTH_PATHS[backend]
    pending = [str(u).rstrip("/") for u in urls]
    deadline = time.monotonic() + timeout_s
    while True:
        pending = [u for u in pending if probe_health(u, paths) is None]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if pending:
        raise ServerError(f"server.urls: {', '.join(pending)} -- no {backend} server answered "
                          f"{' or '.join(paths)} with 200 within {timeout_s:g} s; start it, or drop "
                          "server.urls to let eagle3 launch one")
    return [str(u).rstrip("/") for u in urls]
