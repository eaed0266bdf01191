"""The config rules of the target model, the draft and its training (`model.*`, `train.*`, `eval.*`).

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`;
each appends one line per mistake to the shared `ConfigErrors`. They encode the failures that cost real
projects weeks (docs/design.md, 'Facts the code relies on'): capture ids off by one or out of range, an
fc layer whose input width does not match the captured states, a draft no engine serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from eagle3.config.checks import ConfigErrors, value_at
from eagle3.config.schema import Eagle3Config, EvalConfig, ModelConfig, OptimizerConfig, TrainConfig
from eagle3.draft.geometry import MLA_FIELDS, config_geometry, config_refusals
from eagle3.draft.options import (
    ATTENTION_MLA,
    ATTENTIONS,
    HIDDEN_STATE_MODES,
    LOSSES,
    LR_SCHEDULES,
    OUT_OF_VOCAB_POLICIES,
    PRECISIONS,
    STEP_WEIGHTS,
    STRATEGIES,
    TEACHERS,
)
from eagle3.dtypes import DTYPES
from eagle3.engines import ENGINES
from eagle3.target_info import HF_CONFIG_KEYS, TargetConfigError, target_config


def check_model(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`model.*`: the target's facts (against its config.json when one can be read offline) and the draft's geometry."""
    _check_model(cfg.model, err, cfg.paths.hf_cache)


def _check_model(model: ModelConfig, err: ConfigErrors, hf_cache: Optional[str] = None) -> None:
    err.choice("model.dtype", model.dtype, DTYPES)
    err.positive("model.num_layers", model.num_layers)
    err.positive("model.hidden_size", model.hidden_size)
    err.positive("model.vocab_size", model.vocab_size)
    _check_draft_geometry(model, err)
    draft = model.draft
    err.positive("model.draft.vocab_size", draft.vocab_size)
    err.positive("model.draft.num_layers", draft.num_layers)  # the engines' limits: geometry_refusals

    template = model.training_chat_template
    if template is not None and not Path(template).is_file():
        err.add("model.training_chat_template", template, "file not found", "a path to a .jinja file or null")

    # Offline: a local checkpoint, or the json files of a hub id the hub cache holds (model=auto fetched them).
    try:
        hf_config = target_config(model.path, model.revision, model.text_config_key, hf_cache,
                                  local_files_only=True).values
    except TargetConfigError:
        hf_config = None
    if hf_config is not None:
        for key, hf_key in HF_CONFIG_KEYS.items():
            actual = hf_config.get(hf_key)
            value = getattr(model, key)
            if actual is not None and actual != value:
                err.add(f"model.{key}", value, f"{model.path}/config.json says {hf_key}={actual}", str(actual))
        if hf_config.get("auto_map") and not model.trust_remote_code:
            err.add("model.trust_remote_code", False,
                    f"{model.path}/config.json needs custom code (auto_map)",
                    "true, if you trust that code")
    tokenizer_config = Path(str(model.path)).expanduser() / "tokenizer_config.json"
    if not model.trust_remote_code and tokenizer_config.is_file() \
            and "AutoTokenizer" in (_json_or_empty(tokenizer_config).get("auto_map") or {}):
        # transformers then substitutes a tokenizer converted from the vocabulary files, whose
        # pre-tokenizer need not be the checkpoint's (Kimi's tiktoken pattern): other ids, no error.
        err.add("model.trust_remote_code", False,
                f"{tokenizer_config} names its own tokenizer code (auto_map.AutoTokenizer); without it "
                "transformers loads a converted tokenizer that may split text differently",
                "true, if you trust that code")


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _check_draft_geometry(model: ModelConfig, err: ConfigErrors) -> None:
    """The draft stage train would build must be one the export writes for some engine.

    The geometry rules are the export's own (`eagle3.draft.geometry.geometry_refusals`), run on
    the geometry train builds from this config; a draft that only some engines refuse is trained
    and exported for the others, and refused where a stage serves it on one of those
    (`eagle3.serving.rules.check_chain_draft_engine`).
    """
    err.choice("model.draft.attention", model.draft.attention, ATTENTIONS)
    if model.draft.attention == ATTENTION_MLA:
        try:
            config_geometry(model)
        except ValueError as exc:
            if str(exc).startswith("model.draft.attention:"):  # the target has no MLA geometry
                missing = str(exc).split("has no ", 1)[1].split(")", 1)[0]
                err.add("model.draft.attention", ATTENTION_MLA,
                        f"the target {model.path} has no MLA geometry (its config.json lacks {missing})",
                        f"llama, or mla with model.draft.{{{','.join(MLA_FIELDS)}}} set")
                return
    layers, fc_in = list(model.capture_layers), model.draft.fc_in_features
    if fc_in is not None and layers and fc_in != len(layers) * model.hidden_size:
        # The engines feed fc one TARGET hidden state per captured layer, whatever the draft's width.
        expected = len(layers) * model.hidden_size
        err.add("model.draft.fc_in_features", fc_in, f"the draft's fc reads len(capture_layers) x hidden = "
                f"{len(layers)} x {model.hidden_size} = {expected} features", str(expected))
    refused = config_refusals(model)
    if len(refused) < len(ENGINES):
        return
    shared = [r for r in refused[ENGINES[0]] if all(r in why for why in refused.values())]
    lines = [("", r) for r in shared] or [(f"{engine}: ", r) for engine, why in refused.items() for r in why]
    for prefix, r in lines:
        why = r.why if r.config_key != "model.path" else f"its config.json says {r.field}={r.found}: {r.why}"
        err.add(r.config_key, value_at(model, r.config_key.removeprefix("model.")), prefix + why, r.expected)


