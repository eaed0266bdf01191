"""A server eagle3 launched that exits while a stage uses it: named in one line, and found by URL.

`eagle3.serving.process.ServerProcess` knows its server's engine, pid, exit code, log file and
last log lines. This module turns those into the one line a stage stops with (`exited_error`):
the exit code (a signal by name), the error line of the log that says why -- the final line of
the server's last Python traceback, like `RuntimeError: CPU Generator does not use offset`,
passing over a wrapper that only points "above" at it -- the pid and the log's path.

It also keeps the servers this process launched, by URL (`register`, done by ServerProcess), so
that a client whose requests fail asks `dead_server(urls)` and tells "the server eagle3 launched
has died" (stop now, and say why) from "an endpoint does not answer" (retry), without the stage
that launched the server handing it down. A server stopped by eagle3 itself is unregistered
first: its exit is not a death. Servers given by `server.urls` are never here.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterable
from typing import Any, Optional, Protocol

from eagle3.errors import Eagle3Error

__all__ = ["DYING_S", "KNOWN_CAUSES", "TAIL_IN_ERRORS", "ServerError", "ServerExited", "advice", "dead_server",
           "error_line", "exit_text", "exited_error", "names", "register", "tail_text", "unregister"]

TAIL_IN_ERRORS = 8  # log lines quoted in a one-line error
# How long a server whose stage failed gets to finish dying before it is stopped: vLLM's API server
# answers HTTP 500 for a moment after its engine died (a client may give up then), and exits after.
DYING_S = 5.0
_MAX_LINE_CHARS = 240
# vLLM prefixes its log lines with the process and a level, time and source (`(EngineCore_DP0 pid=7) ERROR
# 12-02 04:10:11 [core.py:844] `), SGLang and plain logging with a time and a level: dropped before matching.
_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:\[?\d{4}-\d\d-\d\d[ T][\d:.,]+\]?\s+)?"
                     r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?:\d\d-\d\d\s+[\d:.]+\s+)?(?:\[[^\]]*\]\s*)?)?")
# The final line of a traceback: `[module.]NameError|Exception|...[: message]`.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?=[A-Za-z_])\w*(?:Error|Exception|Failure|Interrupt)(?::\s.*)?$")
_LOGGED_ERROR = re.compile(r"(?:^|[\s\]])(?:ERROR|CRITICAL|FATAL)\b")
# A wrapper that only points at the real cause (vLLM's EngineDeadError: "See stack trace (above) ...").
_POINTER = re.compile(r"\babove\b|root cause", re.IGNORECASE)


#: Engine errors whose own words do not say what would work: (text of the error line, the advice).
KNOWN_CAUSES = (
    ("Model does not support EAGLE3 interface",  # vLLM 0.32's gpu_model_runner / eagle3_utils
     "this vLLM cannot capture the hidden states EAGLE-3 reads for the target's architecture (its model class "
     "does not implement SupportsEagle3, and eagle3's vLLM plugin, eagle3/serving/vllm_plugin, adds it for Gemma 3 "
     "only), so it can neither serve an EAGLE-3 draft for it nor extract its states: use extract.backend=hf and "
     "stage=eval's in-process speculative decoding"),
)


def advice(why: Optional[str]) -> Optional[str]:
    """What would work, for an error line `KNOWN_CAUSES` knows; else None."""
    return next((hint for text, hint in KNOWN_CAUSES if why and text in why), None)


class ServerError(Eagle3Error):
    """A server that did not start, became unhealthy or exited; one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split("\n")))


class ServerExited(ServerError):
    """A launched server exited on its own; `backend`, `pid`, `code`, `log_path` and `error` say which and why."""

    def __init__(self, message: str, *, backend: str, pid: Optional[int], code: Optional[int], log_path: str,
                 error: Optional[str]) -> None:
        super().__init__(message)
        self.backend, self.pid, self.code, self.log_path, self.error = backend, pid, code, log_path, error


