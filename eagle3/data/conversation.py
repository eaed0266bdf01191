"""The canonical conversation (docs/design.md, 'Data formats') and the checks every data stage shares.

A canonical record is ``{"id", "source", "track", "messages", "tools"?, "meta"}`` with
OpenAI-style messages ``{"role": "system|user|assistant|tool", "content", "reasoning_content"?,
"tool_calls"?, "tool_call_id"?, "name"?}`` and tool calls ``{"id", "type": "function",
"function": {"name", "arguments": <JSON string>}}``.

Checks return a short machine-readable *reason* (the key of a reject count) plus a detail for a
human, instead of raising, because a data stage must reject one bad record and keep going. The
rules are the ones a chat template and a loss mask depend on: known roles, string content, a
user turn before the first answer, an answered last turn, and tool results that answer a call.
Content is never rewritten here (target-native text must reach the tokenizer byte for byte);
the helpers only move fields (``<think>`` to ``reasoning_content``) or build missing ids.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable
from typing import Any, Optional

from eagle3.chat_formats.kimi import kimi_call_id

ROLES = ("system", "user", "assistant", "tool")
TRACK_PROMPT_ONLY = "prompt_only"
TRACK_TARGET_NATIVE = "target_native"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
#: Key of a regenerated record's `meta.generation.turns[k]` holding the ids the target emitted for
#: its k-th assistant message, when the backend knew them (stage generate writes it, stage
#: tokenize trains on it: text decoded and re-encoded can come back as other ids).
EMITTED_IDS_KEY = "token_ids"


def is_token_ids(value: Any, vocab: Optional[int] = None) -> bool:
    """Whether `value` is a list of token ids (non-negative ints, not bools; below `vocab` when given):
    the one check of emitted ids, where a server sends them and where tokenize reads them back."""
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 and (vocab is None or i < vocab) for i in value)

Problem = tuple[str, str]  # (reason, detail)


class ConversationError(ValueError):
    """A record cannot become a valid conversation; `reason` is the reject-count key."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# ----------------------------------------------------------------------------- helpers
def split_think(text: str) -> tuple[Optional[str], str]:
    """Split ``<think>reasoning</think>answer`` into (reasoning, answer).

    Only a think block that *opens* the text counts (R1/Nemotron style); a ``<think>`` quoted in
    the middle of an answer is content. Reasoning is stripped, the answer loses the whitespace
    the template would put back between ``</think>`` and the answer. Empty reasoning (thinking
    off) gives None.
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN) or THINK_CLOSE not in stripped:
        return None, text
    reasoning, _, answer = stripped[len(THINK_OPEN):].partition(THINK_CLOSE)
    return (reasoning.strip() or None), answer.lstrip()


def join_text_parts(content: Any) -> Any:
    """OpenAI multi-part content made only of text parts -> one string; anything else as is.

    Other shapes (images, numbers, dicts) are left for :func:`conversation_problem` to report
    as ``non_string_content``.
    """
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return content


def make_call_id(name: str, index: int) -> str:
    """The id of a call a dataset gave none: Kimi's form, ``functions.{name}:{index}`` (index counts calls per
    conversation), which names the function (tokenize writes every id in it for Kimi-format targets)."""
    return kimi_call_id(name, index)


def normalize_tool_call(call: Any, index: int) -> dict[str, Any]:
    """One tool call in any common shape -> the canonical OpenAI form.

    Accepts ``{"id"?, "type"?, "function": {"name", "arguments"}}`` or the flat
    ``{"name", "arguments"}``. Arguments given as an object are serialised to a JSON string;
    a string is kept as written, byte for byte (the conversation check refuses one that is not a
    JSON object: ``bad_tool_arguments``). Given ids are kept; missing ones become
    ``functions.{name}:{index}``.

    Raises:
        ConversationError: ``bad_tool_call`` when there is no usable name or arguments.
    """
    if not isinstance(call, dict):
        raise ConversationError("bad_tool_call", f"tool call {index} is a {type(call).__name__}, not an object")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
        raise ConversationError("bad_tool_call", f"tool call {index} has no function name")
    args = fn.get("arguments", {})
    if not isinstance(args, str):
        try:
            args = json.dumps(args, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ConversationError("bad_tool_call", f"tool call {index} arguments: {exc}") from None
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id.strip():
        call_id = make_call_id(fn["name"], index)
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def normalize_text(text: str) -> str:
    """NFKC, casefold and collapsed whitespace: the form two "same" prompts share."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def prompt_key(messages: Iterable[dict]) -> str:
    """The dedupe key of a conversation: all its user turns, normalised, in order."""
    return "\x1f".join(normalize_text(m["content"]) for m in messages if m.get("role") == "user")


def prompt_hash(messages: Iterable[dict]) -> int:
    """64-bit hash of :func:`prompt_key` (compact enough to keep one per record of a 5M set)."""
    return int.from_bytes(hashlib.sha256(prompt_key(messages).encode("utf-8")).digest()[:8], "big")


def count_role(messages: Iterable[dict], role: str) -> int:
    """Number of messages with this role."""
    return sum(1 for m in messages if m.get("role") == role)


def text_chars(messages: Iterable[dict]) -> int:
    """Characters of all message text: content, reasoning and tool-call arguments."""
    total = 0
    for m in messages:
        total += len(m.get("content") or "") + len(m.get("reasoning_content") or "")
        for call in m.get("tool_calls") or []:
            total += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return total


