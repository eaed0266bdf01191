"""Stage `tokenize`: canonical conversations -> `tokenized_data.jsonl` with exact loss masks.

One unit per dataset source. Target-native sources are read from `prep`, prompt-only ones from
`generate` (their regenerated answers). Rendering and masks are :mod:`eagle3.data.render`, the
run over all cores (resumable by id) :mod:`eagle3.data.tokenize_run`; this module decides *what*
affects the output (the unit config slice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput
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


def _template_text(cfg: DictConfig) -> Optional[str]:
    template = cfg.model.training_chat_template
    return None if template is None else Path(str(template)).read_text(encoding="utf-8")


def render_settings(cfg: DictConfig, unit: str) -> RenderSettings:
    """The render settings of one source (template, its thinking mode, length policy)."""
    return RenderSettings(template=_template_text(cfg), thinking=bool(cfg.dataset.sources[unit].thinking),
                          max_len=int(cfg.data.max_len), overlength=str(cfg.tokenize.overlength),
                          answer_ids=str(cfg.tokenize.answer_ids))


def _tokenizer_spec(cfg: DictConfig) -> TokenizerSpec:
    return TokenizerSpec(path=str(cfg.model.path), revision=cfg.model.revision,
                         trust_remote_code=bool(cfg.model.trust_remote_code), cache_dir=cfg.paths.hf_cache)


def _units(cfg: DictConfig) -> list[str]:
    return list(cfg.dataset.sources)


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    settings = render_settings(cfg, unit)
    return {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(str(cfg.model.path), cfg.model.revision),
        # None = the tokenizer's own template, already covered by the tokenizer identity.
        "template_sha256": settings.template_sha256,
        "thinking": settings.thinking,
        "max_len": settings.max_len,
        "overlength": settings.overlength,
        "answer_ids": settings.answer_ids,
    }


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    # Imported here: the upstream stages import heavier modules and may import this one.
    upstream: UnitStage
    if cfg.dataset.sources[unit].track == TRACK_PROMPT_ONLY:
        from eagle3.stages.generate import GENERATE as upstream
    else:
        from eagle3.stages.prep import PREP as upstream
    return {"conversations": require(upstream, cfg, ctx, unit)}


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    upstream = _unit_inputs(cfg, ctx, unit)["conversations"]
    extra = tokenize_unit(out, upstream.directory / CONVERSATIONS_FILE, upstream.counts.get("out"), unit,
                          render_settings(cfg, unit), _tokenizer_spec(cfg), int(cfg.tokenize.num_workers),
                          int(cfg.tokenize.chunk_size), TOKENIZED_FILE)
    return {**extra, "template": cfg.model.training_chat_template}


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
