"""Raw dataset records -> canonical conversations of one source: the work behind stage `prep`.

Map the schema with its adapter, check the conversation, apply the track (prompt-only keeps system
and user turns and the tool declarations, and drops the foreign answers), filter by `prep.*`,
dedupe by normalized prompt, and take the seeded nested sample of `num_samples`. Every raw record
ends in exactly one place -- the output, a reject with a reason, or the `not_sampled` count -- so
`in = out + rejected` always holds; a rerun redoes the scan (deterministic) and skips by id what a
killed run already wrote.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import StageOutput, progress
from eagle3.artifacts.atomic import temp_path_for
from eagle3.config.schema import DatasetSourceConfig, PrepConfig
from eagle3.data.adapters import AdapterError, convert, raw_id, resolve_columns
from eagle3.data.conversation import (
    TRACK_PROMPT_ONLY,
    ConversationError,
    conversation_problem,
    count_role,
    prompt_only_messages,
    text_chars,
)
from eagle3.data.loading import iter_source
from eagle3.data.selection import Selector

__all__ = ["canonical_record", "prepare_source"]

log = logging.getLogger("eagle3")
SPILL_FILE = "spill.jsonl"  # the valid records of the scan, until the sample is chosen (a temp file)


def canonical_record(raw: dict, rid: str, unit: str, src: DatasetSourceConfig, columns: dict,
                     prep: PrepConfig) -> dict:
    """One raw record -> the canonical record of its track, or ConversationError/AdapterError.

    The structural check runs on the whole raw conversation for both tracks: an answer before any
    question or a tool result nobody called usually marks a broken scrape, whatever we keep of it.
    A final user turn with no answer is such a mark only on the target-native track; for prompt-only
    data it is the normal shape (a file of questions), since the target writes every answer anyway.
    Turn limits count the raw user turns; `max_chars` measures what is written.
    """
    conv = convert(src.schema, raw, columns)
    messages, tools = conv["messages"], conv["tools"]
    problem = conversation_problem({"messages": messages, "tools": tools})
    if problem and not (src.track == TRACK_PROMPT_ONLY and problem[0] == "user_last"):
        raise ConversationError(*problem)
    n_user = count_role(messages, "user")
    if n_user < prep.min_user_turns:
        raise ConversationError("too_few_turns", f"{n_user} user turns < prep.min_user_turns={prep.min_user_turns}")
    if n_user > prep.max_user_turns:
        raise ConversationError("too_many_turns", f"{n_user} user turns > prep.max_user_turns={prep.max_user_turns}")
    meta = {**conv["meta"], "raw_id": rid.split(":", 1)[1], "schema": src.schema, "user_turns": n_user,
            "dropped_assistant_turns": 0, "dropped_tool_results": 0}
    if src.track == TRACK_PROMPT_ONLY:
        messages, meta["dropped_assistant_turns"], meta["dropped_tool_results"] = prompt_only_messages(messages)
    chars = text_chars(messages)
    if chars > prep.max_chars:
        raise ConversationError("too_long", f"{chars} characters > prep.max_chars={prep.max_chars}")
    record: dict[str, Any] = {"id": rid, "source": unit, "track": src.track, "messages": messages}
    if tools:
        record["tools"] = tools
    record["meta"] = meta
    problem = conversation_problem(record)  # the written form, e.g. prompt-only ends in a user turn
    if problem:
        raise ConversationError(*problem)
    return record


def _reject(out: StageOutput, rid: str, reason: str, detail: str, unit: str, where: str) -> None:
    if not out.is_done(rid):  # written by a killed earlier run of this unit
        out.reject(rid, reason, detail, source=unit, where=where)


def _scan(out: StageOutput, unit: str, src: DatasetSourceConfig, prep: PrepConfig, generator_file: Optional[Path],
          hf_cache: Optional[str], selector: Selector) -> None:
    """Read every raw record once: reject the bad ones, spill the valid ones."""
    columns = resolve_columns(src.schema, src.columns)
    seen: set[str] = set()  # every id read (the output writers only know the ids they wrote)
    repeats: dict[str, int] = {}
    for item in progress(iter_source(src, hf_cache, generator_file), desc=f"prep {unit}", unit="rec"):
        out.count_in()
        if item.error is not None:
            _reject(out, f"{unit}:{item.where}", item.reason, item.error, unit, item.where)
            continue
        assert item.record is not None  # a RawItem without an error holds its record
        try:
            rid = f"{unit}:{raw_id(item.record, columns)}"
        except AdapterError as exc:
            _reject(out, f"{unit}:{item.where}", "adapter_error", str(exc), unit, item.where)
            continue
        if rid in seen:
            repeats[rid] = repeats.get(rid, 1) + 1
            _reject(out, f"{rid}#{repeats[rid]}", "duplicate_id", f"id {rid!r} seen before; this is copy "
                    f"{repeats[rid]}", unit, item.where)
            continue
        seen.add(rid)
        try:
            selector.add(canonical_record(item.record, rid, unit, src, columns, prep), item.where)
        except ConversationError as exc:
            _reject(out, rid, exc.reason, exc.detail, unit, item.where)
        except AdapterError as exc:
            _reject(out, rid, "adapter_error", str(exc), unit, item.where)
        except (OSError, MemoryError):
            # The machine's trouble (the spill write hit a full disk), never a verdict on the record: a
            # reject would be kept by the rerun's resume and lose a valid record for good.
            raise
        except Exception as exc:  # noqa: BLE001 - a record the adapter cannot read must not end the job
            _reject(out, rid, "adapter_error", f"{type(exc).__name__}: {exc}", unit, item.where)


def prepare_source(out: StageOutput, unit: str, src: DatasetSourceConfig, prep: PrepConfig,
                   generator_file: Optional[Path], hf_cache: Optional[str], seed: int, output_name: str) -> dict:
    """Scan one source into `out`: canonical records of the nested sample, rejects with reasons.

    Args:
        out: The open unit output.
        unit: The source's name.
        src: The source's config (`dataset.sources.<unit>`; a hub source with its commit pinned).
        prep: `prep.*` (filters, dedupe).
        generator_file: The demo_data output to read instead of a hub/local origin, or None.
        hf_cache: Cache directory of hub datasets.
        seed: The sampling seed (`data.seed`).
        output_name: The conversations file to write.

    Returns:
        The manifest `extra`: schema, track, file, available records, num_samples.
    """
    records = out.records(output_name)
    with Selector(temp_path_for(out.dir / SPILL_FILE), seed, prep.dedupe) as selector:
        _scan(out, unit, src, prep, generator_file, hf_cache, selector)
        chosen = selector.choose(src.num_samples)
        for index in chosen.selected:  # key order: the sample at N is a prefix of the one at N' > N
            record, _ = selector.read(index)
            if not out.is_done(record["id"]):
                records.write(record)
        for index, kept in chosen.duplicates:
            dup, where = selector.read(index)
            _reject(out, dup["id"], "duplicate_prompt",
                    f"same normalized prompt as {selector.read(kept)[0]['id']}, which has the smaller sampling key",
                    unit, where)
    out.count_reject("not_sampled", chosen.not_sampled)
    if src.num_samples and chosen.available < src.num_samples:
        log.warning("[prep] %s: only %d usable records for num_samples=%d", unit, chosen.available,
                    src.num_samples)
    return {"schema": src.schema, "track": src.track, "file": output_name,
            "available": chosen.available, "num_samples": src.num_samples}
