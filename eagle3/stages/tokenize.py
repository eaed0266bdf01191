"""Stage `tokenize`: canonical conversations -> `tokenized_data.jsonl` with exact loss masks.

One unit per dataset source. Target-native sources are read from `prep`, prompt-only ones from
`generate` (their regenerated answers). Rendering and masks are :mod:`eagle3.data.render`, the
run over all cores (resumable by id) :mod:`eagle3.data.tokenize_run`; this module decides *what*
affects the output (the unit config slice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.data.conversation import TRACK_PROMPT_ONLY
from eagle3.data.render import RenderSettings
from eagle3.data.tokenize_run import TokenizerSpec, tokenize_unit
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.intake import Intake
from eagle3.stages.prep import (
    CONVERSATIONS_FILE,  # generate writes the same file under the same name
)
from eagle3.target_info import tokenizer_identity

TOKENIZED_FILE = "tokenized_data.jsonl"
#: Bump when the record layout or the mask rule changes: old outputs must not be reused.
# 2: a turn ends at its end-of-turn token; 3: quoted special-token text is text, Kimi call ids;
# 4: regenerated answers are the ids the target emitted (tokenize.answer_ids), drift counted per record.
FORMAT_VERSION = 4


def _template_text(config: Eagle3Config) -> Optional[str]:
    template = config.model.training_chat_template
    return None if template is None else Path(str(template)).read_text(encoding="utf-8")


def render_settings(config: Eagle3Config, unit: str) -> RenderSettings:
    """The render settings of one source (template, its thinking mode, length policy)."""
    return RenderSettings(template=_template_text(config), thinking=config.dataset.sources[unit].thinking,
                          max_len=config.data.max_len, overlength=config.tokenize.overlength,
                          answer_ids=config.tokenize.answer_ids)


def _tokenizer_spec(config: Eagle3Config) -> TokenizerSpec:
    return TokenizerSpec(path=config.model.path, revision=config.model.revision,
                         trust_remote_code=config.model.trust_remote_code, cache_dir=config.paths.hf_cache)


def _units(config: Eagle3Config) -> list[str]:
    return list(config.dataset.sources)


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    settings = render_settings(config, unit)
    return {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(config.model.path, config.model.revision),
        # None = the tokenizer's own template, already covered by the tokenizer identity.
        "template_sha256": settings.template_sha256,
        "thinking": settings.thinking,
        "max_len": settings.max_len,
        "overlength": settings.overlength,
        "answer_ids": settings.answer_ids,
    }


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    # Imported here: the upstream stages import heavier modules and may import this one.
    upstream: UnitStage
    if config.dataset.sources[unit].track == TRACK_PROMPT_ONLY:
        from eagle3.stages.generate import GENERATE as upstream
    else:
        from eagle3.stages.prep import PREP as upstream
    return {"conversations": require(upstream, config, ctx, unit)}


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    upstream = _unit_inputs(config, ctx, unit)["conversations"]
    extra = tokenize_unit(out, upstream.directory / CONVERSATIONS_FILE, upstream.counts.get("out"), unit,
                          render_settings(config, unit), _tokenizer_spec(config), config.tokenize.num_workers,
                          config.tokenize.chunk_size, TOKENIZED_FILE)
    return {**extra, "template": config.model.training_chat_template}


TOKENIZE = UnitStage(
    name="tokenize",
    help="render conversations with the training chat template; exact loss masks from render boundaries",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("conversations", "source", "Fix the data or the tokenize options (data.max_len, "
                  "tokenize.overlength, model.training_chat_template)"),
)
