"""One small adapter per raw dataset schema: a raw record -> canonical messages and tools.

Each adapter declares the column keys it reads (``columns`` of a dataset source remaps them to
the dataset's real column names); an unknown key is a config error found before any work
(`eagle3.data.rules`). Adapters move text into the canonical shape and nothing more:
content is never reworded or trimmed, so target-native text (Kimi trajectories) reaches the
tokenizer exactly as the target wrote it. A record an adapter cannot read raises
:class:`AdapterError` (reject reason ``adapter_error``); structural problems they can see
(``bad_tool_call``) raise :class:`ConversationError`; everything else is left to
:func:`eagle3.data.conversation.conversation_problem`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from eagle3.data import glaive
from eagle3.data.conversation import (
    ConversationError,
    join_text_parts,
    normalize_tool_call,
    split_think,
)

#: Column key every schema accepts: the raw id column (default: the first of ID_COLUMNS present).
ID_KEY = "id"
ID_COLUMNS = ("id", "prompt_id", "conversation_id", "conversation_hash", "uuid", "instance_id",
              "trajectory_id", "question_id")
MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "prompter": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant", "claude": "assistant",
    "system": "system",
}
_META_MAX_CHARS = 200
REASONING_FLAGS = ("on", "off")


class AdapterError(ValueError):
    """The record does not have the shape its schema promises (reject reason adapter_error)."""


@dataclass(frozen=True)
class Adapter:
    """A schema's converter and the column keys it reads (key -> default column name).

    `optional` and `marks` are what `eagle3.data.detect` places a file by, so the rules live
    with the adapter they describe: a record fits the schema when it has every required column
    (the keys not in `optional`: without them `convert` raises AdapterError) and, when `marks`
    is set, at least one of those raw columns (it tells apart schemas whose columns are the same).
    """

    schema: str
    convert: Callable[[dict, dict], dict]
    columns: dict[str, str]
    optional: tuple[str, ...] = ()  # keys read only when the record has them
    marks: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key a source's `columns` may set for this schema."""
        return (ID_KEY, *self.columns)

    @property
    def required(self) -> tuple[str, ...]:
        """The column keys every record of this schema has."""
        return tuple(k for k in self.columns if k not in self.optional)


# ----------------------------------------------------------------------------- shared bits
def _col(record: dict, cols: dict, key: str) -> Any:
    name = cols[key]
    if name not in record or record[name] is None:
        raise AdapterError(f"missing column {name!r} (columns.{key}); record has {sorted(record)[:12]}")
    return record[name]


def _opt(record: dict, cols: dict, key: str) -> Any:
    return record.get(cols.get(key) or "")


def _expect_list(value: Any, what: str) -> list:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AdapterError(f"{what} is a string that is not JSON") from None
    if not isinstance(value, list):
        raise AdapterError(f"{what} is a {type(value).__name__}, expected a list")
    return value


def normalize_tools(tools: Any) -> list[dict]:
    """Tool declarations (a list, or JSON text of one) in OpenAI form ``{"type": "function", ...}``."""
    if tools is None or tools == "" or tools == []:
        return []
    out = []
    for tool in _expect_list(tools, "tools"):
        if not isinstance(tool, dict):
            raise AdapterError(f"a tool declaration is a {type(tool).__name__}, expected an object")
        out.append(tool if "function" in tool else {"type": "function", "function": tool})
    return out


def _meta(record: dict, cols: dict) -> dict:
    """The record's own `meta` dict plus its other short scalar columns (generator, domain, ...)."""
    meta = dict(record["meta"]) if isinstance(record.get("meta"), dict) else {}
    skip = set(cols.values()) | set(ID_COLUMNS) | {"meta"}  # ids are in meta.raw_id already
    fields = {k: v for k, v in record.items() if k not in skip and (
        isinstance(v, (bool, int)) or (isinstance(v, float) and math.isfinite(v))
        or (isinstance(v, str) and len(v) <= _META_MAX_CHARS))}
    if fields:
        meta["raw_fields"] = fields
    return meta


