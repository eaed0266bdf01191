"""Loading the target for extraction, and finding its decoder layers and final norm.

Extraction runs the *decoder* (the base model) and never the CausalLM head: the lm_head logits
would cost `[tokens, vocab]` (163840 wide for Kimi) for nothing the store keeps. Targets differ
in where the decoder lives (`model.model` for Llama, `language_model.model` inside the Kimi-K2.5
multimodal wrapper), so it is found structurally: the ModuleList of `num_hidden_layers` decoder
layers whose parent also owns a final norm and the token embedding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from eagle3.dtypes import torch_dtype

log = logging.getLogger("eagle3")

NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm")


@dataclass
class DecoderParts:
    """The pieces of a target that extraction touches.

    Attributes:
        base: The decoder module to call (embeddings -> layers -> final norm).
        layers: Its decoder layers, in order.
        norm: The final norm; its output is the teacher signal (HF `hidden_states[-1]`).
        hidden_size: H of the text model.
    """

    base: nn.Module
    layers: nn.ModuleList
    norm: nn.Module
    hidden_size: int

    @property
    def device(self) -> torch.device:
        return next(self.base.parameters()).device


def text_config(config: Any, text_config_key: Optional[str] = None) -> Any:
    """The language model's config: `config.<text_config_key>` (Kimi: text_config) or itself."""
    inner = getattr(config, text_config_key or "text_config", None)
    return inner if inner is not None else config


def find_decoder(model: nn.Module, text_config_key: Optional[str] = None) -> DecoderParts:
    """Locate decoder layers, final norm and the module to run, for any HF causal LM.

    Raises:
        ValueError: No ModuleList of `num_hidden_layers` modules sits next to a final norm and
            an embedding (the message lists what was found).
    """
    cfg = text_config(model.config, text_config_key)
    n_layers = int(cfg.num_hidden_layers)
    seen = []
    lists = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.ModuleList)]
    for name, layers in sorted(lists, key=lambda item: item[0].count(".")):
        seen.append(f"{name}[{len(layers)}]")
        if len(layers) != n_layers:
            continue
        parent_name = name.rpartition(".")[0]
        parent = model.get_submodule(parent_name) if parent_name else model
        norm = next((getattr(parent, n) for n in NORM_NAMES if isinstance(getattr(parent, n, None), nn.Module)), None)
        has_embedding = any(isinstance(m, nn.Embedding) for m in parent.children())
        if norm is not None and has_embedding:
            return DecoderParts(base=parent, layers=layers, norm=norm, hidden_size=int(cfg.hidden_size))
    raise ValueError(f"cannot find {n_layers} decoder layers beside a final norm ({', '.join(NORM_NAMES)}) "
                     f"and an embedding in {type(model).__name__}; module lists: {', '.join(seen) or 'none'}")


def load_target(path: str, *, dtype: str, trust_remote_code: bool, revision: Optional[str] = None,
                device_map: Optional[str] = None, cache_dir: Optional[str] = None,
                text_config_key: Optional[str] = None) -> DecoderParts:
    """Load a target with transformers and return its decoder parts, in eval mode.

    `trust_remote_code` is passed through only as configured (Kimi needs it; the demo target
    must not). Without `device_map` the model goes to the first GPU if there is one, else CPU.
    """
    from transformers import AutoModel, AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype), "trust_remote_code": trust_remote_code,
                              "revision": revision, "cache_dir": cache_dir}
    if device_map:
        kwargs["device_map"] = device_map  # needs `accelerate`
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ValueError as exc:  # a wrapper without a CausalLM auto mapping
        log.info("AutoModelForCausalLM cannot load %s (%s); trying AutoModel", path, str(exc).splitlines()[0])
        model = AutoModel.from_pretrained(path, **kwargs)
    if not device_map:
        model.to("cuda" if torch.cuda.is_available() else "cpu")  # type: ignore[arg-type]  # transformers' @wraps(nn.Module.to) types .to unbound
    model.eval()
    parts = find_decoder(model, text_config_key)
    log.info("target %s: %d decoder layers, hidden %d, %s on %s", path, len(parts.layers),
             parts.hidden_size, dtype, parts.device)
    return parts


def check_geometry(parts: DecoderParts, num_layers: int, hidden_size: int) -> None:
    """The config's model.num_layers / hidden_size must match what was loaded."""
    if len(parts.layers) != num_layers or parts.hidden_size != hidden_size:
        raise ValueError(f"model config says {num_layers} layers x hidden {hidden_size}, the loaded "
                         f"target has {len(parts.layers)} x {parts.hidden_size}; fix model.num_layers / "
                         "model.hidden_size")

