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


def test_sglang_deepseek_classes_read_ids_as_meant_only_when_the_first_capture_is_2():
    """SGLang 0.5.23's DeepSeek class adds 1 to the ids only when the first is 1 (models/deepseek_v2.py);
    Llama-family classes always do. Anything else captures one layer early, silently: refused."""
    from eagle3.layer_ids import sglang_capture_problem

    for arch in ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM"):
        assert sglang_capture_problem([2, 30, 58], [arch]) is None  # ids [1, 29, 57]: +1 applied
        assert sglang_capture_problem([3, 30, 58], [arch]) == (
            f"SGLang's {arch} adds 1 to the draft's capture ids only when the first is 1, so ids [2, 29, 57] "
            "would capture layers [2, 29, 57] instead of [3, 30, 58]")
    assert sglang_capture_problem([3, 30, 58], ["LlamaForCausalLM"]) is None
    assert sglang_capture_problem([3, 30, 58], []) is None  # unknown architecture: nothing to say


def test_serving_a_chain_draft_through_sglangs_deepseek_class_refuses_other_first_captures():
    from eagle3.cli import check_config
    from tests.conftest import compose_config

    bench = ["stage=bench", "server=sglang", "model=demo_kimi"]
    assert check_config(compose_config(bench)) == []
    assert check_config(compose_config([*bench, "model.capture_layers=[3,4,5]"])) == [
        "model.capture_layers: [3, 4, 5] -- SGLang's DeepseekV3ForCausalLM adds 1 to the draft's capture ids only "
        "when the first is 1, so ids [2, 3, 4] would capture layers [2, 3, 4] instead of [3, 4, 5]; valid: capture "
        "layers starting at 2 (e.g. [2, L//2, L-3]), or server=vllm"]
    assert check_config(compose_config(["stage=bench", "server=vllm_gpu", "model=demo_kimi",
                                        "model.capture_layers=[3,4,5]"])) == []  # vLLM reads the ids as written
    assert check_config(compose_config(["stage=bench", "server=sglang", "model.capture_layers=[3,4,5]"])) == []
