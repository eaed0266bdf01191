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

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts import Manifest, StageOutput
from eagle3.data.loading import files_sha256
from eagle3.data.prepare import prepare_source
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.demo_data import DATA_FILE, DEMO_DATA

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


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    generator_file = Path(out.inputs["raw"]["path"]) / DATA_FILE if "raw" in out.inputs else None
    return prepare_source(out, unit, _source(cfg, unit), OmegaConf.to_container(cfg.prep, resolve=True),
                          generator_file, cfg.paths.hf_cache, int(cfg.data.seed), CONVERSATIONS_FILE)


PREP = UnitStage(
    name="prep",
    help="map raw dataset sources to canonical conversations (tracks, filters, dedupe, sampling)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
