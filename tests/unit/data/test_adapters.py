"""Schema adapters on fixture files in each real dataset's schema, and the conversation checks."""

from __future__ import annotations

import json

import pytest

from eagle3.data.adapters import ADAPTERS, AdapterError, convert, raw_id, resolve_columns
from eagle3.data.adapters import ADAPTERS as DATASET_SCHEMAS
from eagle3.data.conversation import (
    ConversationError,
    check_conversation,
    conversation_problem,
    prompt_key,
    prompt_only_messages,
    split_think,
)
from tests.conftest import FIXTURES

RAW = FIXTURES / "raw"


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (RAW / name).read_text().splitlines() if line.strip()]


def conv(schema: str, record: dict, columns: dict | None = None) -> dict:
    result = convert(schema, record, resolve_columns(schema, columns))
    assert check_conversation(result) is None, conversation_problem(result)
    return result


def test_every_schema_has_an_adapter():
    assert set(ADAPTERS) == set(DATASET_SCHEMAS)
    assert all(a.keys[0] == "id" for a in ADAPTERS.values())


def test_ultrachat_messages_and_prompt_id():
    first, _ = records("ultrachat.jsonl")
    out = conv("openai_messages", first)
    assert out["messages"] == [
        {"role": "user", "content": "How does photosynthesis work?"},
        {"role": "assistant", "content": "Plants turn light, water and CO2 into glucose and oxygen."},
        {"role": "user", "content": "Where does it happen?"},
        {"role": "assistant", "content": "In the chloroplasts."},
    ]
    assert out["tools"] == []
    assert raw_id(first, resolve_columns("openai_messages", None)) == "a1f3"


def test_nemotron_think_goes_to_reasoning_and_empty_system_is_dropped():
    think, tools = records("nemotron.jsonl")
    out = conv("openai_messages", think)
    assert out["messages"] == [
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": "17 * 23 = 391.",
         "reasoning_content": "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391."},
    ]
    assert out["meta"]["reasoning"] == "on"
    assert out["meta"]["raw_fields"] == {"generator": "DeepSeek-R1-0528", "category": "math", "license": "cc-by-4.0"}
    assert raw_id(think, resolve_columns("openai_messages", None)) == "nm-001"


def test_openai_tool_calls_get_kimi_ids_and_string_arguments():
    _, record = records("nemotron.jsonl")
    out = conv("openai_messages", record)
    assert out["messages"] == [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": '{"temp_c": 18}', "tool_call_id": "functions.get_weather:0"},
        {"role": "assistant", "content": "It is 18 °C in Paris."},  # empty <think></think> adds nothing
    ]
    assert out["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    assert out["meta"]["reasoning"] == "off"


def test_given_tool_call_ids_are_kept():
    record = {"messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.read_file:7", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path":"a.py"}'}}]},
        {"role": "tool", "tool_call_id": "functions.read_file:7", "content": "x = 1"},
        {"role": "assistant", "content": "It sets x.", "reasoning_content": "Simple."}]}
    out = conv("openai_messages", record)
    assert out["messages"] == record["messages"]


def test_reasoning_text_column_goes_to_the_last_answer():
    record = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
              "reasoning": "Add them."}
    assert conv("openai_messages", record)["messages"][1] == {
        "role": "assistant", "content": "4", "reasoning_content": "Add them."}


def test_sharegpt_role_variants_and_system_turn():
    hamlet, french, prime = records("sharegpt.jsonl")
    assert conv("sharegpt", hamlet)["messages"] == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Summarize the plot of Hamlet in one sentence."},
        {"role": "assistant", "content": "A Danish prince avenges his father's murder and dies doing it."},
        {"role": "user", "content": "Who is Ophelia?"},
        {"role": "assistant", "content": "Polonius's daughter, Hamlet's love interest."},
    ]
    assert conv("sharegpt", french)["messages"] == [
        {"role": "user", "content": "Translate 'good morning' to French."},
        {"role": "assistant", "content": "Bonjour."}]
    assert [m["role"] for m in conv("sharegpt", prime)["messages"]] == ["user", "assistant"]  # "Human"
    assert raw_id(hamlet, resolve_columns("sharegpt", None)) == "QWJhYvA_0"


