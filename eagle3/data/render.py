"""Render a conversation with the chat template and derive its loss mask from render boundaries.

What the draft must learn is exactly what the target *generated*: its reasoning, ``</think>``,
content, tool-call tokens and the closing end-of-turn token. Which characters those are is a
property of the chat template, so it is read off the template itself instead of being guessed
with regexes over the text. For assistant message ``i``::

    P_i = render(messages[:i], add_generation_prompt=True)   # ... <|im_assistant|>assistant<|im_middle|><think>
    S_i = render(messages[:i + 1])                            # ... that turn, closed by <|im_end|>
    generated span = S_i[len(P_i):]

and both must be prefixes of the full render ``R`` (else the template rewrites history, e.g. the
stock Kimi template dropping reasoning, and the mask would describe text that is not in ``R``).
Everything the template inserts by itself (role headers, the ``<think>`` / ``<think></think>``
scaffold of the generation prompt, the tool declaration, user/system/tool turns) is outside
every span and gets mask 0.

Tokens come from tokenizing ``R`` segment by segment (``add_special_tokens=False``): no offset
mapping is needed, so slow tokenizers such as Kimi's tiktoken one work too. A BPE merge across a
boundary would make the segment tokens differ from tokenizing ``R`` in one go, which is checked.
Text of the tokenizer's added tokens inside content a dataset supplied (a code sample quoting
``<|im_end|>``) is escaped before rendering and encoded as text (`eagle3.data.special_text`); the
answers stage generate regenerated keep the tokens the target emitted. The target's chat format
conventions are applied first (`eagle3.chat_formats.targets.for_target`: Kimi's tool-call ids).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from eagle3.chat_formats.targets import for_target
from eagle3.data.conversation import TRACK_PROMPT_ONLY
from eagle3.data.special_text import SpecialTextError, literal_specials

__all__ = ["Reject", "RenderSettings", "generated_spans", "render", "template_kwargs",
           "tokenize_conversation", "tokenize_spans"]

OVERLENGTH_TRUNCATE, OVERLENGTH_DROP = "truncate", "drop"
#: `tokenize.overlength`: what happens to a sample longer than data.max_len.
OVERLENGTH_POLICIES = (OVERLENGTH_TRUNCATE, OVERLENGTH_DROP)


class Reject(Exception):
    """A conversation this stage refuses, with a stable reason for the counts."""

    def __init__(self, reason: str, detail: Any = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RenderSettings:
    """Everything besides the tokenizer that decides a sample's tokens and mask.

    Attributes:
        template: Chat template text; None = the tokenizer's own.
        thinking: Thinking mode of the source (Kimi's ``thinking``; Qwen-style templates read
            ``enable_thinking``), as the target was prompted when it wrote the responses.
        max_len: Longest sample kept, in tokens.
        overlength: ``truncate`` (cut to max_len and flag) or ``drop`` (reject ``too_long``).
    """

    template: Optional[str]
    thinking: bool
    max_len: int
    overlength: str

    @property
    def template_sha256(self) -> Optional[str]:
        """Hash of the template text (None when the tokenizer's own template is used)."""
        return None if self.template is None else hashlib.sha256(self.template.encode("utf-8")).hexdigest()


def template_kwargs(settings: RenderSettings) -> dict[str, Any]:
    """The ``chat_template_kwargs`` a server would receive for this source's thinking mode."""
    return {"thinking": settings.thinking, "enable_thinking": settings.thinking}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def render(tokenizer: Any, messages: list[dict], settings: RenderSettings, *, tools: Any = None,
           add_generation_prompt: bool = False) -> str:
    """One template render as text, with every failure turned into a ``template_error`` reject.

    Goes through ``tokenizer.apply_chat_template`` (not a private Jinja environment) so that the
    filters, globals and tokenizer-specific overrides (Kimi's remote code) are the ones a serving
    engine uses when it builds the prompt.
    """
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=settings.template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **template_kwargs(settings))
    except Exception as exc:  # a template can raise anything; one bad sample must not stop the job
        raise Reject("template_error", _one_line(exc)) from None
    if not isinstance(text, str):
        raise Reject("template_error", f"template rendered {type(text).__name__}, not text")
    return text


