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
``<|im_end|>``) is escaped before rendering and encoded as text (`eagle3.data.special_text`).

An answer stage generate regenerated is trained on the ids the target emitted for it
(``meta.generation.turns[k].token_ids``), not on its text re-encoded: decoding and re-encoding can
split differently (an emitted ``olic`` + ``s`` comes back ``olics``, ``\n\n`` as two ``\n``), and
then the draft would learn sequences the target never produces. The text around it is encoded as
above; each record counts how many emitted tokens the re-encoding would have missed. The target's chat format
conventions are applied first (`eagle3.chat_formats.targets.for_target`: Kimi's tool-call ids).
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from eagle3.chat_formats.targets import for_target
from eagle3.data.conversation import EMITTED_IDS_KEY, TRACK_PROMPT_ONLY, is_token_ids
from eagle3.data.special_text import SpecialTextError, literal_specials

__all__ = ["EmittedDrift", "Reject", "RenderSettings", "generated_spans", "render", "template_kwargs",
           "tokenize_conversation", "tokenize_spans"]

OVERLENGTH_TRUNCATE, OVERLENGTH_DROP = "truncate", "drop"
# `tokenize.overlength`: what happens to a sample longer than data.max_len.
ANSWER_IDS_EMITTED, ANSWER_IDS_REENCODED = "emitted", "reencoded"
# `tokenize.answer_ids`: a regenerated answer trains on the ids the target emitted (`emitted`), or on
# its text re-encoded by the tokenizer (`reencoded`: what tokenize format 3 did, kept to measure the gap).


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
        answer_ids: One of eagle3.config.choices.ANSWER_IDS: whether a regenerated answer's tokens are the ids the
            target emitted (``meta.generation.turns[k].token_ids``) or its text re-encoded.
    """

    template: Optional[str]
    thinking: bool
    max_len: int
    overlength: str
    answer_ids: str

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


@dataclass
class EmittedDrift:
    """How far the re-encoded text of regenerated answers is from the ids the target emitted.

    Attributes:
        emitted: Emitted tokens of the answers that carry their ids.
        reencoded_unmatched: Of those, tokens the re-encoding of the rendered answer does not
            reproduce (emitted length minus the longest common subsequence found by difflib).
        trained_unmatched: Of those, tokens the training ids do not reproduce (0 under
            ``answer_ids=emitted``; ``reencoded_unmatched`` under ``reencoded``).
        answers_reencoded_differently: Answers whose re-encoding is not exactly their emitted ids.
    """

    emitted: int = 0
    reencoded_unmatched: int = 0
    trained_unmatched: int = 0
    answers_reencoded_differently: int = 0


def _unmatched(emitted: list[int], other: list[int]) -> int:
    """Emitted tokens `other` does not reproduce, aligned as a diff would (a re-split costs its tokens)."""
    if emitted == other:
        return 0
    matcher = difflib.SequenceMatcher(None, emitted, other, autojunk=False)
    return len(emitted) - sum(block.size for block in matcher.get_matching_blocks())


def tokenize_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]],
                   emitted: Optional[list[Optional[list[int]]]] = None, drift: Optional[EmittedDrift] = None,
                   train_on_emitted: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask that is 1 exactly on the tokens of ``spans``.

    Args:
        emitted: Per span, the ids the target emitted for it, or None (an empty span with ids
            counts them all as missed by the re-encoding, and trains on them).
        drift: Where to add how the encoding of those spans' text differs from their ids.
        train_on_emitted: A span with emitted ids gets them instead of its text's encoding
            (the text around it is encoded as usual).

    Raises:
        Reject: ``boundary_merge`` when tokenizing segment by segment differs from tokenizing the
            whole text (a token would straddle a mask boundary).
    """
    segments: list[str] = []
    owners: list[Optional[int]] = []  # per segment: the index of the span it is, None for template text
    pos = 0
    for k, (start, end) in enumerate(spans):
        if start > pos:
            segments.append(text[pos:start])
            owners.append(None)
        # An empty span still stands for its emitted ids: a cut answer whose text the template
        # reshaped (trimmed) cannot be found in the render, yet the target did emit it.
        if end > start or (emitted is not None and emitted[k] is not None):
            segments.append(text[start:end])
            owners.append(k)
        pos = end
    if pos < len(text):
        segments.append(text[pos:])
        owners.append(None)
    try:  # added-token text the content quoted was escaped before rendering: encoded as text here
        encoded = literal_specials(tokenizer).encode(tokenizer, segments + [text])
    except SpecialTextError as exc:
        raise Reject("special_token_text", str(exc)) from None
    whole = encoded.pop()
    joined = [i for seg_ids in encoded for i in seg_ids]
    if joined != whole:
        at = next((k for k, (a, b) in enumerate(zip(joined, whole, strict=False)) if a != b),
                  min(len(joined), len(whole)))
        raise Reject("boundary_merge", f"segment tokens differ from the whole render at token {at} "
                     f"({len(joined)} vs {len(whole)} tokens)")
    ids: list[int] = []
    mask: list[int] = []
    for seg_ids, owner in zip(encoded, owners, strict=True):
        answer = None if owner is None or emitted is None else emitted[owner]
        if answer is not None and drift is not None:
            unmatched = _unmatched(answer, seg_ids)
            drift.emitted += len(answer)
            drift.reencoded_unmatched += unmatched
            drift.trained_unmatched += 0 if train_on_emitted else unmatched
            drift.answers_reencoded_differently += int(seg_ids != answer)
        if answer is not None and train_on_emitted:
            seg_ids = answer
        ids.extend(seg_ids)
        mask.extend([0 if owner is None else 1] * len(seg_ids))
    return ids, mask


def _emitted_answer_ids(tokenizer: Any, conv: dict) -> Optional[list[Optional[list[int]]]]:
    """Per assistant message, the ids the target emitted for it (None where unknown), or None for a
    record that is not a regenerated one.

    Raises:
        Reject: ``emitted_ids_invalid``: the record carries ids that are not token ids of this
            tokenizer or do not line up with its assistant messages.
    """
    if conv.get("track") != TRACK_PROMPT_ONLY:
        return None
    turns = ((conv.get("meta") or {}).get("generation") or {}).get("turns")
    if not isinstance(turns, list) or not any(isinstance(t, dict) and EMITTED_IDS_KEY in t for t in turns):
        return None
    answers = sum(1 for m in conv["messages"] if m.get("role") == "assistant")
    if len(turns) != answers:
        raise Reject("emitted_ids_invalid", f"meta.generation.turns has {len(turns)} entries for {answers} "
                     "assistant messages")
    vocab = len(tokenizer)
    out: list[Optional[list[int]]] = []
    for k, turn in enumerate(turns):
        ids = turn.get(EMITTED_IDS_KEY) if isinstance(turn, dict) else None
        if ids is not None and not is_token_ids(ids, vocab):
            raise Reject("emitted_ids_invalid", f"meta.generation.turns[{k}].{EMITTED_IDS_KEY} is not a list of "
                         f"token ids below the vocabulary size {vocab}")
        out.append(ids)
    return out


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
            ``reasoning_dropped``, ``boundary_merge``, ``special_token_text``, ``emitted_ids_invalid``,
            ``too_long`` (overlength=drop) or ``no_response_tokens``.
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
    emitted = _emitted_answer_ids(tokenizer, conv)
    drift = EmittedDrift()
    ids, mask = tokenize_spans(tokenizer, text, spans, emitted, drift,
                               train_on_emitted=settings.answer_ids == ANSWER_IDS_EMITTED)
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
        # The ids the target emitted for this record's regenerated answers, and how many of them
        # their re-encoded text / the training ids above do not reproduce (0 for other records).
        "emitted_tokens": drift.emitted,
        "emitted_unmatched_reencoded": drift.reencoded_unmatched,
        "emitted_unmatched_trained": drift.trained_unmatched,
        "answers_reencoded_differently": drift.answers_reencoded_differently,
    }