def _messages(raw: list, think: bool) -> list:
    """OpenAI message dicts with null fields dropped, ids filled in, optional <think> split."""
    out, pending, n_calls = [], [], 0
    for m in raw:
        if not isinstance(m, dict):
            out.append(m)  # conversation_problem reports bad_message
            continue
        msg = {k: m[k] for k in MESSAGE_KEYS if m.get(k) is not None}
        if "content" in msg:
            msg["content"] = join_text_parts(msg["content"])
        if msg.get("role") == "system" and msg.get("content") == "":
            continue  # an empty system prompt says nothing (Nemotron writes one per record)
        if msg.get("role") == "assistant":
            if "tool_calls" in msg:
                calls = msg["tool_calls"]
                if not isinstance(calls, list):
                    raise ConversationError("bad_tool_call", f"tool_calls is a {type(calls).__name__}")
                msg["tool_calls"] = [normalize_tool_call(c, n_calls + i) for i, c in enumerate(calls)]
                n_calls += len(calls)
                msg.setdefault("content", "")
            pending = [c["id"] for c in msg.get("tool_calls", [])]
            if think and isinstance(msg.get("content"), str) and "reasoning_content" not in msg:
                reasoning, msg["content"] = split_think(msg["content"])
                if reasoning is not None:
                    msg["reasoning_content"] = reasoning
        elif msg.get("role") == "tool" and "tool_call_id" not in msg and pending:
            msg["tool_call_id"] = pending.pop(0)  # results answer the calls in order
        out.append({k: msg[k] for k in MESSAGE_KEYS if k in msg})
    return out


def raw_id(record: dict, columns: dict) -> str:
    """The record's own id (id column) or, without one, a hash of its content.

    Raises:
        AdapterError: An id column was configured but the record lacks it.
    """
    if columns.get(ID_KEY):
        value = record.get(columns[ID_KEY])
        if value is None or value == "":
            raise AdapterError(f"missing id column {columns[ID_KEY]!r} (columns.id)")
        return str(value)
    for name in ID_COLUMNS:
        value = record.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) != "":
            return str(value)
    text = json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------- adapters
def openai_messages(record: dict, cols: dict) -> dict:
    """UltraChat / Nemotron / demo_native: ``messages`` [{role, content, ...}], ``tools``?.

    An assistant turn that opens with ``<think>…</think>`` has it moved to
    ``reasoning_content``. The ``reasoning`` column is Nemotron's on/off flag (kept in meta) or,
    in other sets, the reasoning text of the final answer.
    """
    messages = _messages(_expect_list(_col(record, cols, "messages"), "messages"), think=True)
    reasoning = _opt(record, cols, "reasoning")
    meta = _meta(record, cols)
    if isinstance(reasoning, str) and reasoning.strip().lower() in REASONING_FLAGS:
        meta["reasoning"] = reasoning.strip().lower()
    elif isinstance(reasoning, str) and reasoning.strip():
        last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "assistant"), None)
        if last is not None and "reasoning_content" not in last:
            last["reasoning_content"] = reasoning.strip()
    return {"messages": messages, "tools": normalize_tools(_opt(record, cols, "tools")), "meta": meta}


def sharegpt(record: dict, cols: dict) -> dict:
    """ShareGPT / perfectblend / OpenThoughts: ``conversations`` [{from, value}], ``system``?.

    Speaker names are mapped with SHAREGPT_ROLES (human/gpt/chatgpt/...); an unknown one is
    passed on as is so the reject names it (unknown_role).
    """
    messages: list[Any] = []
    system = _opt(record, cols, "system")
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    for turn in _expect_list(_col(record, cols, "conversations"), "conversations"):
        if not isinstance(turn, dict):
            messages.append(turn)
            continue
        speaker = turn.get("from", turn.get("role"))
        role = SHAREGPT_ROLES.get(speaker.strip().lower(), speaker) if isinstance(speaker, str) else speaker
        messages.append({"role": role, "content": turn.get("value", turn.get("content"))})
    return {"messages": _messages(messages, think=True), "tools": [],
            "meta": _meta(record, cols)}


