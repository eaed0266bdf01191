"""Stage `prep`: raw dataset sources -> canonical conversations, one output per source.

Per source (unit): read raw records (hub, local files, or the demo_data output), map the
schema with its adapter, check the conversation, apply the track (prompt-only keeps system and
user turns and the tool declarations, and drops the foreign answers), filter by `config.prep`,
dedupe by normalized prompt, take the seeded nested sample of `num_samples`, and write
``conversations.jsonl`` (complete-or-absent: it gets its name only at finalize).

Every raw record ends in exactly one place, so ``in = out + rejected`` always holds:
``conversations.jsonl``, a line of ``rejects.jsonl`` with a reason and detail (malformed_json,
duplicate_id, adapter_error, unknown_role, user_last, too_long, duplicate_prompt, ...), or the
``not_sampled`` count. Valid records beyond `num_samples` are only *counted* (count_reject):
a 10K sample of a 5M-record set would otherwise write millions of reject lines that say
nothing. A rerun of an unfinished unit redoes the scan, which is deterministic, and skips by id
what the killed run already wrote.

A source that keeps no record stops the job here (`eagle3.stages.intake`), even when the other
sources are fine: the user asked for it, and without it the mixture would silently be another one
(its weight spread over the rest) -- or, for a prompt-only source, a server would be launched to
answer nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput, atomic_write_json
from eagle3.config.schema import DatasetSourceConfig, Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.data.loading import files_sha256, latest_dataset_commit
from eagle3.data.prepare import prepare_source
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.demo_data import DATA_FILE, DEMO_DATA
from eagle3.stages.intake import Intake

CONVERSATIONS_FILE = "conversations.jsonl"
#: The hub commit an unpinned hub source's unit reads (resolved by its first run, kept by reruns).
HUB_REVISION_FILE = "hub_revision.json"
#: Bump when the canonical record or the selection rules change (part of the fingerprint).
PREP_FORMAT_VERSION = 2  # 2: description, weight and thinking left out of the fingerprint

log = logging.getLogger("eagle3")


def _units(config: Eagle3Config) -> list[str]:
    return list(config.dataset.sources)


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    """Everything that shapes a source's conversations (the output fingerprint covers it), and nothing else."""
    # The schema leaves out what other stages do with the records (weight, thinking) and the description.
    src = config.dataset.sources[unit]
    slice_: dict[str, Any] = {
        "source": fingerprinted(src),
        "prep": fingerprinted(config.prep),
        "seed": config.data.seed,
        "format_version": PREP_FORMAT_VERSION,
    }
    if src.data_files:
        slice_["data_files_sha256"] = files_sha256(list(src.data_files))
    return slice_


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    if config.dataset.sources[unit].generator is not None:
        return {"raw": require(DEMO_DATA, config, ctx, unit)}
    return {}


def _pinned_source(out: StageOutput, unit: str, src: DatasetSourceConfig) -> DatasetSourceConfig:
    """The source with the hub commit this unit reads, the same in its first run and every resume.

    Without it a prep killed before an upstream update and resumed after would mix two versions
    of the dataset in one output. A pinned `revision` is used as it is.
    """
    if not src.hub_id or src.revision:
        return src
    pin = out.dir / HUB_REVISION_FILE
    if pin.is_file():
        commit = json.loads(pin.read_text(encoding="utf-8"))["commit"]
    else:
        commit = latest_dataset_commit(src.hub_id)
        if commit is None:
            log.warning("[prep] %s: dataset.sources.%s.revision is not set and the hub's latest commit of %s cannot "
                        "be resolved (offline?): reading whatever `datasets` finds; pin a commit to be sure",
                        unit, unit, src.hub_id)
            return src
        atomic_write_json(out.path(HUB_REVISION_FILE), {"hub_id": src.hub_id, "commit": commit})
    log.info("[prep] %s: reading %s at commit %s (dataset.sources.%s.revision is not set: pin it to make "
             "an upstream update change the fingerprint)", unit, src.hub_id, commit, unit)
    return replace(src, revision=commit)


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    generator_file = Path(out.inputs["raw"]["path"]) / DATA_FILE if "raw" in out.inputs else None
    src = _pinned_source(out, unit, config.dataset.sources[unit])
    return prepare_source(out, unit, src, config.prep, generator_file, config.paths.hf_cache, config.data.seed,
                          CONVERSATIONS_FILE)


PREP = UnitStage(
    name="prep",
    help="map raw dataset sources to canonical conversations (tracks, filters, dedupe, sampling)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("records", "source", "Fix the data or the dataset options (dataset.*, prep.*)",
                  chosen=("not_sampled",)),
)
