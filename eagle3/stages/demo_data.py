"""Stage `demo_data`: write the built-in demo datasets as raw files in their real schemas.

The demo sets are generated, not downloaded, so that every stage after this one reads them
exactly as it would read a hub or local dataset: `demo_prompts` in ShareGPT form (foreign
answers, prompt-only track) and `demo_native` in OpenAI `messages` form (answers sampled from
the demo target, target-native track). Only sources with a `generator` are units here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.demo.datasets import DEMO_NATIVE
from eagle3.paths import asset_path
from eagle3.stages.base import StageContext, UnitStage
from eagle3.target_info import target_identity

DATA_FILE = "data.jsonl"
DEMO_TARGET = "demo_target"


def _answerer(config: Eagle3Config, unit: str) -> str:
    """The target that answers a demo_native source (`answered_by`; unset: the demo target)."""
    return config.dataset.sources[unit].answered_by or str(asset_path(DEMO_TARGET))


def _target_fingerprint(path: str) -> dict[str, Any]:
    """The answering target's identity: demo_native answers change when the target does."""
    return target_identity(path)


def _units(config: Eagle3Config) -> list[str]:
    return [name for name, src in config.dataset.sources.items() if src.generator is not None]


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    src = config.dataset.sources[unit]
    slice_: dict[str, Any] = {
        "generator": src.generator,
        "schema": src.schema,
        "track": src.track,
        "num_samples": src.num_samples,
        "seed": config.data.seed,
    }
    if src.generator == DEMO_NATIVE:
        slice_["target"] = _target_fingerprint(_answerer(config, unit))
    return slice_


def _no_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {}


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    # Imported here: generating demo_native loads torch and the target, which config-only
    # commands (validation, --cfg, stage=plan) should not pay for.
    from eagle3.demo.datasets import write_demo_source

    src = config.dataset.sources[unit]
    assert src.generator is not None and src.num_samples is not None  # the unit's reason; config rules
    answerer = _answerer(config, unit)
    # Remote code only as the config allows it, and only for the configured target (demo_kimi's tokenizer).
    trust = config.model.trust_remote_code and answerer == config.model.path
    write_demo_source(out, src.generator, src.num_samples, config.data.seed, Path(answerer), DATA_FILE,
                      trust_remote_code=trust)
    return {"schema": src.schema, "track": src.track, "file": DATA_FILE}


DEMO_DATA = UnitStage(
    name="demo_data",
    help="materialise the built-in demo datasets (dataset sources with a generator)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_no_inputs,
    run_unit=_run_unit,
)
