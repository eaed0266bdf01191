"""The draft's shape, derived from the target's config with per-field overrides.

The same dataclass is written into checkpoints and exported `config.json` files, so a draft
can be rebuilt without the Hydra config that trained it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from eagle3.draft.options import LAYER_VARIANTS


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
        norm_before_residual / norm_before_fc / fc_norm / norm_output: the layer variant
            (`eagle3.draft.options.LAYER_VARIANTS`: what each changes, which engines serve it).
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
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    extra: dict = field(default_factory=dict)

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
        max_position_embeddings=int(o.get("max_position_embeddings") or target_cfg.get("max_position_embeddings", 4096)),
        hidden_act=str(target_cfg.get("hidden_act", "silu")),
        **{name: bool(o.get(name, False)) for name in LAYER_VARIANTS},
    )