def generated_spans(tokenizer: Any, conv: dict, settings: RenderSettings) -> tuple[str, list[tuple[int, int]]]:
    """The full render and the character spans the target generated, one per assistant message.

    Returns:
        ``(R, [(start, end), ...])`` with spans in order and non-overlapping. A span may be
        empty only if the template renders an assistant turn as nothing.

    Raises:
        Reject: ``template_error``, ``template_not_prefix`` or ``reasoning_dropped`` (thinking on,
            yet a turn's ``reasoning_content`` is not in its generated span).
    """
    messages, tools = conv["messages"], conv.get("tools") or None
    full = render(tokenizer, messages, settings, tools=tools)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = render(tokenizer, messages[:i], settings, tools=tools, add_generation_prompt=True)
        turn = render(tokenizer, messages[: i + 1], settings, tools=tools)
        if not turn.startswith(prompt):
            raise Reject("template_not_prefix", f"assistant message {i}: the render up to and including it "
                         "does not start with the generation prompt")
        if not full.startswith(turn):
            raise Reject("template_not_prefix", f"assistant message {i}: the full render does not start with "
                         "the render up to it (the template rewrites earlier turns, e.g. drops reasoning)")
        reasoning = message.get("reasoning_content")
        reasoning = reasoning.strip() if isinstance(reasoning, str) else ""
        if settings.thinking and reasoning and reasoning not in turn[len(prompt):]:
            # E.g. the stock Kimi template on a plain `user, assistant` pair: every prefix check
            # passes, yet the answer's reasoning is silently gone from the training text.
            raise Reject("reasoning_dropped", f"assistant message {i}: the template does not render its "
                         "reasoning_content; set model.training_chat_template to a template that keeps it")
        spans.append((len(prompt), _end_of_generation(tokenizer, turn, len(prompt))))
    return full, spans


def _end_of_generation(tokenizer: Any, turn: str, start: int) -> int:
    """Where the target's generation of a turn ends: after its end-of-turn token, not after the template's separator.

    ChatML-style templates (Qwen, many fine-tunes) close a turn with `<|im_end|>\n`: the model
    emits `<|im_end|>` and stops; the newline is the template's, never generated, so training
    the draft to predict it after the end-of-turn token would teach it text serving never sees.
    Only whitespace after the tokenizer's eos token is cut; any other template text is kept.
    """
    eos = getattr(tokenizer, "eos_token", None)
    if not isinstance(eos, str) or not eos:
        return len(turn)
    at = turn.rfind(eos, start)
    if at < 0 or turn[at + len(eos):].strip():
        return len(turn)
    return at + len(eos)