def test_openthoughts_system_column_and_perfectblend_source():
    [thoughts] = records("openthoughts.jsonl")
    out = conv("sharegpt", thoughts, {"system": "system"})
    assert out["messages"][0] == {"role": "system", "content": thoughts["system"]}
    assert out["messages"][1] == {"role": "user", "content": thoughts["conversations"][0]["value"]}
    assert out["messages"][2] == {"role": "assistant", "content": thoughts["conversations"][1]["value"]}
    [blend] = records("perfectblend.jsonl")
    out = conv("sharegpt", blend)
    assert out["meta"] == {"raw_fields": {"source": "airoboros"}}
    assert raw_id(blend, resolve_columns("sharegpt", None)).startswith("sha256-")  # no id column


def test_opencodeinstruct_input_output():
    [record] = records("opencodeinstruct.jsonl")
    out = conv("opencodeinstruct", record)
    assert out["messages"] == [
        {"role": "user", "content": "Write a Python function `is_even(n)` that returns True if n is even."},
        {"role": "assistant", "content": "```python\ndef is_even(n):\n    return n % 2 == 0\n```"}]
    assert out["meta"]["raw_fields"]["domain"] == "generic"


def test_problem_solution_thinking_column_or_inline_think():
    with_thinking, inline = records("kimik25_2000x.jsonl")
    assert conv("problem_solution", with_thinking)["messages"] == [
        {"role": "user", "content": "Find all real x with x^2 - 5x + 6 = 0."},
        {"role": "assistant", "content": "The solutions are x = 2 and x = 3.",
         "reasoning_content": "Factor: (x-2)(x-3) = 0, so x = 2 or x = 3."}]
    assert conv("problem_solution", inline)["messages"][1] == {
        "role": "assistant", "content": "No: 91 = 7 × 13.", "reasoning_content": "91 = 7 * 13."}


def test_problem_solution_columns_are_configurable():
    record = {"question": "Q?", "answer": "A.", "trace": "think"}
    out = conv("problem_solution", record, {"problem": "question", "solution": "answer", "thinking": "trace"})
    assert out["messages"] == [{"role": "user", "content": "Q?"},
                               {"role": "assistant", "content": "A.", "reasoning_content": "think"}]
    with pytest.raises(AdapterError, match="missing column 'problem'"):
        convert("problem_solution", record, resolve_columns("problem_solution", None))


def test_glaive_tools_and_function_calls():
    calling, plain = records("glaive.jsonl")
    out = conv("glaive_function_calling", calling)
    assert [t["function"]["name"] for t in out["tools"]] == ["convert_currency"]
    assert out["tools"][0]["type"] == "function"
    assert out["tools"][0]["function"]["parameters"]["required"] == ["amount", "from_currency", "to_currency"]
    assert out["messages"] == [
        {"role": "system",
         "content": "You are a helpful assistant with access to the following functions. Use them if required -"},
        {"role": "user", "content": "Hi, I need to convert 1000 US dollars to Euros. Can you help me with that?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.convert_currency:0", "type": "function",
             "function": {"name": "convert_currency",
                          "arguments": '{"amount": 1000, "from_currency": "USD", "to_currency": "EUR"}'}}]},
        {"role": "tool", "content": '{"converted_amount": 850.0, "from_currency": "USD", "to_currency": "EUR"}',
         "tool_call_id": "functions.convert_currency:0", "name": "convert_currency"},
        {"role": "assistant", "content": "Sure, 1000 US dollars is approximately 850 Euros."},
        {"role": "user", "content": "Great, thanks!"},
        {"role": "assistant", "content": "You're welcome!"},
    ]
    out = conv("glaive_function_calling", plain)
    assert out["tools"] == []
    assert out["messages"][0] == {"role": "system",
                                  "content": "You are a helpful assistant, with no access to external functions."}


