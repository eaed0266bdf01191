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
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
