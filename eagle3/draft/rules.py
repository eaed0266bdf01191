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
from eagle3.draft.options import ATTENTION_MLA, TTT_CHAINS_RESCORED
from eagle3.engines import ENGINES
from eagle3.target_info import HF_CONFIG_KEYS, TargetConfigError, target_config


def check_model(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`model.*`: the target's facts (against its config.json when one can be read offline) and the draft's geometry."""
    _check_model(cfg.model, err, cfg.paths.hf_cache)


def _check_model(model: ModelConfig, err: ConfigErrors, hf_cache: Optional[str] = None) -> None:
    _check_draft_geometry(model, err)

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
    """`train.*` across fields: the optimizer's betas, and a run that stops (each field's own range and
    choices are the schema's: `eagle3.config.fields`)."""
    tr: TrainConfig = cfg.train
    _check_optimizer(tr.optimizer, err)
    if tr.max_epochs < 1 and tr.max_steps < 1:
        err.add("train.max_epochs", tr.max_epochs, "with max_steps <= 0 training would never stop",
                ">= 1, or set train.max_steps")
    if tr.ttt_chains == TTT_CHAINS_RESCORED and tr.packing:
        err.add("train.packing", True, "train.ttt_chains=rescored scores each sample's chains as one prefix "
                "tree and reads right-padded rows", "false, or train.ttt_chains=all")


def _check_optimizer(opt: OptimizerConfig, err: ConfigErrors) -> None:
    """Adam's betas: a list the schema types only as floats."""
    betas = list(opt.betas or [])
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        err.add("train.optimizer.betas", betas, "Adam's two moment decays", "two numbers in [0, 1), e.g. [0.9, 0.95]")


def check_eval(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`eval.*`: the draft lengths and decoding budget eval measures acceptance with."""
    ev: EvalConfig = cfg.eval
    if not ev.ks or any(int(k) < 1 for k in ev.ks):
        err.add("eval.ks", list(ev.ks), "draft lengths to evaluate must be positive", "e.g. [3, 5]")
