"""Stage `prep`: raw dataset sources -> canonical conversations, one output per source.

Per source (unit): read raw records (hub, local files, or the demo_data output), map the
schema with its adapter, check the conversation, apply the track (prompt-only keeps system and
user turns and the tool declarations, and drops the foreign answers), filter by `cfg.prep`,
dedupe by normalized prompt, take the seeded nested sample of `num_samples`, and write
``conversations.jsonl`` (complete-or-absent: it gets its name only at finalize).

Every raw record ends in exactly one place, so ``in = out + rejected`` always holds:
``conversations.jsonl``, a line of ``rejects.jsonl`` with a reason and detail (malformed_json,
duplicate_id, adapter_error, unknown_role, user_last, too_long, duplicate_prompt, ...), or the
``not_sampled`` count. Valid records beyond `num_samples` are only *counted* (count_reject):
a 10K sample of a 5M-record set would otherwise write millions of reject lines that say
nothing. A rerun of an unfinished unit redoes the scan, which is deterministic, and skips by id
what the killed run already wrote.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput, progress
from eagle3.artifacts.atomic import temp_path_for
from eagle3.data.adapters import AdapterError, convert, raw_id, resolve_columns
from eagle3.data.conversation import (
    TRACK_PROMPT_ONLY,
    ConversationError,
    conversation_problem,
    count_role,
    prompt_only_messages,
    text_chars,
)
from eagle3.data.loading import files_sha256, iter_source
from eagle3.data.selection import Selector
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.demo_data import DATA_FILE, DEMO_DATA

log = logging.getLogger("eagle3")

CONVERSATIONS_FILE = "conversations.jsonl"
#: Bump when the canonical record or the selection rules change (part of the fingerprint).
PREP_FORMAT_VERSION = 1


def _source(cfg: DictConfig, unit: str) -> dict[str, Any]:
    return OmegaConf.to_container(cfg.dataset.sources[unit], resolve=True)


def _units(cfg: DictConfig) -> list[str]:
    return list(cfg.dataset.sources)


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    """Everything that shapes a source's conversations (the output fingerprint covers it)."""
    src = _source(cfg, unit)
    config: dict[str, Any] = {
        "source": src,
        "prep": OmegaConf.to_container(cfg.prep, resolve=True),
        "seed": cfg.data.seed,
        "format_version": PREP_FORMAT_VERSION,
    }
    if src.get("data_files"):
        config["data_files_sha256"] = files_sha256(list(src["data_files"]))
    return config


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    if cfg.dataset.sources[unit].generator is not None:
        return {"raw": require(DEMO_DATA, cfg, ctx, unit)}
    return {}


def canonical_record(raw: dict, rid: str, unit: str, src: dict, columns: dict, prep: dict) -> dict:
    """One raw record -> the canonical record of its track, or ConversationError/AdapterError.

    The structural check runs on the whole raw conversation for both tracks: a dangling user
    turn or an answer before any question usually marks a broken scrape, whatever we keep of it.
    Turn limits count the raw user turns; `max_chars` measures what is written.
    """
    conv = convert(src["schema"], raw, columns)
    messages, tools = conv["messages"], conv["tools"]
    problem = conversation_problem({"messages": messages, "tools": tools})
    if problem:
        raise ConversationError(*problem)
    n_user = count_role(messages, "user")
    if n_user < prep["min_user_turns"]:
        raise ConversationError("too_few_turns", f"{n_user} user turns < prep.min_user_turns={prep['min_user_turns']}")
    if n_user > prep["max_user_turns"]:
        raise ConversationError("too_many_turns", f"{n_user} user turns > prep.max_user_turns={prep['max_user_turns']}")
    meta = {**conv["meta"], "raw_id": rid.split(":", 1)[1], "schema": src["schema"], "user_turns": n_user,
            "dropped_assistant_turns": 0, "dropped_tool_results": 0}
    if src["track"] == TRACK_PROMPT_ONLY:
        messages, meta["dropped_assistant_turns"], meta["dropped_tool_results"] = prompt_only_messages(messages)
    chars = text_chars(messages)
    if chars > prep["max_chars"]:
        raise ConversationError("too_long", f"{chars} characters > prep.max_chars={prep['max_chars']}")
    record: dict[str, Any] = {"id": rid, "source": unit, "track": src["track"], "messages": messages}
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


def _scan(out: StageOutput, unit: str, src: dict, prep: dict, generator_file: Optional[Path],
          hf_cache: Optional[str], selector: Selector) -> None:
    """Read every raw record once: reject the bad ones, spill the valid ones."""
    columns = resolve_columns(src["schema"], src.get("columns"))
    seen: set[str] = set()  # every id read (the output writers only know the ids they wrote)
    repeats: dict[str, int] = {}
    for item in progress(iter_source(src, hf_cache, generator_file), desc=f"prep {unit}", unit="rec"):
        out.count_in()
        if item.error is not None:
            _reject(out, f"{unit}:{item.where}", "malformed_json", item.error, unit, item.where)
            continue
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
        except Exception as exc:  # noqa: BLE001 - a record the adapter cannot read must not end the job
            _reject(out, rid, "adapter_error", f"{type(exc).__name__}: {exc}", unit, item.where)


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    src = _source(cfg, unit)
    prep = OmegaConf.to_container(cfg.prep, resolve=True)
    generator_file = Path(out.inputs["raw"]["path"]) / DATA_FILE if "raw" in out.inputs else None
    records = out.records(CONVERSATIONS_FILE)
    with Selector(temp_path_for(out.dir / "spill.jsonl"), cfg.data.seed, bool(prep["dedupe"])) as selector:
        _scan(out, unit, src, prep, generator_file, cfg.paths.hf_cache, selector)
        chosen = selector.choose(src.get("num_samples"))
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
    if src.get("num_samples") and chosen.available < src["num_samples"]:
        log.warning("[prep] %s: only %d usable records for num_samples=%d", unit, chosen.available,
                    src["num_samples"])
    return {"schema": src["schema"], "track": src["track"], "file": CONVERSATIONS_FILE,
            "available": chosen.available, "num_samples": src.get("num_samples")}


PREP = UnitStage(
    name="prep",
    help="map raw dataset sources to canonical conversations (tracks, filters, dedupe, sampling)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
