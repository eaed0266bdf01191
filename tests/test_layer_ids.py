"""Pins the capture-id conventions of SGLang (capture-1) and vLLM (as written)."""

import pytest

from eagle3.layer_ids import capture_layers_from_engine_ids, default_capture_layers, engine_aux_layer_ids


def test_kimi_capture_ids_per_engine():
    assert default_capture_layers(61) == [2, 30, 58]
    assert engine_aux_layer_ids([2, 30, 58], "sglang") == [1, 29, 57]
    assert engine_aux_layer_ids([2, 30, 58], "vllm") == [2, 30, 58]


def test_round_trip_and_unknown_engine():
    for engine in ("sglang", "vllm"):
        assert capture_layers_from_engine_ids(engine_aux_layer_ids([2, 4, 5], engine), engine) == [2, 4, 5]
    with pytest.raises(ValueError, match="valid: sglang, vllm"):
        engine_aux_layer_ids([2], "trtllm")
