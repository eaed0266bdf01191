"""The draft's shape, derived from the target's config with per-field overrides, and what engines refuse of it.

The same dataclass is written into checkpoints and exported `config.json` files, so a draft
can be rebuilt without the Hydra config that trained it. `geometry_refusals` is the one list of
geometries an engine cannot serve as trained: the export (`eagle3.draft.export_format`) raises
the first, stage train leaves out the engines that refuse, and config validation
(`config_geometry`, torch-free) reports them before any stage runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Optional

from omegaconf.errors import OmegaConfBaseException

from eagle3.config.schema import ModelConfig
from eagle3.draft.options import (
    ATTENTION_LLAMA,
    ATTENTION_MLA,
    ATTENTIONS,
    LAYER_VARIANTS,
    VARIANT_ENGINES,
    variant_engines_refusing,
)
from eagle3.engines import ENGINE_MAX_DRAFT_LAYERS
from eagle3.layer_ids import (
    ENGINE_NUM_CAPTURES,
    ENGINES,
    default_capture_layers,
    engine_aux_layer_ids,
    lowest_capture,
)
from eagle3.target_info import read_config


@dataclass(frozen=True)
class DraftGeometry:
    """Everything that fixes the draft's tensor shapes and positional encoding.

    Attributes:
        hidden_size: H (the target's hidden size unless overridden).
        num_attention_heads / num_key_value_heads / head_dim: attention shape; q/k/v read 2H.
        intermediate_size: MLP width.
        fc_in_features: len(capture_layers) * target hidden (what the serving engine feeds fc).
        vocab_size: The target's vocabulary (engines check it against the target).
        draft_vocab_size: Rows of the draft's lm_head.
        capture_layers: Target capture indices (residual entering layer i).
        target_num_layers: For engines that recompute defaults from it.
        num_layers: The draft's decoder layers (`model.draft.num_layers`); 1 is what SGLang serves.
        norm_before_residual / norm_before_fc / fc_norm / norm_output: the layer variant
            (`eagle3.draft.options.LAYER_VARIANTS`: what each changes, which engines serve it).
        attention: `eagle3.draft.options.ATTENTIONS`; llama uses the head fields above, mla the
            MLA fields below (0 for a llama draft) and the heads (`num_key_value_heads` = heads:
            after kv_b_proj every head has its own keys).
        q_lora_rank / kv_lora_rank: MLA's query and key/value compression ranks.
        qk_nope_head_dim / qk_rope_head_dim / v_head_dim: MLA's per-head key split (no rope |
            rope, the rope part shared by all heads) and value width.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    fc_in_features: int
    vocab_size: int
    draft_vocab_size: int
    capture_layers: tuple[int, ...]
    target_num_layers: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    num_layers: int = 1
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    attention: str = ATTENTION_LLAMA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys: head_dim (llama), nope + rope (mla)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def is_mla(self) -> bool:
        return self.attention == ATTENTION_MLA

    def variants(self) -> dict[str, bool]:
        """The layer-variant flags, `{name: bool}` in `LAYER_VARIANTS` order."""
        return {name: bool(getattr(self, name)) for name in LAYER_VARIANTS}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["capture_layers"] = list(self.capture_layers)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftGeometry:
        data = dict(data)
        data["capture_layers"] = tuple(data["capture_layers"])
        return cls(**data)


#: The MLA fields a draft with `attention: mla` takes from the target's config.json (or `model.draft`).
#: A null target `q_lora_rank` (DeepSeek-V2-Lite) is not one: the engines' MLA draft layers need a
#: query rank, so the draft then uses `kv_lora_rank` unless `model.draft.q_lora_rank` says otherwise.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _mla_fields(target_cfg: Mapping[str, Any], o: Mapping[str, Any]) -> dict[str, int]:
    """The MLA geometry: `model.draft` overrides, else the target's; refuses an incomplete one."""
    values: dict[str, Any] = {name: o.get(name) or target_cfg.get(name) for name in MLA_FIELDS}
    if not values["q_lora_rank"]:
        values["q_lora_rank"] = values["kv_lora_rank"]
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise ValueError(f"model.draft.attention: found {ATTENTION_MLA!r} for a target without MLA geometry "
                         f"(its config.json has no {', '.join(missing)}); valid: {ATTENTION_LLAMA}, or "
                         f"{ATTENTION_MLA} with model.draft.{{{','.join(missing)}}} set")
    return {name: int(value) for name, value in values.items()}