def test_glaive_json_arguments_and_bad_calls():
    record = {"system": "SYSTEM: tools -\n{\"name\": \"f\", \"parameters\": {}}",
              "chat": "USER: go\nASSISTANT: <functioncall> {\"name\": \"f\", \"arguments\": {\"a\": 1}} <|endoftext|>\n"
                      "FUNCTION RESPONSE: done\nASSISTANT: ok <|endoftext|>"}
    call = conv("glaive_function_calling", record)["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    bad = dict(record, chat="USER: go\nASSISTANT: <functioncall> {\"name\": \"f\", \"arguments\": '{a: 1}'}\n")
    with pytest.raises(ConversationError) as info:
        convert("glaive_function_calling", bad, resolve_columns("glaive_function_calling", None))
    assert info.value.reason == "bad_tool_call"
    with pytest.raises(AdapterError, match="marker"):
        convert("glaive_function_calling", dict(record, chat="hello"), resolve_columns("glaive_function_calling", None))


def test_deepswe_inline_xml_kept_byte_for_byte():
    [record] = records("deepswe.jsonl")
    out = conv("deepswe_trajectories", record)
    assert out["messages"] == record["messages"]  # same roles, same bytes (leading spaces, newlines)
    assert out["messages"][2]["content"].startswith("  I'll start")
    assert "<function=execute_bash>\n  <parameter=cmd>grep -n" in out["messages"][2]["content"]
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert "reasoning_content" not in out["messages"][2] and "tool_calls" not in out["messages"][2]
    assert raw_id(record, resolve_columns("deepswe_trajectories", None)) == "pallets__flask-4992"
    assert out["meta"] == {"raw_fields": {"reward": 1.0}}


def test_explicit_id_column():
    cols = resolve_columns("sharegpt", {"id": "key"})
    assert raw_id({"key": 7, "id": "other"}, cols) == "7"
    with pytest.raises(AdapterError, match="missing id column 'key'"):
        raw_id({"id": "other"}, cols)


@pytest.mark.parametrize("messages, reason", [
    ([], "no_messages"),
    ([{"content": "hi"}, {"role": "assistant", "content": "x"}], "missing_role"),
    ([{"role": "robot", "content": "hi"}], "unknown_role"),
    ([{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}], "empty_content"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}], "empty_content"),
    ([{"role": "user", "content": ["a", 1]}, {"role": "assistant", "content": "x"}], "non_string_content"),
    ([{"role": "assistant", "content": "hello"}, {"role": "user", "content": "q"}], "assistant_first"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}],
     "user_last"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c", "content": "r"},
      {"role": "assistant", "content": "a"}], "bad_tool_call"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "r"}, {"role": "assistant", "content": "a"}], "bad_tool_call"),
    ([{"role": "system", "content": "s"}], "too_few_turns"),
])
def test_conversation_problems(messages, reason):
    assert check_conversation({"messages": messages}) == reason


def test_valid_tool_conversation_and_prompt_only_form():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "functions.f:0", "content": "r"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "b"}]
    assert check_conversation({"messages": messages}) is None
    kept, n_assistant, n_tool = prompt_only_messages(messages)
    assert [m["content"] for m in kept] == ["s", "q", "q2"] and (n_assistant, n_tool) == (3, 1)
    assert check_conversation({"messages": kept, "track": "prompt_only"}) is None
    assert check_conversation({"messages": kept, "track": "target_native"}) == "user_last"
    assert check_conversation({"messages": messages, "track": "prompt_only"}) == "answer_in_prompt"


def test_split_think_and_prompt_key():
    assert split_think("<think>\n a \n</think>\n\nb") == ("a", "b")
    assert split_think("no <think>x</think> here") == (None, "no <think>x</think> here")
    assert prompt_key([{"role": "user", "content": " Ｈello\tWORLD "}, {"role": "assistant", "content": "x"}]) \
        == "hello world"
