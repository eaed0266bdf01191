"""The one place where capture layer ids are converted for serving engines.

Capture index i means "the residual stream entering decoder layer i", which is HF
`output_hidden_states[i]`. Engines read the draft's `eagle_config.eagle_aux_hidden_state_layer_ids`
differently: SGLang adds 1 before capturing, vLLM uses the ids as written. Getting this wrong is
silent (the draft trains on one layer and is served another), so every writer of a draft config
goes through these functions.
"""

from __future__ import annotations

from typing import Sequence

ENGINES = ("sglang", "vllm")


def engine_aux_layer_ids(capture_layers: Sequence[int], engine: str) -> list[int]:
    """Ids to write into the draft config for `engine` so it captures `capture_layers`."""
    if engine == "sglang":
        return [int(i) - 1 for i in capture_layers]
    if engine == "vllm":
        return [int(i) for i in capture_layers]
    raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")


def capture_layers_from_engine_ids(ids: Sequence[int], engine: str) -> list[int]:
    """Inverse of `engine_aux_layer_ids`: what a draft config's ids capture on `engine`."""
    if engine == "sglang":
        return [int(i) + 1 for i in ids]
    if engine == "vllm":
        return [int(i) for i in ids]
    raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")


def default_capture_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default capture for an L-layer target: [2, L//2, L-3]."""
    return [2, num_layers // 2, num_layers - 3]
