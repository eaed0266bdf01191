"""The generation-backend interface and its types: what stage `generate` asks of a target.

A leaf module (it imports only `eagle3.errors`, and the config schema for typing): backends, the
regeneration loop and the stage all speak these types, and `eagle3.generation.factory` maps
`generate.backend` names to implementations.


The stage speaks in chat messages, not tokens, because that is what every serving engine speaks:
an OpenAI-compatible server (vLLM, SGLang) takes `messages` + `tools` + chat-template kwargs and
returns one assistant message already split by its reasoning and tool-call parsers, a finish
reason and token usage. The in-process `hf` backend does the same work itself (render with the
tokenizer's own template, generate, parse the Kimi format), so the stage cannot tell them apart;
the HTTP client (`http_backend.HTTPBackend`) plugs in behind the same protocol. Each backend
builds itself from the typed config (`from_config(cfg, urls)`).

Determinism is part of the contract: a backend given the same requests in the same order with the
same `SamplingParams.seed` returns the same results. The stage derives that seed from the batch's
conversation ids, which is what makes a killed and resumed run equal an uninterrupted one. A
backend whose answer to one request depends on that request and the seed alone, not on the rest
of the batch (`independent_requests`, the HTTP backend: each request is seeded on its own), lets
a rerun send only the conversations still missing; the others re-run whole batches.

Failures come in two kinds. A request that failed after all its retries (the server was down,
`ERROR_REQUEST_FAILED`) says nothing about its conversation: it is left undone for a rerun, never
rejected (`RETRYABLE_REJECT_REASONS`). A server that answered with something unusable (an unknown
finish reason, bytes that are not UTF-8) is not down: that conversation is rejected with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

from eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    from eagle3.config.schema import Eagle3Config

__all__ = [
    "ERROR_INVALID_UTF8",
    "ERROR_PROMPT_TOO_LONG",
    "ERROR_REQUEST_FAILED",
    "ERROR_UNKNOWN_FINISH",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "FINISH_TOOL_CALLS",
    "BackendUnavailable",
    "FINISH_REASONS",
    "GenerationBackend",
    "GenerationIncomplete",
    "GenerationRequest",
    "GenerationResult",
    "RETRYABLE_REJECT_REASONS",
    "SamplingParams",
]

#: OpenAI finish reasons: the turn ended with the end-of-turn token / hit max_new_tokens / called tools.
FINISH_STOP, FINISH_LENGTH, FINISH_TOOL_CALLS = "stop", "length", "tool_calls"
FINISH_REASONS = (FINISH_STOP, FINISH_LENGTH, FINISH_TOOL_CALLS)
#: `GenerationResult.error` values: the prompt does not fit the model's context (the stage keeps
#: the turns answered so far) / the request failed after all its retries (the conversation is
#: left undone for a rerun).
ERROR_PROMPT_TOO_LONG, ERROR_REQUEST_FAILED = "prompt_too_long", "request_failed"
#: `GenerationResult.error` values of an answer that cannot become training text (the stage
#: rejects the conversation with this reason): the server's finish reason is none of
#: FINISH_REASONS (or missing) / its reply is not valid UTF-8 (decoding would put U+FFFD into text).
ERROR_UNKNOWN_FINISH, ERROR_INVALID_UTF8 = "unknown_finish_reason", "invalid_utf8"
#: Reject reasons that mean "the server failed", not "the conversation is bad": never written by
#: this version, and an output of an earlier one that holds them treats those ids as not done
#: (resume retries them, reuse does not copy them).
RETRYABLE_REJECT_REASONS = frozenset({ERROR_REQUEST_FAILED})


class BackendUnavailable(Eagle3Error):
    """The configured backend cannot generate (yet); the message says what to use instead."""


class GenerationIncomplete(BackendUnavailable):
    """Some conversations of a unit failed after all retries; the unit stays running for a rerun."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of requests.

    Attributes:
        max_new_tokens: Completion budget per request (OpenAI `max_tokens`).
        temperature: 0 means greedy decoding.
        top_p: Nucleus mass (1.0 = off). Top-k is always off, as in the engines' defaults.
        seed: Seed of the batch's sampler; equal seeds and requests give equal results.
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    """One chat completion: the conversation so far, to be answered by the next assistant turn.

    Attributes:
        id: Caller's id for the request (conversation id and turn), echoed in the result.
        messages: Canonical OpenAI-style messages (system/user/assistant/tool).
        tools: OpenAI tool declarations, or None.
        thinking: Chat-template kwarg `thinking` (Kimi: open `<think>` vs. empty think block).
    """

    id: str
    messages: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]] = None
    thinking: bool = True


@dataclass(frozen=True)
class GenerationResult:
    """One generated assistant turn in canonical form.

    Attributes:
        id: The request's id.
        message: `{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}`;
            `reasoning_content` is present iff the request had thinking on.
        finish_reason: `stop`, `length` or `tool_calls` (OpenAI semantics); `length` wins over
            `tool_calls`, since a cut tool-call section is not a complete call.
        completion_tokens: Generated tokens, the end-of-turn token included.
        prompt_tokens: Tokens of the rendered prompt.
        error: Why the request has no usable answer (`prompt_too_long`, `request_failed`,
            `unknown_finish_reason`, `invalid_utf8`), else None; then `message` is empty and
            the token counts are what was known.
        text: The raw completion with control tokens, when the backend has it (debugging).
        error_detail: One line on the error (last HTTP status or exception, attempts), or None.
        token_ids: The ids the target emitted for this turn, end-of-turn token included, when the
            backend knows them (the hf backend's own, vLLM's `return_token_ids`, SGLang's
            `response_token_ids`); None from a server that does not say. Stage tokenize trains
            on these rather than on a re-encoding of `message`, which can split text otherwise.
    """

    id: str
    message: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = FINISH_STOP
    completion_tokens: int = 0
    prompt_tokens: int = 0
    error: Optional[str] = None
    text: Optional[str] = None
    error_detail: Optional[str] = None
    token_ids: Optional[list[int]] = None


@runtime_checkable
class GenerationBackend(Protocol):
    """A target that answers chat requests in batches (in-process or behind an HTTP server).

    Attributes:
        name: The `generate.backend` name.
        independent_requests: Whether a request's result depends only on the request and
            `SamplingParams.seed`, not on the other requests of the call. True lets a rerun
            send only the missing conversations of a batch (keeping the batch's seed); a
            backend that samples a batch jointly (`hf`) says False, and its batches re-run whole.
            Read with getattr(..., False): a backend that does not say is treated as joint.
    """

    name: str
    independent_requests: bool

    @classmethod
    def from_config(cls, cfg: Eagle3Config, urls: Optional[Sequence[str]] = None) -> GenerationBackend:
        """The backend for a config (nothing loaded or connected yet).

        Args:
            cfg: The config (`generate.backend`, `generate.server`, `generate.http`, `model`).
            urls: Base URLs of running servers, for the HTTP backends (None = `generate.server.urls`).
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Plain data naming the backend and model, for the stage manifest."""
        ...

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Answer every request (results in request order); must be deterministic in `params.seed`."""
        ...

    def close(self) -> None:
        """Release the model or the server connection."""
        ...