def exit_text(code: Optional[int]) -> str:
    """`-9 (SIGKILL)` for a death by signal (Popen's negative code), else the code itself."""
    if code is not None and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _MAX_LINE_CHARS else line[:_MAX_LINE_CHARS] + "..."


def error_line(lines: Iterable[str]) -> Optional[str]:
    """The log line that best says why a server died, or None when none says anything.

    The last exception line (a traceback's final line) that is not a wrapper pointing "above" at
    another one; failing that the last exception line at all, then the last line logged at level
    ERROR/CRITICAL (an HTTP access line saying `500 Internal Server Error` is not one). Log
    prefixes are dropped.
    """
    found: list[str] = []
    fallback: Optional[str] = None
    for raw in lines:
        if not raw.strip() or raw.startswith("# eagle3"):
            continue
        text = _PREFIX.sub("", raw.strip())
        if _EXCEPTION.match(text):
            found.append(text)
        elif _LOGGED_ERROR.search(raw) and text and not text.startswith("Traceback"):
            fallback = text
    direct = [line for line in found if not _POINTER.search(line)]
    best = direct[-1] if direct else found[-1] if found else fallback
    return _clip(best) if best else None


def tail_text(lines: list[str], n: int = TAIL_IN_ERRORS) -> str:
    """The last `n` non-empty `lines`, each clipped, on one line."""
    shown = [_clip(line) for line in lines if line.strip()][-n:]
    return " | ".join(shown) if shown else "(no output)"


def exited_error(backend: str, pid: Optional[int], code: Optional[int], when: str, log_path: Any,
                 lines: list[str]) -> ServerExited:
    """The one line for a server that exited: engine, exit code, when, log, pid, why, its last log lines.

    Args:
        lines: The last lines the server wrote (the error line is looked for in all of them).
    """
    why = error_line(lines)
    hint = advice(why)
    return ServerExited(f"{backend} server exited with code {exit_text(code)} {when} (log: {log_path}): pid {pid}, "
                        f"{why or 'no error in its log'}{f' -- {hint}' if hint else ''}; last lines: "
                        f"{tail_text(lines)}",
                        backend=backend, pid=pid, code=code, log_path=str(log_path), error=why)


class _Launched(Protocol):
    def died(self, when: str) -> Optional[ServerExited]: ...


_LOCK = threading.Lock()
_LAUNCHED: dict[str, _Launched] = {}


def _key(url: str) -> str:
    url = str(url).rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def register(url: str, server: _Launched) -> None:
    """`server` (a running ServerProcess) serves `url` until `unregister`."""
    with _LOCK:
        _LAUNCHED[_key(url)] = server


def unregister(url: str, server: _Launched) -> None:
    """Forget `server` (before eagle3 stops it: an exit it caused is not a death)."""
    with _LOCK:
        if _LAUNCHED.get(_key(url)) is server:
            del _LAUNCHED[_key(url)]


def dead_server(urls: Iterable[str], when: str) -> Optional[ServerExited]:
    """The error naming a server eagle3 launched at one of `urls` that has exited since, else None.

    Args:
        when: How the line says when it died, e.g. "while generate's requests were in flight".
    """
    with _LOCK:
        servers = [_LAUNCHED.get(_key(u)) for u in urls]
    for server in servers:
        died = server.died(when) if server is not None else None
        if died is not None:
            return died
    return None


def names(exc: Optional[BaseException], pid: Optional[int]) -> bool:
    """Whether `exc` or an exception it was raised from already names the death of server `pid`.

    That is a ServerExited, or an error of a client that stopped on one and quotes it: the client
    sets its `server_exited` attribute to the ServerExited (a chain may be cut by `raise ... from None`).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        named = exc if isinstance(exc, ServerExited) else getattr(exc, "server_exited", None)
        if isinstance(named, ServerExited) and named.pid == pid:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
