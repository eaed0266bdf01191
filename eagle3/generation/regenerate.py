"""Turn-by-turn regeneration of prompt-only conversations through a generation backend.

A prompt-only conversation keeps only what the user side said (system and user messages; prep
dropped the foreign answers). Every assistant turn is regenerated in order: after each user
turn the conversation *as regenerated so far* is sent to the target, so later turns condition
on the target's own earlier answers, exactly as they would in serving.

A batch of conversations advances in lock-step, one user turn per round, with one `generate`
call per round whose seed is derived from the batch's ids and the round. Nothing else feeds
the sampler, so re-running a batch (after a kill) reproduces it exactly. A backend whose requests
are independent (`GenerationBackend.independent_requests`) need not re-run the conversations of
the batch that are done: the others are sent alone, under the seed of the whole batch.

A request that failed after its retries leaves its conversation *undone* (an Outcome with a
retryable reason, which the stage does not write) rather than rejected: the server was down, the
conversation is fine, and a rerun regenerates it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Optional

from eagle3.data.conversation import EMITTED_IDS_KEY
from eagle3.generation.types import (
    ERROR_PROMPT_TOO_LONG,
    FINISH_LENGTH,
    FINISH_TOOL_CALLS,
    RETRYABLE_REJECT_REASONS,
    BackendUnavailable,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

# How a regenerated conversation ended (meta.generation.ended).
ENDED_COMPLETE = "complete"  # every user turn answered
ENDED_MAX_USER_TURNS = "max_user_turns"  # later user turns dropped (generate.max_user_turns)
ENDED_LENGTH = "length"  # a turn hit max_new_tokens (kept flagged; later turns dropped)
ENDED_TOOL_CALLS = "tool_calls"  # the target called a tool, which cannot be run for a foreign prompt
ENDED_CONTEXT = "context_length"  # the next prompt no longer fits the model's context
CONTEXT_ROLES = ("system", "user")
#: `generate.length_policy`: a turn cut at max_new_tokens is kept (flagged truncated) or its sample dropped.
LENGTH_KEEP_FLAGGED, LENGTH_DROP = "keep_flagged", "drop"


@dataclass(frozen=True)
class GenerateSettings:
    """The knobs of one regeneration run (from `cfg.generate`, the source and `cfg.data.seed`)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    max_user_turns: int
    length_policy: str  # one of eagle3.config.choices.LENGTH_POLICIES
    thinking: bool
    seed: int


@dataclass
class Outcome:
    """What became of one input conversation: an output record, a reject, or a transient failure.

    Attributes:
        id: Conversation id.
        record: The regenerated conversation, or None if rejected or failed.
        reason: Reject reason (`length_cut`, `empty_generation`, ...), a retryable reason
            (`request_failed`: not written, see `retryable`), or None.
        detail: Reject detail (turn, finish reason, tokens), plain data.
        generation: The `meta.generation` block (also kept with a reject, for statistics).
        completion_tokens: Tokens generated for this conversation, all turns.
    """

    id: str
    record: Optional[dict[str, Any]] = None
    reason: Optional[str] = None
    detail: Any = None
    generation: dict[str, Any] = field(default_factory=dict)
    completion_tokens: int = 0

    @property
    def retryable(self) -> bool:
        """Whether the conversation failed for the server's sake: left undone for a rerun, not rejected."""
        return self.record is None and self.reason in RETRYABLE_REJECT_REASONS


class BatchInterrupted(BackendUnavailable):
    """The backend stopped (went down, closed) in the middle of a batch.

    Same message as the backend's error, so a caller that does not look inside still stops with
    it; `outcomes` are the conversations of the batch that had ended before (written by the stage,
    the rest left undone).
    """

    def __init__(self, cause: BackendUnavailable, outcomes: list[Outcome]) -> None:
        super().__init__(str(cause))
        self.cause, self.outcomes = cause, outcomes


def batch_seed(ids: Sequence[Any], turn: int, seed: int) -> int:
    """Sampler seed of one round of a batch: a pure function of its ids, the round and the run seed."""
    key = "\x1f".join([str(seed), str(turn), *map(str, ids)])
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little") & (2**63 - 1)


def split_turns(messages: Sequence[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], int]:
    """Group a prompt-only conversation into user turns, each with the context that precedes it.

    Returns:
        `(turns, ignored)`: each turn is the system messages since the previous user message
        plus the user message; `ignored` counts messages that cannot be replayed (assistant or
        tool messages prep should have removed, and system messages after the last user turn).
    """
    turns: list[list[dict[str, Any]]] = []
    pending: list[dict[str, Any]] = []
    ignored = 0
    for message in messages:
        role = message.get("role")
        if role not in CONTEXT_ROLES:
            ignored += 1
            continue
        pending.append({k: v for k, v in message.items() if k in ("role", "content", "name")})
        if role == "user":
            turns.append(pending)
            pending = []
    return turns, ignored + len(pending)


def _is_empty(message: dict[str, Any]) -> bool:
    return not (str(message.get("content") or "").strip() or str(message.get("reasoning_content") or "").strip()
                or message.get("tool_calls"))


