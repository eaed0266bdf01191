"""Demo dataset generators: schema, determinism, nesting, held-out-ness, and the Kimi codec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eagle3
from eagle3.chat_formats import kimi as kf
from eagle3.demo import conversations as convs
from eagle3.demo import corpus
from eagle3.demo import datasets as ds
from tests.conftest import FIXTURES

TARGET = Path(eagle3.__file__).parent / "assets" / "demo_target"
TRAIN_KEYS = {corpus.record_key(r) for r in corpus.split_records("train")}
HELD_OUT_MODULES = {r["module"] for r in corpus.split_records("held_out")}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET)


def _assert_held_out(record: dict) -> None:
    for name in record["meta"]["functions"]:
        assert name not in TRAIN_KEYS
        assert any(name.startswith(m + ".") for m in HELD_OUT_MODULES)


def test_split_is_by_module_and_disjoint():
    train, held = corpus.split_records("train"), corpus.split_records("held_out")
    assert {r["module"] for r in train}.isdisjoint({r["module"] for r in held})
    assert 0.10 < len(held) / (len(train) + len(held)) < 0.25
    assert corpus.load_corpus().header["python"]  # provenance is recorded


def test_prompts_schema_and_style():
    for rec in ds.demo_prompts_records(200, seed=0):
        assert set(rec) == {"id", "conversations", "meta"}
        roles = [t["from"] for t in rec["conversations"]]
        body = roles[1:] if roles[0] == "system" else roles
        assert body == ["human", "gpt"] * (len(body) // 2) and body
        for turn in rec["conversations"]:
            assert isinstance(turn["value"], str) and turn["value"]
            assert "<think>" not in turn["value"] and "<|" not in turn["value"]
        _assert_held_out(rec)


def test_prompts_deterministic_nested_and_seeded():
    big = list(ds.demo_prompts_records(300, seed=7))
    assert list(ds.demo_prompts_records(300, seed=7)) == big
    assert list(ds.demo_prompts_records(37, seed=7)) == big[:37]
    assert [r["id"] for r in big[:3]] == ["demo_prompts-000000", "demo_prompts-000001", "demo_prompts-000002"]
    other = list(ds.demo_prompts_records(300, seed=8))
    assert other != big


def test_prompts_scale_to_20k_distinct():
    keys = {json.dumps(r["conversations"]) for r in ds.demo_prompts_records(20_000, seed=0)}
    assert len(keys) == 20_000


def test_parse_round_trips_template_rendering(tokenizer):
    """The template's suffix rendering of an assistant turn parses back to the same message."""
    for plan in convs.training_plans(40, seed=3, split="held_out"):
        conv = convs.kimi_conversation(plan)
        for i, msg in enumerate(conv["messages"]):
            if msg["role"] != "assistant":
                continue
            prompt = tokenizer.apply_chat_template(conv["messages"][:i], tools=conv.get("tools"),
                                                   add_generation_prompt=True, tokenize=False)
            tail = kf.assistant_tail(msg)
            if msg.get("tool_calls"):  # a trailing tool-call turn is rendered in the template's suffix
                full = tokenizer.apply_chat_template(conv["messages"][:i + 1], tools=conv.get("tools"),
                                                     tokenize=False)
                assert full == prompt + tail
            parsed = kf.parse_kimi_assistant(tail)
            assert parsed["content"] == msg["content"]
            assert parsed["reasoning_content"] == msg["reasoning_content"]
            assert parsed.get("tool_calls") == msg.get("tool_calls")
            # Generation starts after the prompt's "<think>"; the header form parses the same.
            assert kf.parse_kimi_assistant(kf.GENERATION_PROMPT + tail) == parsed


def test_parse_handles_truncation_and_history_form():
    assert kf.parse_kimi_assistant("half a thought") == {
        "role": "assistant", "content": "", "reasoning_content": "half a thought"}
    hist = kf.parse_kimi_assistant("<think></think>Answer.<|im_end|>[PAD][PAD]")
    assert hist == {"role": "assistant", "content": "Answer.", "reasoning_content": ""}
    cut = kf.parse_kimi_assistant("r</think><|tool_calls_section_begin|><|tool_call_begin|>"
                                  "functions.read_file:0<|tool_call_argument_begin|>{\"path\"")
    assert "tool_calls" not in cut and cut["reasoning_content"] == "r"


def test_read_file_tool_runs_against_corpus():
    rec = corpus.split_records("held_out")[0]
    args = json.dumps({"path": rec["path"], "symbol": rec["qualname"]})
    assert ds.run_read_file(args) == rec["source"]
    assert ds.run_read_file("not json").startswith("Error")
    assert ds.run_read_file(json.dumps({"path": "x.py", "symbol": "nope"})).startswith("Error")


def _check_native(rec: dict) -> None:
    assert set(rec) <= {"id", "messages", "tools", "meta"} and rec["id"].startswith("demo_native-")
    msgs = rec["messages"]
    assert msgs[-1]["role"] == "assistant"
    call_ids = set()
    for m in msgs:
        assert m["role"] in {"system", "user", "assistant", "tool"}
        if m["role"] == "assistant":
            assert "reasoning_content" in m and isinstance(m["content"], str)
            call_ids |= {c["id"] for c in m.get("tool_calls", [])}
        if m["role"] == "tool":
            assert m["tool_call_id"] in call_ids
    _assert_held_out(rec)


@pytest.mark.slow
def test_native_deterministic_nested_schema():
    kwargs = {"seed": 0, "batch_size": 2, "max_new_tokens": 40}
    big = list(ds.demo_native_records(3, **kwargs))
    small = list(ds.demo_native_records(1, **kwargs))
    assert len(big) == 3 and small == big[:1]
    for rec in big:
        _check_native(rec)


def test_fixtures_match_generators():
    prompts = [json.loads(l) for l in (FIXTURES / "demo_prompts_small.jsonl").read_text().splitlines()]
    assert prompts == list(ds.demo_prompts_records(len(prompts), seed=0))
    native = [json.loads(l) for l in (FIXTURES / "demo_native_small.jsonl").read_text().splitlines()]
    assert len(native) >= 20
    for rec in native:
        _check_native(rec)
    assert any(m.get("tool_calls") for r in native for m in r["messages"])
    # The tool really ran (its result answers the call); whether the target named an existing
    # symbol is a matter of model quality, so an "Error: no symbol ..." result counts too.
    assert any(m["role"] == "tool" and m["content"] for r in native for m in r["messages"])
