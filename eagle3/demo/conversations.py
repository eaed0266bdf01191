"""Deterministic chat conversations about stdlib functions, in canonical OpenAI form.

A conversation is first drawn as a :class:`Plan` (which function, which kind of exchange, which
phrasing), then written out by a *writer*. :func:`kimi_conversation` writes what the demo target
is trained to say (reasoning, code blocks, ``read_file`` tool calls); the terse writer in
:mod:`eagle3.demo.datasets` writes a different style from the same plans, so the prompt-only
track really does change responses when they are regenerated through the target.

Every draw takes a ``random.Random`` seeded from a string, which is stable across processes
and Python versions (unlike ``hash``), so streams are reproducible.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from eagle3.demo import corpus

KINDS = ("explain", "call", "tool", "multi")
KIND_WEIGHTS = (0.3, 0.25, 0.25, 0.2)

READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read the source code of a symbol from a file of the Python standard library.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string",
                         "description": "File path relative to the stdlib root, e.g. json/__init__.py"},
                "symbol": {"type": "string", "description": "Qualified name in that file, e.g. JSONEncoder.encode"},
            },
            "required": ["path", "symbol"],
        },
    },
}

SYSTEM_PROMPTS = (None, None, None, "You are a helpful assistant.",
                  "You are Kimi, an AI assistant created by Moonshot AI.",
                  "You are a concise Python expert. Answer questions about the standard library.")

# Names are always in backticks: byte-level BPE tokenizes " json" and "`json" differently, and
# the target can only learn to copy a name into its answer if the tokens match exactly.
ASK = {
    "explain": ("What does `{name}` do?", "Can you explain `{name}`?",
                "Explain `{name}` from the `{module}` module.", "What is `{name}` used for?",
                "I keep seeing `{name}` in code. What does it do?",
                "Briefly, what is the purpose of `{name}`?", "Describe `{name}` in a few sentences.",
                "what does `{short}` do in `{module}`?"),
    "call": ("Show me how to call `{name}`.", "Give me an example of using `{name}`.",
             "How do I use `{name}`? A short snippet please.", "Write a minimal call to `{name}`.",
             "What arguments does `{name}` take? Show an example.",
             "example of `{short}` from `{module}`?"),
    "tool": ("Show me the source of `{name}`.", "How is `{name}` implemented?",
             "Can you look at the code of `{name}` and explain it?",
             "Read the implementation of `{name}` for me.",
             "Open the file that defines `{name}` and show me how it starts.",
             "I want to see the code behind `{short}` in `{module}`."),
}
FOLLOW_UPS = ("call", "where", "other")
ASK_WHERE = ("Which file is it defined in?", "Where does that live in the stdlib?",
             "And what file is that in?")
ASK_OTHER = ("What about `{name}`?", "And `{name}`?", "How does that compare to `{name}`?")


@dataclass
class Plan:
    """One drawn exchange: the function(s) asked about and every phrasing choice, before writing.

    ``turns`` holds ``(answer_kind, record, user_text)`` per user turn; answer kinds are
    ``explain``, ``call``, ``tool``, ``where``.
    """

    kind: str
    system: str | None
    turns: list[tuple[str, dict, str]] = field(default_factory=list)
    style: int = 0

    @property
    def tools(self) -> list[dict] | None:
        """Tools are declared exactly when the exchange needs them, so the model can learn when to call."""
        return [READ_FILE_TOOL] if self.kind == "tool" else None

    def key(self) -> str:
        """Identity of the prompt side (system, tools, user turns) for de-duplicating streams.

        ``style`` and the records are left out on purpose: they only change answers, and two
        records that differ there would still be the same prompt to the target.
        """
        return json.dumps([self.system, bool(self.tools), [u for _, _, u in self.turns]])


def _fmt(template: str, rec: dict) -> str:
    return template.format(name=corpus.record_key(rec), short=rec["qualname"], module=rec["module"])


def draw_plan(rng: random.Random, records: tuple[dict, ...], record: dict | None = None) -> Plan:
    """Draw one plan about ``record`` (or a random record); ``records`` supplies follow-up topics."""
    rec = record if record is not None else rng.choice(records)
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    plan = Plan(kind=kind, system=rng.choice(SYSTEM_PROMPTS), style=rng.randrange(3))
    first = "explain" if kind == "multi" else kind
    plan.turns.append((first, rec, _fmt(rng.choice(ASK[first]), rec)))
    if kind == "multi":
        for follow in rng.sample(FOLLOW_UPS, rng.randint(1, 2)):
            if follow == "call":
                plan.turns.append(("call", rec, rng.choice(("Show me how to call it.",
                                   "Can you give an example?", "How would I call that?"))))
            elif follow == "where":
                plan.turns.append(("where", rec, rng.choice(ASK_WHERE)))
            else:
                same = [r for r in records if r["module"] == rec["module"] and r is not rec]
                other = rng.choice(same or list(records))
                plan.turns.append(("explain", other, _fmt(rng.choice(ASK_OTHER), other)))
    return plan


def _kind_word(rec: dict) -> str:
    return {"function": "function", "class": "class", "method": "method"}[rec["kind"]]


def call_example(rec: dict) -> str:
    """A minimal, plausible call; argument names double as placeholder variables."""
    args = ", ".join(rec["params"])
    if rec["kind"] == "method":
        cls, meth = rec["qualname"].rsplit(".", 1)
        call = f"obj = {rec['module']}.{cls}(...)\nresult = obj.{meth}({args})"
    elif rec["kind"] == "class":
        call = f"obj = {rec['module']}.{rec['qualname']}({args})"
    else:
        call = f"result = {rec['module']}.{rec['qualname']}({args})"
    return f"import {rec['module']}\n\n{call}"


def _explain(rec: dict, style: int) -> tuple[str, str]:
    name, sig = corpus.record_key(rec), rec["signature"]
    reasoning = (
        f"The user asks about `{name}`. It is a {_kind_word(rec)} in {rec['path']} of the "
        f"`{rec['module']}` module, with signature `{sig}`. I will summarize its docstring.",
        f"`{name}` is defined in {rec['path']}. Signature: `{sig}`. The docstring explains it; "
        f"summarize and show the signature.",
        f"Look up `{rec['qualname']}` in `{rec['module']}` ({rec['path']}): a {_kind_word(rec)} "
        f"`{sig}`. Answer from the docstring.",
    )[style]
    content = (f"`{name}` is a {_kind_word(rec)} in the `{rec['module']}` module. {rec['doc']}\n\n"
               f"```python\n{sig}\n```")
    return reasoning, content


def _call(rec: dict, style: int) -> tuple[str, str]:
    name = corpus.record_key(rec)
    params = ", ".join(f"`{p}`" for p in rec["params"]) or "none"
    reasoning = (
        f"To call `{name}` I need its signature `{rec['signature']}`. Required arguments: {params}.",
        f"The signature of `{name}` is `{rec['signature']}`, so a call needs {params}.",
        f"`{name}` lives in {rec['path']}; its required arguments are {params}. Write a short example.",
    )[style]
    if rec["kind"] == "method":
        reasoning += f" It is a method, so I first need an instance of `{rec['qualname'].rsplit('.', 1)[0]}`."
    content = f"Here is a minimal example:\n\n```python\n{call_example(rec)}\n```\n\n{rec['doc']}"
    return reasoning, content


def _where(rec: dict) -> tuple[str, str]:
    name = corpus.record_key(rec)
    return (f"`{name}` comes from {rec['path']}, line {rec['lineno']}.",
            f"`{name}` is defined in `{rec['path']}` (line {rec['lineno']}) of the standard library.")


def _tool_call(rec: dict, index: int) -> dict:
    args = json.dumps({"path": rec["path"], "symbol": rec["qualname"]})
    return {"id": f"functions.read_file:{index}", "type": "function",
            "function": {"name": "read_file", "arguments": args}}


def tool_answer(rec: dict, source: str, style: int) -> tuple[str, str]:
    """The answer after a ``read_file`` result: it copies the first lines of the returned code."""
    lines = source.splitlines()
    head = "\n".join(lines[:8])
    reasoning = (
        f"The tool returned {len(lines)} lines of {rec['path']}. The definition starts with "
        f"`{lines[0].strip()}`.",
        f"I have the source of `{rec['qualname']}` now; quote the first lines and explain.",
        f"Got the code from {rec['path']}. Show the beginning and summarize the docstring.",
    )[style]
    content = (f"Here is how `{corpus.record_key(rec)}` starts in `{rec['path']}`:\n\n"
               f"```python\n{head}\n```\n\n{rec['doc']}")
    return reasoning, content


def kimi_conversation(plan: Plan) -> dict:
    """Write a plan the way the demo target answers: reasoning first, then the answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": plan.system}] if plan.system else []
    for answer_kind, rec, user_text in plan.turns:
        messages.append({"role": "user", "content": user_text})
        if answer_kind == "tool":
            call = _tool_call(rec, 0)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call],
                             "reasoning_content": f"I should read the source of `{rec['qualname']}` "
                                                  f"from {rec['path']} before answering."})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": rec["source"]})
            reasoning, content = tool_answer(rec, rec["source"], plan.style)
        elif answer_kind == "explain":
            reasoning, content = _explain(rec, plan.style)
        elif answer_kind == "call":
            reasoning, content = _call(rec, plan.style)
        else:
            reasoning, content = _where(rec)
        messages.append({"role": "assistant", "content": content, "reasoning_content": reasoning})
    conv = {"messages": messages}
    if plan.tools:
        conv["tools"] = plan.tools
    return conv


def training_plans(num: int, seed: int, split: str = "train", start: int = 0):
    """Plans ``start .. num-1`` cycling through the split in a fresh shuffled order each epoch.

    Epoch-wise cycling (rather than sampling with replacement) gives every function the same
    exposure, which matters when the whole training run is only a few passes. Plan ``i`` depends
    only on ``(seed, i)``, so a stream can be read in chunks.
    """
    records = corpus.split_records(split)
    epoch, order = -1, []
    for i in range(start, num):
        if i // len(records) != epoch:
            epoch = i // len(records)
            order = list(records)
            random.Random(f"order:{seed}:{epoch}").shuffle(order)
        yield draw_plan(random.Random(f"plan:{seed}:{i}"), records, order[i % len(records)])
