"""The OpenAI chat-completions wire format, as vLLM and SGLang speak it (no I/O here).

Requests: the conversation so far, `tools`, `max_tokens`, temperature/top_p, a per-request seed
and `chat_template_kwargs` carrying the thinking mode (Kimi-K2.5's template reads `thinking`;
Qwen3-style templates `enable_thinking`; vLLM drops kwargs a template does not use).

Responses: one assistant message already split by the server's reasoning and tool-call parsers.
Engines differ in small ways, which `to_result` irons out into the canonical assistant message
of docs/design.md, 'Data formats': the reasoning arrives as `reasoning_content` (SGLang, older vLLM) or
`reasoning` (newer vLLM); a server started without a reasoning parser leaves `...</think>` in
the content; tool calls carry engine-specific extras (`index`); `content` may be null.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any, Optional

from eagle3.artifacts.records import unencodable_text
from eagle3.data.conversation import is_token_ids
from eagle3.generation.types import (
    ERROR_INVALID_UTF8,
    ERROR_UNKNOWN_FINISH,
    FINISH_LENGTH,
    FINISH_REASONS,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from eagle3.serving.http import openai_base

__all__ = [
    "RESERVED_BODY_FIELDS",
    "BadResponse",
    "build_body",
    "chat_url",
    "emitted_ids",
    "estimate_prompt_tokens",
    "is_context_error",
    "request_seed",
    "to_message",
    "to_result",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Finish reasons that mean the server gave up on the request (SGLang `abort`): worth a retry.
RETRYABLE_FINISH = ("abort", "error")
# How servers word "the prompt does not fit": vLLM "This model's maximum context length is N
# tokens", SGLang "The input (N tokens) is longer than the model's context length (M tokens)",
# OpenAI's code `context_length_exceeded`.
_CONTEXT_ERROR = re.compile(
    r"maximum context length|context length|context_length_exceeded|prompt is too long|too many tokens|"
    r"longer than the model", re.IGNORECASE)
#: Body fields `build_body` sets from the request and generate.*; generate.http.extra_body may not.
RESERVED_BODY_FIELDS = ("model", "messages", "tools", "max_tokens", "temperature", "top_p", "seed", "n", "stream",
                        "chat_template_kwargs", "return_token_ids")
#: Where a choice carries the ids the target emitted when asked with `return_token_ids`: vLLM's
#: `token_ids`, SGLang's `response_token_ids` (both answer the same request field).
EMITTED_IDS_FIELDS = ("token_ids", "response_token_ids")
# Per-message template overhead (role header, end-of-turn) in tokens, for the estimate.
_TOKENS_PER_MESSAGE = 8


class BadResponse(ValueError):
    """A 200 response that is not a chat completion (no choices, not JSON): retried."""


def chat_url(url: str) -> str:
    """`http://host:port` or `http://host:port/v1` -> the chat-completions endpoint."""
    return openai_base(url) + "/v1/chat/completions"


def request_seed(batch_seed: int, request_id: str) -> int:
    """Seed of one request: a pure function of the batch's seed and the request id.

    Servers seed each request separately; one seed for the whole batch would give every request
    the same stream of random numbers. 31 bits, which every engine's seed field accepts.
    """
    digest = hashlib.sha256(f"{batch_seed}\x1f{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**31 - 1)


def _text_chars(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False))


def estimate_prompt_tokens(request: GenerationRequest, chars_per_token: float) -> int:
    """Prompt tokens of a request, estimated from characters (no tokenizer needed).

    Counts message content, reasoning and tool calls of every message, the tool declarations,
    and a few tokens of template scaffolding per message. Used to pick a concurrency partition,
    where a rough, slightly high estimate is what is wanted.
    """
    chars = _text_chars(request.tools)
    for message in request.messages:
        chars += sum(_text_chars(message.get(k)) for k in ("content", "reasoning_content", "tool_calls"))
    return math.ceil(chars / chars_per_token) + _TOKENS_PER_MESSAGE * len(request.messages)


def build_body(request: GenerationRequest, params: SamplingParams, *, model: str,
               thinking_keys: Sequence[str] = ("thinking",),
               chat_template_kwargs: Optional[dict[str, Any]] = None,
               extra_body: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The JSON body of one chat-completions request.

    Args:
        request: The conversation so far (canonical messages), tools and thinking mode.
        params: Sampling of the batch; the request's seed is derived from `params.seed` and the id.
        model: Served model name.
        thinking_keys: Template kwargs that receive `request.thinking`.
        chat_template_kwargs: Further template kwargs (the thinking keys override them).
        extra_body: Further top-level fields (engine-specific, e.g. `skip_special_tokens`).
    """
    kwargs = dict(chat_template_kwargs or {})
    kwargs.update({key: bool(request.thinking) for key in thinking_keys})
    body: dict[str, Any] = dict(extra_body or {})
    body.update({
        "model": model,
        "messages": request.messages,
        "max_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "seed": request_seed(params.seed, request.id),
        "n": 1,
        "stream": False,
        "chat_template_kwargs": kwargs,
        # The ids behind the message: text re-encoded can split differently (docs/design.md, tokenize).
        "return_token_ids": True,
    })
    if request.tools:
        body["tools"] = request.tools
    return body


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(raw or []):
        if not isinstance(call, dict):
            raise BadResponse(f"tool call {i} is {type(call).__name__}, not an object")
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some servers send parsed JSON
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        calls.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                      "function": {"name": str(function.get("name") or ""), "arguments": arguments}})
    return calls


