"""Kimi-K2.5 chat-format constants and the assistant-turn codec.

The published chat template renders a conversation's final answer as history, with its
reasoning dropped (``<think></think>``). Training a target that *thinks* and sampling responses
both need the other direction: the generation prompt ends with ``<think>``, and the model writes
``{reasoning}</think>{content}[tool calls]<|im_end|>``. :func:`assistant_tail` writes that
continuation exactly as the template's suffix branch would, and :func:`parse_kimi_assistant`
reads it back into an OpenAI-style message, so sampled turns can be fed to the template again.
"""

from __future__ import annotations

import json
import re
from typing import Any

BOS, EOS, PAD = "[BOS]", "[EOS]", "[PAD]"
IM_END, IM_USER, IM_ASSISTANT = "<|im_end|>", "<|im_user|>", "<|im_assistant|>"
IM_SYSTEM, IM_MIDDLE = "<|im_system|>", "<|im_middle|>"
TOOL_CALLS_BEGIN, TOOL_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN, TOOL_CALL_ARG, TOOL_CALL_END = (
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Tokens that frame turns: decoding with skip_special_tokens drops them.
SPECIAL_TOKENS = (BOS, EOS, IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE,
                  *MEDIA_TOKENS, PAD)
# Tokens whose text reasoning / tool-call parsers read back: they must survive skip_special_tokens.
TEXT_CONTROL_TOKENS = (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_ARG,
                       TOOL_CALL_END, THINK_OPEN, THINK_CLOSE)
ALL_KIMI_TOKENS = SPECIAL_TOKENS + TEXT_CONTROL_TOKENS

ASSISTANT_HEADER = f"{IM_ASSISTANT}assistant{IM_MIDDLE}"
GENERATION_PROMPT = ASSISTANT_HEADER + THINK_OPEN

_TOOL_CALL_RE = re.compile(
    re.escape(TOOL_CALL_BEGIN) + r"(.*?)" + re.escape(TOOL_CALL_ARG) + r"(.*?)"
    + re.escape(TOOL_CALL_END), re.DOTALL)


def render_tool_calls(tool_calls: list[dict]) -> str:
    """The template's ``render_toolcalls`` macro, for string or dict arguments."""
    parts = [TOOL_CALLS_BEGIN]
    for call in tool_calls:
        args = call["function"]["arguments"]
        if not isinstance(args, str):
            # Jinja's tojson as transformers configures it: ensure_ascii=False, default separators.
            args = json.dumps(args, ensure_ascii=False)
        parts.append(f"{TOOL_CALL_BEGIN}{call['id']}{TOOL_CALL_ARG}{args}{TOOL_CALL_END}")
    parts.append(TOOL_CALLS_END)
    return "".join(parts)


def assistant_tail(message: dict) -> str:
    """What follows the generation prompt for ``message`` (reasoning kept, as in the suffix)."""
    text = f"{message.get('reasoning_content') or ''}{THINK_CLOSE}{message.get('content') or ''}"
    if message.get("tool_calls"):
        text += render_tool_calls(message["tool_calls"])
    return text + IM_END


_KIMI_CALL_ID_RE = re.compile(r"functions\.(?P<name>.+):(?P<index>\d+)")


def kimi_call_id(name: str, index: int) -> str:
    """Kimi's tool-call id, ``functions.{name}:{index}``; the index counts the conversation's calls from 0."""
    return f"functions.{name}:{index}"


def with_kimi_call_ids(conv: dict) -> dict:
    """`conv` with every tool-call id in Kimi's own form, and each tool result's `tool_call_id` to match.

    Kimi-K2.5 writes its calls as ``functions.{name}:{index}``, and the template renders an id verbatim
    (``<|tool_call_begin|>{id}``, ``## Return of {id}``). Datasets in OpenAI form carry ids such as
    ``call_1`` or ``call_59adf...``: trained on as they are, the function name vanishes from the text
    and the draft learns ids the target never emits. An id already of the form, naming its own
    function, is kept; any other becomes ``functions.{name}:{index}`` with the call's place among the
    conversation's calls. Ids repeat across turns in some datasets (every turn's first call is
    ``call_1``), so a tool result is matched to the calls of the assistant turn before it.
    """
    messages = conv.get("messages")
    if not isinstance(messages, list) or not any(isinstance(m, dict) and m.get("tool_calls") for m in messages):
        return conv
    out: list[Any] = []
    renamed: dict[Any, str] = {}  # a call's id in the data -> its Kimi id, for the tool results that follow
    index = 0
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        if message.get("role") == "assistant":
            renamed = {}
            calls = []
            for call in message.get("tool_calls") or []:
                name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
                old = call.get("id") if isinstance(call, dict) else None
                match = _KIMI_CALL_ID_RE.fullmatch(old) if isinstance(old, str) else None
                if isinstance(name, str) and not (match and match["name"] == name):
                    renamed[old] = kimi_call_id(name, index)
                    call = {**call, "id": renamed[old]}
                calls.append(call)
                index += 1
            if calls:
                message = {**message, "tool_calls": calls}
        elif message.get("role") == "tool" and message.get("tool_call_id") in renamed:
            message = {**message, "tool_call_id": renamed[message["tool_call_id"]]}
        out.append(message)
    return {**conv, "messages": out}


def renders_kimi_tool_calls(template: Any) -> bool:
    """Whether a chat template renders tool calls as Kimi's (`<|tool_call_begin|>{id}...`), ids verbatim.

    Told from the template text, not the tokenizer's vocabulary: a tokenizer may carry Kimi's
    tokens under another template, and a Kimi-derived checkpoint under any name renders them.
    """
    return isinstance(template, str) and TOOL_CALL_BEGIN in template and TOOL_CALL_ARG in template


def _call_name(call_id: str) -> str:
    """``functions.read_file:0`` -> ``read_file`` (Kimi's id scheme carries the name)."""
    name = call_id.strip()
    if name.startswith("functions."):
        name = name[len("functions."):]
    return name.rsplit(":", 1)[0] if ":" in name else name


def parse_kimi_assistant(text: str) -> dict:
    """Invert :func:`assistant_tail`: one generated assistant turn -> an OpenAI-style message.

    Accepts text with or without the ``<|im_assistant|>assistant<|im_middle|>`` header and the
    opening ``<think>`` (generation starts after them), and with or without the closing
    ``<|im_end|>`` (a truncated generation). Text without ``</think>`` is treated as reasoning cut
    short, because the model was prompted inside the think block.

    Returns:
        ``{"role": "assistant", "content", "reasoning_content"}`` plus ``"tool_calls"`` when the
        turn has a tool-call section (arguments kept as the raw JSON string, as OpenAI sends them).
    """
    body = text
    if body.startswith(ASSISTANT_HEADER):
        body = body[len(ASSISTANT_HEADER):]
    if body.startswith(THINK_OPEN):
        body = body[len(THINK_OPEN):]
    end = body.find(IM_END)
    if end >= 0:
        body = body[:end]
    reasoning, sep, rest = body.partition(THINK_CLOSE)
    if not sep:
        reasoning, rest = body, ""
    content, tool_calls = rest, []
    start = rest.find(TOOL_CALLS_BEGIN)
    if start >= 0:
        content = rest[:start]
        section = rest[start + len(TOOL_CALLS_BEGIN):]
        section = section.split(TOOL_CALLS_END, 1)[0]
        for call_id, args in _TOOL_CALL_RE.findall(section):
            tool_calls.append({"id": call_id.strip(), "type": "function",
                               "function": {"name": _call_name(call_id), "arguments": args}})
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