def prompt_only_messages(messages: list[dict]) -> tuple[list[dict], int, int]:
    """The prompt-only view: system and user turns kept, foreign answers and tool results dropped.

    The generate stage regenerates every assistant turn (and re-runs its tools), so the old
    answers and the tool results that answered them must not survive as context.

    Returns:
        (kept messages, assistant turns dropped, tool results dropped).
    """
    kept = [m for m in messages if m.get("role") in ("system", "user")]
    return kept, count_role(messages, "assistant"), count_role(messages, "tool")


# ----------------------------------------------------------------------------- checks
def _message_problem(i: int, m: Any) -> Optional[Problem]:
    if not isinstance(m, dict):
        return "bad_message", f"message {i} is a {type(m).__name__}, not an object"
    role = m.get("role")
    if role is None or role == "":
        return "missing_role", f"message {i} has no role (keys: {sorted(m)})"
    if role not in ROLES:
        return "unknown_role", f"message {i}: role {role!r}; valid: {', '.join(ROLES)}"
    for key in ("content", "reasoning_content"):
        value = m.get(key)
        if value is not None and not isinstance(value, str):
            return "non_string_content", f"message {i} ({role}): {key} is a {type(value).__name__}"
    content, reasoning, calls = m.get("content") or "", m.get("reasoning_content") or "", m.get("tool_calls")
    if calls is not None and role != "assistant":
        return "bad_tool_call", f"message {i}: a {role} message cannot carry tool_calls"
    if role == "assistant":
        if not (content.strip() or reasoning.strip() or calls):
            return "empty_content", f"message {i} (assistant) has no content, reasoning or tool calls"
    elif not content.strip():
        return "empty_content", f"message {i} ({role}) has empty content"
    if calls is not None:
        if not isinstance(calls, list) or not calls:
            return "bad_tool_call", f"message {i}: tool_calls must be a non-empty list"
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not (isinstance(fn, dict) and call.get("type") == "function" and isinstance(call.get("id"), str)
                    and call["id"] and isinstance(fn.get("name"), str) and fn["name"]
                    and isinstance(fn.get("arguments"), str)):
                return "bad_tool_call", (f"message {i}, call {j}: need {{id, type: function, function: "
                                         f"{{name, arguments: str}}}}, got {json.dumps(call, default=str)[:200]}")
            problem = _arguments_problem(fn["arguments"])
            if problem:
                return "bad_tool_arguments", f"message {i}, call {j} ({fn['name']}): arguments {problem}"
    return None


def _arguments_problem(arguments: str) -> Optional[str]:
    """Why a call's arguments are not a JSON object, else None.

    A serving engine's tool parser reads them with a JSON parser and the client executes them, so a
    call whose arguments do not parse is one the target's deployment would have failed: training the
    draft to write it would teach broken calls (a truncated scrape, a quoting bug in the exporter).
    """
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return f"are not valid JSON ({exc}): {arguments[:80]!r}"
    if not isinstance(value, dict):
        return f"are JSON {type(value).__name__}, not an object: {arguments[:80]!r}"
    return None


def _order_problem(messages: list[dict]) -> Optional[Problem]:
    """Turn order for a full conversation: user first, tool results answer calls, answered end."""
    open_calls: set[str] = set()
    seen_user = False
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "user":
            seen_user = True
        elif role == "assistant" and not seen_user:
            return "assistant_first", f"message {i} answers before any user turn"
        elif role == "tool":
            if not seen_user or m.get("tool_call_id") not in open_calls:
                return "bad_tool_call", (f"message {i}: tool result for {m.get('tool_call_id')!r} does not "
                                         f"answer a call of the assistant turn before it (open: {sorted(open_calls)})")
            continue
        open_calls = {c["id"] for c in m.get("tool_calls") or []}
    if not seen_user:
        return "too_few_turns", "no user message"
    last = messages[-1]["role"]
    if last in ("user", "tool", "system"):
        return f"{last}_last", f"the last message is a {last} turn with no answer"
    return None


def conversation_problem(conv: Any) -> Optional[Problem]:
    """Why a conversation is unusable, as (reason, detail), or None if it is valid.

    Args:
        conv: A canonical record (``messages`` plus optional ``tools`` and ``track``) or a bare
            message list. A record with ``track: prompt_only`` is checked in its prompt-only
            form: system and user turns only, ending in a user turn.

    Reasons: ``no_messages``, ``bad_message``, ``missing_role``, ``unknown_role``,
    ``non_string_content``, ``empty_content``, ``bad_tool_call``, ``bad_tool_arguments``, ``bad_tools``,
    ``assistant_first``, ``too_few_turns``, ``user_last``, ``tool_last``, ``system_last``,
    ``answer_in_prompt`` (an assistant or tool turn in a prompt-only record).
    """
    record = conv if isinstance(conv, dict) else {"messages": conv}
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no_messages", f"messages is {json.dumps(messages, default=str)[:100]}"
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "bad_tools", "tools must be a list of objects"
    for i, m in enumerate(messages):
        problem = _message_problem(i, m)
        if problem:
            return problem
    if record.get("track") == TRACK_PROMPT_ONLY:
        for i, m in enumerate(messages):
            if m["role"] not in ("system", "user"):
                return "answer_in_prompt", f"message {i} is a {m['role']} turn in a prompt-only record"
        if count_role(messages, "user") == 0:
            return "too_few_turns", "no user message"
        return None
    return _order_problem(messages)


def check_conversation(conv: Any) -> Optional[str]:
    """The reject reason of a conversation, or None if it is valid (see conversation_problem)."""
    problem = conversation_problem(conv)
    return problem[0] if problem else None