def opencodeinstruct(record: dict, cols: dict) -> dict:
    """OpenCodeInstruct: one ``input`` prompt and one ``output`` answer."""
    messages = [{"role": "user", "content": _col(record, cols, "prompt")},
                {"role": "assistant", "content": _col(record, cols, "response")}]
    return {"messages": messages, "tools": [], "meta": _meta(record, cols)}


def problem_solution(record: dict, cols: dict) -> dict:
    """crownelius/KimiK2.5-2000x style: ``problem``, ``thinking`` (optional), ``solution``.

    Without a thinking column, a solution that opens with ``<think>`` is split instead.
    """
    messages = []
    system = _opt(record, cols, "system")
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": _col(record, cols, "problem")})
    answer = {"role": "assistant", "content": _col(record, cols, "solution")}
    thinking = _opt(record, cols, "thinking")
    if isinstance(thinking, str) and thinking.strip():
        answer["reasoning_content"] = thinking
    elif isinstance(answer["content"], str):
        reasoning, answer["content"] = split_think(answer["content"])
        if reasoning is not None:
            answer["reasoning_content"] = reasoning
    messages.append(answer)
    return {"messages": messages, "tools": [], "meta": _meta(record, cols)}


def glaive_function_calling(record: dict, cols: dict) -> dict:
    """glaive-function-calling-v2: ``system`` text with function JSON, ``chat`` transcript."""
    system = _col(record, cols, "system")
    chat = _col(record, cols, "chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise AdapterError("glaive `system` and `chat` must be strings")
    try:
        prose, tools = glaive.parse_system(system)
        messages = ([{"role": "system", "content": prose}] if prose else []) + glaive.parse_chat(chat)
    except glaive.GlaiveFormatError as exc:
        raise AdapterError(str(exc)) from None
    return {"messages": messages, "tools": tools, "meta": _meta(record, cols)}


def deepswe_trajectories(record: dict, cols: dict) -> dict:
    """DeepSWE-Agent Kimi-K2 trajectories: ``messages`` [{role, content}] kept byte for byte.

    Tool calls stay inline (``<function=execute_bash><parameter=cmd>…``) and observations stay
    user turns: that is how the target saw and wrote them, so it is what the draft must learn.
    """
    raw = _expect_list(_col(record, cols, "messages"), "messages")
    messages = [{k: m[k] for k in MESSAGE_KEYS if m.get(k) is not None} if isinstance(m, dict) else m
                for m in raw]
    return {"messages": messages, "tools": [], "meta": _meta(record, cols)}


ADAPTERS: dict[str, Adapter] = {a.schema: a for a in (
    Adapter("openai_messages", openai_messages, {"messages": "messages", "tools": "tools", "reasoning": "reasoning"},
            optional=("tools", "reasoning")),
    Adapter("sharegpt", sharegpt, {"conversations": "conversations", "system": "system"}, optional=("system",)),
    Adapter("opencodeinstruct", opencodeinstruct, {"prompt": "input", "response": "output"}),
    Adapter("problem_solution", problem_solution,
            {"problem": "problem", "thinking": "thinking", "solution": "solution", "system": "system"},
            optional=("thinking", "system")),
    Adapter("glaive_function_calling", glaive_function_calling, {"system": "system", "chat": "chat"}),
    # The same `messages` as openai_messages: a SWE task id is what says "agent trajectory, keep it as written".
    Adapter("deepswe_trajectories", deepswe_trajectories, {"messages": "messages"}, marks=("instance_id",)),
)}


def resolve_columns(schema: str, columns: Optional[dict]) -> dict:
    """The adapter's defaults overridden by a source's `columns` (keys already validated)."""
    return {ID_KEY: None, **ADAPTERS[schema].columns, **(columns or {})}


def convert(schema: str, record: Any, columns: dict) -> dict:
    """Run the schema's adapter on one raw record (columns from :func:`resolve_columns`).

    Returns:
        ``{"messages", "tools", "meta"}``.

    Raises:
        AdapterError: The record is not an object, lacks a column, or has the wrong shape.
        ConversationError: A problem the adapter can name (e.g. bad_tool_call).
    """
    if not isinstance(record, dict):
        raise AdapterError(f"a raw record must be an object, got {type(record).__name__}")
    return ADAPTERS[schema].convert(record, columns)
