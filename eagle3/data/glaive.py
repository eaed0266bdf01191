"""Parsing glaive-function-calling-v2's plain-text transcripts into OpenAI messages.

The set stores tools and turns as text: ``system`` is ``SYSTEM: <prose> - {function JSON}
{function JSON}…`` and ``chat`` is ``USER: … ASSISTANT: <functioncall> {"name": …, "arguments":
'{…}'} <|endoftext|> FUNCTION RESPONSE: {…} ASSISTANT: … <|endoftext|>``. The function-call
payload is not JSON (arguments are wrapped in single quotes), so it is taken apart by hand.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eagle3.data.conversation import ConversationError, make_call_id

SYSTEM_PREFIX = "SYSTEM:"
END_OF_TEXT = "<|endoftext|>"
FUNCTION_CALL = "<functioncall>"
_MARKERS = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
_TURN = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_QUOTED_ARGS = re.compile(r'^\{\s*"name"\s*:\s*"(?P<name>[^"]+)"\s*,\s*"arguments"\s*:\s*\'(?P<args>.*)\'\s*\}$',
                          re.DOTALL)
_DECODER = json.JSONDecoder()


class GlaiveFormatError(ValueError):
    """The text does not follow the glaive transcript format."""


def _json_objects(text: str) -> tuple[str, list[dict]]:
    """Top-level JSON objects embedded in text, and the text without them."""
    objects, prose, i = [], [], 0
    while i < len(text):
        if text[i] == "{":
            try:
                obj, end = _DECODER.raw_decode(text, i)
            except ValueError:
                obj, end = None, i
            if isinstance(obj, dict):
                objects.append(obj)
                i = end
                continue
        prose.append(text[i])
        i += 1
    return "".join(prose), objects


def parse_system(system: str) -> tuple[str, list[dict]]:
    """``SYSTEM: prose {fn} {fn}`` -> (prose, OpenAI tool declarations).

    Raises:
        GlaiveFormatError: A function declaration without a name.
    """
    text = system.strip()
    if text.startswith(SYSTEM_PREFIX):
        text = text[len(SYSTEM_PREFIX):]
    prose, functions = _json_objects(text)
    tools = []
    for fn in functions:
        if not isinstance(fn.get("name"), str):
            raise GlaiveFormatError(f"function declaration without a name: {json.dumps(fn)[:120]}")
        tools.append({"type": "function", "function": fn})
    return prose.strip(), tools


def parse_call(payload: str, index: int) -> dict[str, Any]:
    """``{"name": "f", "arguments": '{…}'}`` (or real JSON) -> an OpenAI tool call.

    Raises:
        ConversationError: bad_tool_call when the payload or its arguments cannot be read.
    """
    payload = payload.strip()
    match = _QUOTED_ARGS.match(payload)
    if match:
        name, args = match["name"], match["args"]
    else:
        try:
            obj, _ = _DECODER.raw_decode(payload)
        except ValueError:
            raise ConversationError("bad_tool_call", f"unreadable <functioncall> payload: {payload[:120]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ConversationError("bad_tool_call", f"<functioncall> without a name: {payload[:120]!r}")
        name, args = obj["name"], obj.get("arguments", {})
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    try:
        json.loads(args)
    except ValueError:
        raise ConversationError("bad_tool_call", f"arguments of {name} are not JSON: {args[:120]!r}") from None
    return {"id": make_call_id(name, index), "type": "function", "function": {"name": name, "arguments": args}}


def parse_chat(chat: str) -> list[dict]:
    """The ``chat`` transcript -> messages; function responses answer the call before them.

    Raises:
        GlaiveFormatError: Text before the first turn marker, or no marker at all.
        ConversationError: bad_tool_call for an unreadable function call.
    """
    parts = _TURN.split(chat)
    if parts[0].strip() or len(parts) < 3:
        raise GlaiveFormatError(f"chat does not start with a USER:/ASSISTANT: marker: {chat[:80]!r}")
    messages: list[dict] = []
    last_call = None
    n_calls = 0
    for marker, text in zip(parts[1::2], parts[2::2], strict=True):
        role = _MARKERS[marker]
        text = text.strip()
        while text.endswith(END_OF_TEXT):
            text = text[: -len(END_OF_TEXT)].rstrip()
        if role == "assistant" and FUNCTION_CALL in text:
            before, _, payload = text.partition(FUNCTION_CALL)
            last_call = parse_call(payload, n_calls)
            n_calls += 1
            messages.append({"role": "assistant", "content": before.strip(), "tool_calls": [last_call]})
        elif role == "tool":
            msg = {"role": "tool", "content": text}
            if last_call is not None:
                msg.update(tool_call_id=last_call["id"], name=last_call["function"]["name"])
            messages.append(msg)
        else:
            messages.append({"role": role, "content": text})
    return messages