def tokenize_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask that is 1 exactly on the tokens of ``spans``.

    Raises:
        Reject: ``boundary_merge`` when tokenizing segment by segment differs from tokenizing the
            whole text (a token would straddle a mask boundary).
    """
    segments, flags, pos = [], [], 0
    for start, end in spans:
        if start > pos:
            segments.append(text[pos:start])
            flags.append(0)
        if end > start:
            segments.append(text[start:end])
            flags.append(1)
        pos = end
    if pos < len(text):
        segments.append(text[pos:])
        flags.append(0)
    try:  # added-token text the content quoted was escaped before rendering: encoded as text here
        encoded = literal_specials(tokenizer).encode(tokenizer, segments + [text])
    except SpecialTextError as exc:
        raise Reject("special_token_text", str(exc)) from None
    whole = encoded.pop()
    ids: list[int] = []
    mask: list[int] = []
    for seg_ids, flag in zip(encoded, flags, strict=True):
        ids.extend(seg_ids)
        mask.extend([flag] * len(seg_ids))
    if ids != whole:
        at = next((k for k, (a, b) in enumerate(zip(ids, whole, strict=False)) if a != b), min(len(ids), len(whole)))
        raise Reject("boundary_merge", f"segment tokens differ from the whole render at token {at} "
                     f"({len(ids)} vs {len(whole)} tokens)")
    return ids, mask


def _last_assistant(messages: list[dict]) -> dict:
    return next(m for m in reversed(messages) if m.get("role") == "assistant")


def _generated_part_of_cut_turn(text: str, span: tuple[int, int], message: dict) -> tuple[int, int]:
    """The part of a turn cut at max_new_tokens that the target actually wrote.

    The template closes every turn (``</think>`` after reasoning, ``<|im_end|>`` at the end) even
    when generation stopped mid-way; those closers were never generated, so they must not be
    trained as target output. The span is cut right after the last text the target produced:
    its content if any, else its reasoning.
    """
    start, end = span
    body = text[start:end]
    for field, locate in (("content", body.rfind), ("reasoning_content", body.find)):
        value = message.get(field)
        if isinstance(value, str) and value:
            at = locate(value)
            if at >= 0:
                return start, start + at + len(value)
    return start, start  # nothing generated survives: no token of this turn is target output


def _emitted_by_the_target(conv: dict) -> Callable[[Any], bool]:
    """The messages whose added-token text the target itself emitted as tokens: the answers stage generate
    regenerated (a prompt-only record's assistant turns), decoded from the target's own ids.

    Re-encoding them with the tokenizer's added tokens gives back what the target emitted (a small target
    writes a stray `</think>` mid-answer now and then; it is its token, not text). Everything a dataset
    supplied -- prompts, tool results, target-native answers -- is text.
    """
    if conv.get("track") != TRACK_PROMPT_ONLY:
        return lambda node: False
    return lambda node: isinstance(node, dict) and node.get("role") == "assistant"


def tokenize_conversation(tokenizer: Any, conv: dict, settings: RenderSettings) -> dict[str, Any]:
    """One canonical conversation -> one ``tokenized_data.jsonl`` record (docs/design.md, 'Data formats').

    ``n_prompt_tokens`` counts every mask-0 token (context the draft conditions on) and
    ``n_response_tokens`` every mask-1 token, after truncation; ``n_turns`` counts the assistant
    turns that still have generated tokens in the record. ``truncated`` is true when the sample
    was cut at ``max_len`` here or its last answer was cut at max_new_tokens by stage generate
    (``meta.truncated``); ``truncated_max_len`` / ``truncated_generation`` say which.

    Raises:
        Reject: ``invalid_conversation``, ``template_error``, ``template_not_prefix``,
            ``reasoning_dropped``, ``boundary_merge``, ``special_token_text``, ``too_long`` (overlength=drop)
            or ``no_response_tokens``.
    """
    messages = conv.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise Reject("invalid_conversation", "messages must be a non-empty list of objects with a role")
    conv = for_target(settings.template if settings.template is not None else tokenizer.chat_template, conv)
    try:  # content that quotes `<|im_end|>` stays text: only the template's own scaffolding yields those ids
        conv, _ = literal_specials(tokenizer).escape(conv, keep=_emitted_by_the_target(conv))
    except SpecialTextError as exc:
        raise Reject("special_token_text", str(exc)) from None
    messages = conv["messages"]
    text, spans = generated_spans(tokenizer, conv, settings)
    meta = conv.get("meta") or {}
    if meta.get("truncated") and spans:
        spans[-1] = _generated_part_of_cut_turn(text, spans[-1], _last_assistant(messages))
    ids, mask = tokenize_spans(tokenizer, text, spans)
    cut = len(ids) > settings.max_len
    if cut and settings.overlength == OVERLENGTH_DROP:
        raise Reject("too_long", f"{len(ids)} tokens > data.max_len={settings.max_len}")
    if cut:
        ids, mask = ids[: settings.max_len], mask[: settings.max_len]
    n_response = sum(mask)
    if n_response == 0:
        detail = "no assistant turn" if not spans else "no generated token within data.max_len"
        raise Reject("no_response_tokens", detail)
    n_turns = sum(1 for k, flag in enumerate(mask) if flag and (k == 0 or not mask[k - 1]))
    return {
        "id": conv["id"],
        "source": conv.get("source"),
        "input_ids": ids,
        "loss_mask": mask,
        "seq_len": len(ids),
        "n_prompt_tokens": len(ids) - n_response,
        "n_response_tokens": n_response,
        "n_turns": n_turns,
        "truncated": bool(cut or meta.get("truncated")),
        "truncated_max_len": cut,  # which of the two, for the counts and for later filtering
        "truncated_generation": bool(meta.get("truncated")),
    }