def to_message(raw: dict[str, Any], thinking: bool) -> dict[str, Any]:
    """The canonical assistant message of a server's `choices[0].message`.

    `reasoning_content` is present iff `thinking` (as the `hf` backend does): taken from
    `reasoning_content` or `reasoning`, or split off the content at `</think>` when the server
    has no reasoning parser. With thinking off, stray reasoning is kept as answer text.
    """
    content = raw.get("content") or ""
    if not isinstance(content, str):  # list-of-parts content: keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    reasoning = raw.get("reasoning_content")
    if reasoning is None:
        reasoning = raw.get("reasoning")
    if reasoning is None and thinking and THINK_CLOSE in content:
        reasoning, _, content = content.partition(THINK_CLOSE)
        reasoning = reasoning.removeprefix(THINK_OPEN)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["reasoning_content"] = reasoning or ""
    elif reasoning:
        message["content"] = reasoning + content
    calls = _tool_calls(raw.get("tool_calls"))
    if calls:
        message["tool_calls"] = calls
    return message


def emitted_ids(choice: dict[str, Any]) -> Optional[list[int]]:
    """The ids a choice says the target emitted, or None when the server does not send them.

    Raises:
        BadResponse: The field is there but not a list of non-negative integers.
    """
    for name in EMITTED_IDS_FIELDS:
        ids = choice.get(name)
        if ids is None:
            continue
        if not is_token_ids(ids):
            raise BadResponse(f"choices[0].{name} is not a list of token ids")
        return ids
    return None


def to_result(request: GenerationRequest, data: Any) -> GenerationResult:
    """A chat-completions response -> GenerationResult in canonical form.

    `length` wins over `tool_calls` (a cut tool-call section is not a complete call); a message
    with tool calls ends in `tool_calls` whatever the server says (some say `stop`). A finish
    reason that is missing or none of FINISH_REASONS says nothing about how the turn ended, so
    the result is `error=unknown_finish_reason` (the stage rejects the conversation), as is a
    message that cannot be written as UTF-8 (`\\ud800` escapes decode to lone surrogates):
    `invalid_utf8`.

    Raises:
        BadResponse: The body has no usable choice, or the server aborted the request.
    """
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        detail = data.get("message") or data.get("error") if isinstance(data, dict) else None
        raise BadResponse(f"no choices in the response{f': {detail}' if detail else ''}")
    choice = data["choices"][0]
    raw = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(raw, dict):
        raise BadResponse("choices[0] has no message")
    finish = choice.get("finish_reason")
    if isinstance(finish, dict):  # SGLang may send {"type": "length", ...}
        finish = finish.get("type")
    if finish in RETRYABLE_FINISH:
        raise BadResponse(f"the server ended the request with finish_reason={finish!r}")
    message = to_message(raw, request.thinking)
    usage = data.get("usage") or {}
    tokens: dict[str, Any] = {"completion_tokens": int(usage.get("completion_tokens") or 0),
                              "prompt_tokens": int(usage.get("prompt_tokens") or 0)}
    if finish not in FINISH_REASONS:
        return GenerationResult(id=request.id, error=ERROR_UNKNOWN_FINISH, error_detail=f"finish_reason={finish!r}",
                                **tokens)
    bad = unencodable_text(message)
    if bad is not None:
        return GenerationResult(id=request.id, error=ERROR_INVALID_UTF8,
                                error_detail=f"the message holds a lone surrogate at {bad}", **tokens)
    if finish != FINISH_LENGTH:  # a `tool_calls` finish without calls is a plain stop
        finish = FINISH_TOOL_CALLS if message.get("tool_calls") else FINISH_STOP
    return GenerationResult(id=request.id, message=message, finish_reason=finish, token_ids=emitted_ids(choice),
                            **tokens)


def is_context_error(status: int, text: str) -> bool:
    """Whether an HTTP error says the prompt (plus max_tokens) does not fit the context."""
    return status in (400, 413, 422) and bool(_CONTEXT_ERROR.search(text or ""))
