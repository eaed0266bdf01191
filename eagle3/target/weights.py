"""The target tensors used without loading the target: input embedding, output head, final norm.

Training needs the embedding (frozen, copied into the draft) and the lm_head (the teacher's
logits); states taken from a serving engine need the final norm (vLLM hands out the residual
before it). Loading a 1 T-parameter target to get them would take hours, so they are
read straight from the checkpoint's safetensors files (only the shards that hold them).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open

from eagle3.errors import Eagle3Error
from eagle3.target_info import read_config, resolve_dir

log = logging.getLogger("eagle3")

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class TargetWeightsError(Eagle3Error):
    """The target checkpoint lacks an embedding or head we can identify."""


def _weight_map(root: Path) -> dict[str, str]:
    if (root / INDEX_NAME).is_file():
        return json.loads((root / INDEX_NAME).read_text())["weight_map"]
    if (root / SINGLE_NAME).is_file():
        with safe_open(str(root / SINGLE_NAME), "pt") as fh:
            return {name: SINGLE_NAME for name in fh.keys()}
    raise TargetWeightsError(f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME}; the draft needs the target's "
                             "embedding and lm_head from safetensors files")


def _pick(names: list[str], suffix: str, text_config_key: Optional[str]) -> Optional[str]:
    """The tensor ending in `suffix`; with several (multimodal wrappers), prefer the language model's."""
    hits = [n for n in names if n == suffix or n.endswith("." + suffix)]
    if len(hits) > 1:
        preferred = [n for n in hits if "language_model" in n or (text_config_key and text_config_key in n)]
        hits = preferred or sorted(hits, key=len)
    return hits[0] if hits else None


def load_embedding_and_head(path: str, *, revision: Optional[str] = None, cache_dir: Optional[str] = None,
                            text_config_key: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Target `embed_tokens` and `lm_head` weights, both `[V, H]` float32.

    A tied model (no lm_head tensor and `tie_word_embeddings`) returns the embedding twice.

    Raises:
        TargetWeightsError: Either tensor cannot be found; the message lists candidates.
    """
    root = resolve_dir(path, revision, cache_dir)
    weight_map = _weight_map(root)
    names = sorted(weight_map)
    embed_name = _pick(names, "embed_tokens.weight", text_config_key)
    head_name = _pick(names, "lm_head.weight", text_config_key)
    tied = bool((read_config(root, text_config_key) or {}).get("tie_word_embeddings", False))
    if embed_name is None or (head_name is None and not tied):
        hint = [n for n in names if "embed" in n or "head" in n][:6]
        raise TargetWeightsError(f"{root}: cannot find the target's embed_tokens/lm_head tensors "
                                 f"(candidates: {hint or 'none'})")

    def read(name: str) -> torch.Tensor:
        file = root / weight_map[name]
        if not file.is_file():
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(path, weight_map[name], revision=revision, cache_dir=cache_dir))
        with safe_open(str(file), "pt") as fh:
            return fh.get_tensor(name).float()

    embed = read(embed_name)
    head = embed if head_name is None else read(head_name)
    return embed, head


def load_final_norm(path: str, *, revision: Optional[str] = None, cache_dir: Optional[str] = None,
                    text_config_key: Optional[str] = None) -> tuple[torch.Tensor, float]:
    """The target's final RMSNorm as `rms_norm` applies it: its scale `[H]` (float32) and `rms_norm_eps`.

    The scale is the stored weight, plus one for a family whose norm multiplies by `1 + weight`
    (Gemma, Qwen3-Next): applied as stored, such a target's teacher logits would be silently wrong.

    Raises:
        TargetWeightsError: No `norm.weight` tensor outside the decoder layers.
    """
    root = resolve_dir(path, revision, cache_dir)
    weight_map = _weight_map(root)
    names = sorted(n for n in weight_map if ".layers." not in n)
    name = _pick(names, "norm.weight", text_config_key)
    if name is None:
        raise TargetWeightsError(f"{root}: cannot find the target's final norm.weight (outside the layers: "
                                 f"{[n for n in names if 'norm' in n][:6] or 'none'})")
    config = read_config(root, text_config_key) or {}
    eps = config.get("rms_norm_eps")
    if eps is None:
        raise TargetWeightsError(f"{root}/config.json has no rms_norm_eps: the final norm cannot be applied exactly")
    file = root / weight_map[name]
    if not file.is_file():
        from huggingface_hub import hf_hub_download

        file = Path(hf_hub_download(path, weight_map[name], revision=revision, cache_dir=cache_dir))
    with safe_open(str(file), "pt") as fh:
        weight = fh.get_tensor(name).float()
    return (weight + 1.0 if norm_adds_one(config) else weight), float(eps)


def norm_adds_one(config: dict[str, Any]) -> bool:
    """Whether the family's RMSNorm scales by `1 + weight` rather than `weight`.

    Asked of transformers' own final-norm module of the family (a one-layer skeleton on the meta
    device; its norm alone materialised with a zero weight and run on ones: 0 for Llama's
    convention, 1 for Gemma's), so a family nobody listed is answered by its own code. A config
    transformers cannot build (no `model_type`, remote code) is taken as the common convention,
    with a warning.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = config.get("model_type")
    hidden = config.get("hidden_size")
    if not isinstance(model_type, str) or not isinstance(hidden, int):
        return False
    full = {k: v for k, v in config.items() if k not in _NOT_FOR_A_SKELETON and not isinstance(v, dict)}
    # One layer is enough (the final norm does not depend on the depth) and cheap for a 1 T model; a
    # family with other per-layer lists may refuse it, so the whole depth (still on meta) comes next.
    one_layer = {**full, "num_hidden_layers": 1}
    if isinstance(full.get("layer_types"), list):
        one_layer["layer_types"] = full["layer_types"][:1]
    error: Exception | None = None
    for keys in (one_layer, full):
        try:
            skeleton_config = AutoConfig.for_model(model_type, **keys)
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(skeleton_config)
            norm = skeleton.get_decoder().norm.to_empty(device="cpu")
            with torch.no_grad():
                norm.weight.zero_()
                return bool(norm(torch.ones(1, hidden)).abs().mean() > 0.5)
        except Exception as err:  # noqa: BLE001 - any failure means "not answerable", reported below
            error = err
    log.warning("target family %r: its final norm's convention could not be checked (%s: %s); "
                "applying the weight as stored (Llama's convention)", model_type, type(error).__name__, error)
    return False


# Keys a config.json may carry that a skeleton must not act on (quantization, remote code, dtype).
_NOT_FOR_A_SKELETON = frozenset({"model_type", "architectures", "auto_map", "quantization_config", "torch_dtype",
                                 "dtype", "transformers_version"})


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama/DeepSeek RMSNorm: normalise in float32, scale in `x`'s dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * normed.to(x.dtype)
