"""The one place where capture layer ids are converted for serving engines.

Capture index i means "the residual stream entering decoder layer i", which is HF
`output_hidden_states[i]`. Engines read the draft's `eagle_config.eagle_aux_hidden_state_layer_ids`
differently: SGLang adds 1 before capturing, vLLM uses the ids as written. Getting this wrong is
silent (the draft trains on one layer and is served another), so every writer of a draft config
goes through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from eagle3.engines import ENGINES, SGLANG, VLLM

# What each engine adds to an id of the draft config before capturing.
_ENGINE_OFFSET = {SGLANG: 1, VLLM: 0}
#: How many captured layers each engine's fc reads (None: any number). SGLang's
#: `models/llama_eagle3.py` builds fc as `Linear(3 * target_hidden_size, H)` whatever the config
#: says; vLLM 0.32's `model_executor/models/llama_eagle3.py` sizes it from the draft config's
#: `num_aux_hidden_states` (else the number of `eagle_config` ids, else 3), which its export writes.
ENGINE_NUM_CAPTURES = {SGLANG: 3, VLLM: None}


#: Target classes whose SGLang model adds 1 to the draft's capture ids only when the first id is 1 (SGLang
#: 0.5.23: models/deepseek_v2.py for DeepSeek-V2/V3/V3.2, kimi_k25.py delegating to it, glm4_moe_lite.py);
#: other first ids are captured as written, one layer early and silently. Every other class adds 1.
SGLANG_FIRST_ID_ONE_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                                     "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM")


def sglang_capture_problem(capture_layers: Sequence[int], architectures: Sequence[str]) -> Optional[str]:
    """Why SGLang would capture other layers than `capture_layers` for a target of `architectures`, or None.

    The ids written for SGLang are `capture - 1`; on the classes of `SGLANG_FIRST_ID_ONE_ARCHITECTURES`
    they are read as meant only when the first capture is 2 (its id 1).
    """
    capture = [int(i) for i in capture_layers]
    quirky = sorted(set(architectures) & set(SGLANG_FIRST_ID_ONE_ARCHITECTURES))
    if not quirky or not capture or capture[0] == 2:
        return None
    ids = engine_aux_layer_ids(capture, SGLANG)
    return (f"SGLang's {quirky[0]} adds 1 to the draft's capture ids only when the first is 1, so ids {ids} "
            f"would capture layers {ids} instead of {capture}")


def _offset(engine: str) -> int:
    if engine not in _ENGINE_OFFSET:
        raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    return _ENGINE_OFFSET[engine]


def lowest_capture(engine: str) -> int:
    """The lowest capture index `engine` can be given: its id for it must not be negative."""
    return _offset(engine)


def engine_aux_layer_ids(capture_layers: Sequence[int], engine: str) -> list[int]:
    """Ids to write into the draft config for `engine` so it captures `capture_layers`."""
    return [int(i) - _offset(engine) for i in capture_layers]


def capture_layers_from_engine_ids(ids: Sequence[int], engine: str) -> list[int]:
    """Inverse of `engine_aux_layer_ids`: what a draft config's ids capture on `engine`."""
    return [int(i) + _offset(engine) for i in ids]


def default_capture_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default capture for an L-layer target: [2, L//2, L-3]."""
    return [2, num_layers // 2, num_layers - 3]


def standard_capture_layers(num_layers: int) -> list[int]:
    """`default_capture_layers`, for targets where the rule gives distinct in-range layers in order.

    Targets under 7 layers get repeats ([2, 3, 3] at 6) or ids past the last layer, which no
    engine serves; such a target needs its capture layers chosen by hand.

    Raises:
        ValueError: The rule gives no strictly increasing ids in [0, num_layers - 1].
    """
    ids = default_capture_layers(num_layers)
    if ids != sorted(set(ids)) or not all(0 <= i < num_layers for i in ids):
        raise ValueError(f"the rule [2, L//2, L-3] gives {ids} for a {num_layers}-layer target, not strictly "
                         f"increasing layer ids in [0, {num_layers - 1}]")
    return ids