class _Conversation:
    """State of one conversation while its batch is regenerated."""

    def __init__(self, record: dict[str, Any], settings: GenerateSettings) -> None:
        self.record = record
        self.settings = settings
        self.turns, ignored = split_turns(record.get("messages") or [])
        self.messages: list[dict[str, Any]] = []
        self.turn_meta: list[dict[str, Any]] = []
        self.generation: dict[str, Any] = {
            "thinking": settings.thinking, "user_turns": len(self.turns), "ignored_messages": ignored}
        self.outcome: Optional[Outcome] = None
        if not self.turns:
            self._reject("no_user_turn", {"messages": len(record.get("messages") or [])})

    @property
    def id(self) -> str:
        return self.record["id"]

    def request(self, turn: int) -> GenerationRequest:
        self.messages.extend(self.turns[turn])
        return GenerationRequest(id=f"{self.id}:{turn}", messages=list(self.messages),
                                 tools=self.record.get("tools") or None, thinking=self.settings.thinking)

    def _tokens(self) -> int:
        return sum(t["completion_tokens"] for t in self.turn_meta)

    def _reject(self, reason: str, detail: Any) -> None:
        # A reject is counted, never trained on: its turns keep their statistics, not their ids.
        self.generation["turns"] = [{k: v for k, v in t.items() if k != EMITTED_IDS_KEY} for t in self.turn_meta]
        self.outcome = Outcome(id=self.id, reason=reason, detail=detail, generation=self.generation,
                               completion_tokens=self._tokens())

    def _finish(self, ended: str, truncated: bool = False) -> None:
        answered = sum(1 for m in self.messages if m["role"] == "user")
        self.generation.update(turns=self.turn_meta, ended=ended,
                               dropped_user_turns=len(self.turns) - answered)
        record: dict[str, Any] = {k: self.record[k] for k in ("id", "source", "track") if k in self.record}
        record["messages"] = self.messages
        if self.record.get("tools"):
            record["tools"] = self.record["tools"]
        record["meta"] = {**(self.record.get("meta") or {}), "truncated": truncated, "generation": self.generation}
        self.outcome = Outcome(id=self.id, record=record, generation=self.generation,
                               completion_tokens=self._tokens())

    def apply(self, turn: int, result: GenerationResult) -> None:
        """Take the target's answer to user turn `turn` and decide whether to continue."""
        if result.error is not None and result.error != ERROR_PROMPT_TOO_LONG:
            # The request failed after all retries (retryable: left undone, the unit is rerun), or the
            # server's answer is unusable (a reject with the reason); either way the conversation
            # cannot be regenerated as a whole, so it is not cut short here.
            self._reject(result.error, {"turn": turn, "error": result.error_detail,
                                        "prompt_tokens": result.prompt_tokens})
            return
        if result.error is not None:
            if turn == 0:
                self._reject(result.error, {"turn": turn, "prompt_tokens": result.prompt_tokens})
            else:  # keep the answered turns; this user turn cannot be answered
                del self.messages[len(self.messages) - len(self.turns[turn]):]
                self._finish(ENDED_CONTEXT)
            return
        self.messages.append(result.message)
        meta: dict[str, Any] = {"finish_reason": result.finish_reason, "completion_tokens": result.completion_tokens,
                                "prompt_tokens": result.prompt_tokens}
        if result.token_ids is not None:
            meta[EMITTED_IDS_KEY] = list(result.token_ids)
        self.turn_meta.append(meta)
        detail = {"turn": turn, "finish_reason": result.finish_reason,
                  "completion_tokens": result.completion_tokens}
        if _is_empty(result.message):
            self._reject("empty_generation", detail)
        elif result.finish_reason == FINISH_LENGTH:
            if self.settings.length_policy == LENGTH_DROP:
                self._reject("length_cut", detail)
            else:
                self._finish(ENDED_LENGTH, truncated=True)
        elif result.finish_reason == FINISH_TOOL_CALLS:
            self._finish(ENDED_TOOL_CALLS)
        elif turn + 1 == len(self.turns):
            self._finish(ENDED_COMPLETE)
        elif turn + 1 == self.settings.max_user_turns:
            self._finish(ENDED_MAX_USER_TURNS)


def regenerate_batch(backend: GenerationBackend, records: Sequence[dict[str, Any]],
                     settings: GenerateSettings, done: AbstractSet[Any] = frozenset()) -> list[Outcome]:
    """Regenerate every assistant turn of a batch of prompt-only conversations.

    All conversations of the batch advance together, one user turn per `generate` call, so the
    batch (and the seed of each call) is fixed by the input order alone.

    Args:
        backend: The target.
        records: The batch, in input order (all of it: its ids seed every call).
        settings: The run's knobs.
        done: Ids already written; with a backend of independent requests they are not sent
            again (the others re-run whole batches to reproduce them, and the caller skips them).

    Returns:
        One Outcome per record regenerated (all, or those not in `done`), in input order.

    Raises:
        BatchInterrupted: The backend stopped mid-batch; it carries the outcomes that had ended.
    """
    convs = [_Conversation(r, settings) for r in records]
    ids = [c.id for c in convs]
    if done and getattr(backend, "independent_requests", False):
        convs = [c for c in convs if c.id not in done]
    for turn in range(settings.max_user_turns):
        active = [c for c in convs if c.outcome is None]
        if not active:
            break
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                top_p=settings.top_p, seed=batch_seed(ids, turn, settings.seed))
        try:
            results = backend.generate([c.request(turn) for c in active], params)
        except BackendUnavailable as exc:
            raise BatchInterrupted(exc, [c.outcome for c in convs if c.outcome is not None]) from exc
        for conv, result in zip(active, results, strict=True):
            conv.apply(turn, result)
    assert all(c.outcome is not None for c in convs), "a conversation neither finished nor was rejected"
    return [c.outcome for c in convs]  # type: ignore[misc]