def _rope(cfg: Mapping[str, Any]) -> tuple[float, Optional[dict]]:
    """Rope theta and scaling from either transformers layout (`rope_parameters` is v5's)."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return float(theta), scaling


def geometry_from_target(target_cfg: Mapping[str, Any], capture_layers, draft_vocab_size: int,
                         overrides: Optional[Mapping[str, Any]] = None) -> DraftGeometry:
    """The draft geometry for a target config dict; `overrides` (model.draft) win when set.

    The draft's rope follows the target's theta but never its scaling: a Llama decoder layer
    cannot reproduce MLA/yarn rotary details, and serving engines build the draft's rope from
    the draft config alone, so what is written here is what is served.
    """
    o = {k: v for k, v in dict(overrides or {}).items() if v is not None}
    hidden = int(o.get("hidden_size") or target_cfg["hidden_size"])
    heads = int(o.get("num_attention_heads") or target_cfg.get("num_attention_heads") or max(1, hidden // 128))
    kv_heads = int(o.get("num_key_value_heads") or target_cfg.get("num_key_value_heads") or heads)
    reshaped = hidden != int(target_cfg["hidden_size"]) or "num_attention_heads" in o
    head_dim = hidden // heads if reshaped else int(target_cfg.get("head_dim") or hidden // heads)
    theta, _ = _rope(target_cfg)
    capture = tuple(int(i) for i in capture_layers)
    variants: dict[str, Any] = {name: bool(o.get(name, False)) for name in LAYER_VARIANTS}
    attention = str(o.get("attention") or ATTENTION_LLAMA)
    if attention not in ATTENTIONS:
        raise ValueError(f"model.draft.attention: found {attention!r}, valid: {', '.join(ATTENTIONS)}")
    mla: dict[str, Any] = {}
    if attention == ATTENTION_MLA:
        mla = {"attention": attention, **_mla_fields(target_cfg, o)}
        kv_heads = heads  # kv_b_proj gives every head its own keys and values
    return DraftGeometry(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(o.get("intermediate_size") or target_cfg.get("intermediate_size") or 4 * hidden),
        fc_in_features=int(o.get("fc_in_features") or len(capture) * int(target_cfg["hidden_size"])),
        vocab_size=int(target_cfg["vocab_size"]),
        draft_vocab_size=int(draft_vocab_size),
        capture_layers=capture,
        target_num_layers=int(target_cfg["num_hidden_layers"]),
        rms_norm_eps=float(target_cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(o.get("rope_theta") or theta),
        rope_scaling=None,
        max_position_embeddings=int(o.get("max_position_embeddings")
                                    or target_cfg.get("max_position_embeddings", 4096)),
        hidden_act=str(target_cfg.get("hidden_act", "silu")),
        num_layers=int(o.get("num_layers") or 1),
        **variants,
        **mla,
    )


def config_geometry(model: ModelConfig | Mapping[str, Any]) -> DraftGeometry:
    """The geometry stage train builds for the config's `model`, without torch or the hub.

    The target's fields come from its local `config.json` when `model.path` is a directory (as
    train reads them), else from `model.num_layers` / `hidden_size` / `vocab_size`. An
    `fc_in_features` that is not len(capture_layers) x the target's hidden size is left out (the
    derived one is used): config validation reports it under its own key, and the geometry rules
    then judge the rest as it would be once that is fixed.

    Raises:
        KeyError, TypeError, ValueError, ZeroDivisionError: values no geometry can be made of
            (config validation reports those keys on their own).
    """
    if is_dataclass(model):
        model = asdict(model)
    assert isinstance(model, Mapping)  # a ModelConfig is one once asdict made it a dict
    target = read_config(str(model["path"]), model.get("text_config_key")) or {
        "num_hidden_layers": model["num_layers"], "hidden_size": model["hidden_size"],
        "vocab_size": model["vocab_size"]}
    draft = dict(model.get("draft") or {})
    if draft.get("fc_in_features") != len(model["capture_layers"]) * int(target["hidden_size"]):
        draft["fc_in_features"] = None
    return geometry_from_target(target, model["capture_layers"], int(draft["vocab_size"]), draft)


@dataclass(frozen=True)
class GeometryRefusal:
    """Why an engine cannot serve a geometry as trained: one field, what it holds, what would do.

    Attributes:
        field: The `DraftGeometry` field at fault.
        found: Its value, as the messages show it.
        expected: What would be served (written to read after "expected" and after "valid:").
        why: What the engine would do with it instead.
    """

    field: str
    found: str
    expected: str
    why: str

    @property
    def config_key(self) -> str:
        """The config key that sets `field` (the target's own fields: `model.path`)."""
        return _CONFIG_KEYS.get(self.field, f"model.draft.{self.field}")

    def message(self) -> str:
        """`found X, expected Y (why)`, the tail of the export's one-line error."""
        return f"found {self.found}, expected {self.expected} ({self.why})"


# Geometry fields whose config key is not `model.draft.<field>`; `model.path` = the target's config.json.
_CONFIG_KEYS = {"capture_layers": "model.capture_layers", "draft_vocab_size": "model.draft.vocab_size",
                "hidden_act": "model.path", "rope_scaling": "model.path"}


def _capture_refusals(g: DraftGeometry, engine: str) -> list[GeometryRefusal]:
    capture, n_layers = list(g.capture_layers), g.target_num_layers
    valid_ids = f"ids in [0, {n_layers - 1}], e.g. {default_capture_layers(n_layers)}"
    if not capture:
        return [GeometryRefusal("capture_layers", "[]", f"at least one layer: {valid_ids}",
                                "the draft's fc reads the captured layers")]
    out = [GeometryRefusal("capture_layers", str(capture), valid_ids,
                           f"layer {layer} is out of range for a {n_layers}-layer model "
                           "(capture i = the residual stream entering decoder layer i)")
           for layer in capture if not 0 <= layer < n_layers][:1]
    if capture != sorted(set(capture)):
        out.append(GeometryRefusal("capture_layers", str(capture), "strictly increasing layers without repeats",
                                   "one target hidden state per captured layer, in layer order"))
    wanted = ENGINE_NUM_CAPTURES[engine]
    if wanted is not None and len(capture) != wanted:
        out.append(GeometryRefusal("capture_layers", f"{len(capture)} layers {capture}",
                                   f"{wanted} layers for {engine}",
                                   f"{engine}'s llama_eagle3 builds fc as Linear({wanted} * target_hidden_size, H) "
                                   "whatever the config says; "
                                   + ", ".join(e for e, n in ENGINE_NUM_CAPTURES.items() if n is None)
                                   + " reads any number"))
    low = lowest_capture(engine)
    if 0 <= min(capture) < low:  # a negative capture is out of range above
        ids = engine_aux_layer_ids(capture, engine)
        out.append(GeometryRefusal("capture_layers", f"{capture} ({engine} ids {ids})",
                                   f"layers >= {low} for {engine}",
                                   f"{engine} adds {low} to the ids it reads, so capture {min(capture)} has no id"))
    if g.fc_in_features % len(capture):
        out.append(GeometryRefusal("fc_in_features", str(g.fc_in_features),
                                   f"a multiple of len(capture_layers)={len(capture)}",
                                   "one target hidden state per captured layer"))
    return out


def geometry_refusals(g: DraftGeometry, engine: str, include_embedding: bool = False) -> list[GeometryRefusal]:
    """Every reason `engine` cannot serve `g` as trained (empty: it can), in the order checked.

    Args:
        include_embedding: Whether the export carries the draft's own `embed_tokens` (stage train's
            never does: the draft trains on the target's frozen embedding).
    """
    out = _capture_refusals(g, engine)
    most = ENGINE_MAX_DRAFT_LAYERS[engine]
    if most is not None and g.num_layers > most:
        out.append(GeometryRefusal("num_layers", str(g.num_layers), f"{most} for {engine}",
                                   f"{engine}'s llama_eagle3 raises 'EAGLE3 currently only supports {most} layer'; "
                                   + ", ".join(e for e, n in ENGINE_MAX_DRAFT_LAYERS.items() if n is None)
                                   + " serves any number"))
    if g.is_mla and g.norm_before_fc:
        out.append(GeometryRefusal("norm_before_fc", "true with attention mla", "false",
                                   "the engines' MLA drafts (Eagle3DeepseekV2ForCausalLM) have no input_norm "
                                   "and would run fc on the raw states"))
    for name in variant_engines_refusing(g.variants(), [engine]).get(engine, []):
        if g.is_mla and name == "norm_before_fc":
            continue  # refused above for every engine
        out.append(GeometryRefusal(name, "true", f"false for {engine}",
                                   f"{engine}'s llama_eagle3 has no such option and would run the plain layer; "
                                   f"{'/'.join(VARIANT_ENGINES[name])} serves it"))
    if g.norm_before_fc and g.fc_norm:
        out.append(GeometryRefusal("fc_norm", "true with norm_before_fc true", "false, or norm_before_fc false",
                                   "fc_norm normalises each captured state before fc and norm_before_fc their "
                                   "concatenation: set one"))
    if g.hidden_act != "silu":
        out.append(GeometryRefusal("hidden_act", repr(g.hidden_act), "'silu'",
                                   "the draft MLP is SiLU-gated; the engine would apply the written activation"))
    if g.rope_scaling is not None:
        out.append(GeometryRefusal("rope_scaling", json.dumps(g.rope_scaling), "null",
                                   "the draft trains with plain rope; the engine would apply the scaling"))
    if g.draft_vocab_size > g.vocab_size:
        out.append(GeometryRefusal("draft_vocab_size", str(g.draft_vocab_size), f"<= {g.vocab_size}",
                                   f"larger than the target vocab ({g.vocab_size})"))
    target_hidden = g.fc_in_features // max(len(g.capture_layers), 1)  # unknown without captures
    if not include_embedding and g.capture_layers and g.hidden_size != target_hidden:
        out.append(GeometryRefusal("hidden_size", str(g.hidden_size),
                                   f"{target_hidden} (the target's hidden size, fc_in_features / captures)",
                                   "the draft reads the target's embedding, which the engines share with it only "
                                   "at equal width (an export with include_embedding=True carries its own)"))
    return out


def engines_refusing(g: DraftGeometry, engines=ENGINES,
                     include_embedding: bool = False) -> dict[str, list[GeometryRefusal]]:
    """`{engine: its refusals}` for the engines of `engines` that cannot serve `g` (`geometry_refusals`)."""
    refused = {engine: geometry_refusals(g, engine, include_embedding) for engine in engines}
    return {engine: why for engine, why in refused.items() if why}


def config_refusals(model: ModelConfig | Mapping[str, Any]) -> dict[str, list[GeometryRefusal]]:
    """`engines_refusing` for the draft stage train would build from the config's `model`
    (`config_geometry`); empty when its values make no geometry (their own rules report them).

    A mapping (a plain dict, or a composed node whose values resolve as they are read) is taken too:
    a value it cannot resolve raises OmegaConf's error, which counts as no geometry.
    """
    try:
        g = config_geometry(model)
    except (OmegaConfBaseException, KeyError, TypeError, ValueError, ZeroDivisionError):
        return {}
    return engines_refusing(g, ENGINES)