def check_train(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`train.*` in range, each choice one `eagle3.draft.options` lists."""
    tr: TrainConfig = cfg.train
    err.choice("train.hidden_states", tr.hidden_states, HIDDEN_STATE_MODES)
    err.positive("train.hybrid_store_gb", tr.hybrid_store_gb, allow_none=True)
    err.positive("train.ttt_steps", tr.ttt_steps)
    if not 0 < tr.ttt_decay <= 1:
        err.add("train.ttt_decay", tr.ttt_decay, "weights decay^k must shrink or stay", "(0, 1]")
    err.choice("train.out_of_vocab", tr.out_of_vocab, OUT_OF_VOCAB_POLICIES)
    err.choice("train.teacher", tr.teacher, TEACHERS)
    err.choice("train.loss", tr.loss, LOSSES)
    err.choice("train.step_weights", tr.step_weights, STEP_WEIGHTS)
    if not 0 <= tr.dpace_smoothing <= 1:
        err.add("train.dpace_smoothing", tr.dpace_smoothing, "a step's acceptance a enters D-PACE as (1 - s) a + s",
                "[0, 1]")
    if not 0 <= tr.state_noise < 10:
        err.add("train.state_noise", tr.state_noise, "noise std as a multiple of the states' RMS", "[0, 10)")
    err.choice("train.lr_schedule", tr.lr_schedule, LR_SCHEDULES)
    if not 0 <= tr.min_lr_ratio <= 1:
        err.add("train.min_lr_ratio", tr.min_lr_ratio, "the final LR as a fraction of train.optimizer.lr", "[0, 1]")
    err.choice("train.strategy", tr.strategy, STRATEGIES)
    err.choice("train.precision", tr.precision, PRECISIONS)
    err.positive("train.batch_tokens", tr.batch_tokens)
    if not 0 <= tr.warmup_ratio < 1:
        err.add("train.warmup_ratio", tr.warmup_ratio, "a fraction of the steps", "[0, 1)")
    err.not_negative("train.grad_clip", tr.grad_clip, ">= 0 (0 = off)")
    err.not_negative("train.checkpoint_every_n_steps", tr.checkpoint_every_n_steps, ">= 0 (0 = at epoch ends only)")
    err.positive("train.attention_block", tr.attention_block)
    err.not_negative("train.logits_memory_gb", tr.logits_memory_gb, ">= 0 (0 = recompute every TTT step's logits)")
    err.positive("train.log_every_n_steps", tr.log_every_n_steps)
    err.not_negative("train.progress_every_s", tr.progress_every_s, ">= 0 (0 = one line per epoch)")
    err.positive("train.eval_every_n_epochs", tr.eval_every_n_epochs)
    err.choice("train.export_dtype", tr.export_dtype, DTYPES)
    err.not_negative("train.num_workers", tr.num_workers, ">= 0 (0 = load in the training process)")
    _check_optimizer(tr.optimizer, err)
    if tr.max_epochs < 1 and tr.max_steps < 1:
        err.add("train.max_epochs", tr.max_epochs, "with max_steps <= 0 training would never stop",
                ">= 1, or set train.max_steps")


def _check_optimizer(opt: OptimizerConfig, err: ConfigErrors) -> None:
    """The schema's optimizer arguments in their ranges (a negative LR trains away from the target)."""
    err.positive("train.optimizer.lr", opt.lr)
    betas = list(opt.betas or [])
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        err.add("train.optimizer.betas", betas, "Adam's two moment decays", "two numbers in [0, 1), e.g. [0.9, 0.95]")
    err.not_negative("train.optimizer.weight_decay", opt.weight_decay)


def check_eval(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`eval.*`: the draft lengths and decoding budget eval measures acceptance with."""
    ev: EvalConfig = cfg.eval
    if not ev.ks or any(int(k) < 1 for k in ev.ks):
        err.add("eval.ks", list(ev.ks), "draft lengths to evaluate must be positive", "e.g. [3, 5]")
    err.positive("eval.max_new_tokens", ev.max_new_tokens)
    err.not_negative("eval.num_prompts", ev.num_prompts, ">= 0 (0 = skip real decoding)")
