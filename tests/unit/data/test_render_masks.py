"""Rendering with the Kimi-K2.5 templates and loss masks from render boundaries (eagle3.data.render).

Golden tests pin exact strings with the real Kimi-K2.5 template and the demo tokenizer (which
carries Kimi's control tokens); the property test checks the mask against an independent oracle
that reads the turn structure off the token ids, over many random and demo conversations.
"""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoTokenizer

from eagle3.chat_formats import kimi as kf
from eagle3.data.render import Reject, RenderSettings, generated_spans, render, tokenize_conversation
from eagle3.demo import conversations as demo_convs
from eagle3.paths import asset_path

TOKENIZER_DIR = asset_path("demo_target")
STOCK = asset_path("chat_templates/kimi_k25.jinja").read_text(encoding="utf-8")
TRAINING = asset_path("chat_templates/kimi_k25_training.jinja").read_text(encoding="utf-8")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
GOLDEN = {
    "id": "golden",
    "tools": [WEATHER_TOOL],
    "messages": [
        {"role": "system", "content": "You are Kimi."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Let me look.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny, 21C"},
        {"role": "assistant", "content": "It is sunny in Paris.", "reasoning_content": "The tool says sunny."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "Bye!", "reasoning_content": "Say goodbye."},
    ],
}
TOOL_DECL = ('<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"get_weather",'
             '"description":"Current weather of a city.","parameters":{"type":"object","properties":'
             '{"city":{"type":"string"}},"required":["city"]}}}]<|im_end|>')
CALL_TEXT = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
             '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>')
HEAD = "<|im_assistant|>assistant<|im_middle|>"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def settings(template=TRAINING, thinking=True, max_len=100_000, overlength="truncate", answer_ids="emitted"):
    return RenderSettings(template=template, thinking=thinking, max_len=max_len, overlength=overlength,
                          answer_ids=answer_ids)


def masked_runs(ids, mask):
    """Maximal runs of mask-1 tokens as (start, end) index pairs."""
    runs, start = [], None
    for k, flag in enumerate(list(mask) + [0]):
        if flag and start is None:
            start = k
        elif not flag and start is not None:
            runs.append((start, k))
            start = None
    return runs


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ------------------------------------------------------------------ the training template
CHATML_STYLE = ("{% for m in messages %}<|im_user|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_user|>assistant<|im_middle|>{% endif %}")


def test_a_template_separator_after_the_end_of_turn_token_is_context_not_target_output(tok):
    """`<|im_end|>\n` (ChatML style): the model stops at `<|im_end|>`; the newline is the template's."""
    conv = {"id": "c", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"},
                                    {"role": "user", "content": "More?"}, {"role": "assistant", "content": "Sure"}]}
    record = tokenize_conversation(tok, conv, settings(template=CHATML_STYLE, thinking=False))
    ids, mask = record["input_ids"], record["loss_mask"]
    assert decode(tok, ids).count("<|im_end|>\n") == 4  # the separator is in the training text...
    runs = [decode(tok, ids[a:b]) for a, b in masked_runs(ids, mask)]
    assert runs == ["Hello there<|im_end|>", "Sure<|im_end|>"]  # ...but not in what the draft learns to predict


def test_training_template_equals_stock_when_every_assistant_turn_is_in_the_stock_suffix(tok):
    chain = GOLDEN["messages"][:4] + [
        {"role": "assistant", "content": "One more.", "reasoning_content": "Check again.",
         "tool_calls": [dict(CALL, id="functions.get_weather:1")]},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "still sunny"},
        {"role": "assistant", "content": "", "tool_calls": [dict(CALL, id="functions.get_weather:2")]}]
    cases = [(GOLDEN["messages"][:2], True), (GOLDEN["messages"][:4], False), (chain, False),
             (chain[:-1], True), ([{"role": "user", "content": "hi"}], True)]
    for messages, gen in cases:
        for thinking in (True, False):
            for tools in (None, [WEATHER_TOOL]):
                kwargs = dict(tools=tools, tokenize=False, add_generation_prompt=gen, thinking=thinking)
                stock = tok.apply_chat_template(messages, chat_template=STOCK, **kwargs)
                assert tok.apply_chat_template(messages, chat_template=TRAINING, **kwargs) == stock
    # Thinking mode omitted altogether (no kwarg): the templates still agree.
    plain = dict(tokenize=False, add_generation_prompt=True)
    assert (tok.apply_chat_template(chain[:-1], chat_template=TRAINING, **plain)
            == tok.apply_chat_template(chain[:-1], chat_template=STOCK, **plain))


def test_training_template_keeps_the_reasoning_the_stock_template_drops(tok):
    kwargs = dict(tools=GOLDEN["tools"], tokenize=False, thinking=True)
    stock = tok.apply_chat_template(GOLDEN["messages"], chat_template=STOCK, **kwargs)
    training = tok.apply_chat_template(GOLDEN["messages"], chat_template=TRAINING, **kwargs)
    for reasoning in ("Let me look.", "The tool says sunny.", "Say goodbye."):
        assert f"<think>{reasoning}</think>" in training
    assert "Let me look." not in stock and "The tool says sunny." not in stock and "Say goodbye." not in stock
    assert stock.count("<think></think>") == 3
    off = tok.apply_chat_template(GOLDEN["messages"], chat_template=TRAINING, tools=GOLDEN["tools"],
                                  tokenize=False, thinking=False)
    assert off.count("<think></think>") == 3 and "Let me look." not in off
    # A missing reasoning (None) renders as empty, not as the text "None".
    none = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": None}]
    assert tok.apply_chat_template(none, chat_template=TRAINING, tokenize=False).endswith(
        f"{HEAD}<think></think>a<|im_end|>")


# ------------------------------------------------------------------ golden masks
def test_golden_masks_are_exactly_the_generated_spans(tok):
    record = tokenize_conversation(tok, GOLDEN, settings())
    ids, mask = record["input_ids"], record["loss_mask"]
    expected_text = (
        TOOL_DECL + "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        f"{HEAD}<think>Let me look.</think>{CALL_TEXT}<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny, 21C<|im_end|>"
        f"{HEAD}<think>The tool says sunny.</think>It is sunny in Paris.<|im_end|>"
        "<|im_user|>user<|im_middle|>Thanks!<|im_end|>"
        f"{HEAD}<think>Say goodbye.</think>Bye!<|im_end|>")
    assert decode(tok, ids) == expected_text
    runs = masked_runs(ids, mask)
    assert [decode(tok, ids[a:b]) for a, b in runs] == [
        f"Let me look.</think>{CALL_TEXT}<|im_end|>",
        "The tool says sunny.</think>It is sunny in Paris.<|im_end|>",
        "Say goodbye.</think>Bye!<|im_end|>",
    ]
    think = tok.convert_tokens_to_ids("<think>")
    assert all(ids[a - 1] == think for a, _ in runs)
    # Everything else, headers and <think> scaffolds included, is context.
    unmasked = "".join(decode(tok, [i]) for i, m in zip(ids, mask) if not m)
    assert unmasked == (
        TOOL_DECL + "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>"
        f"<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>{HEAD}<think>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny, 21C<|im_end|>"
        f"{HEAD}<think><|im_user|>user<|im_middle|>Thanks!<|im_end|>{HEAD}<think>")
    assert record["n_turns"] == 3 and record["seq_len"] == len(ids) == len(mask)
    assert record["n_response_tokens"] == sum(mask) and record["n_prompt_tokens"] == len(ids) - sum(mask)
    assert record["truncated"] is False and record["id"] == "golden"


def test_golden_thinking_off_masks_out_the_empty_think_scaffold(tok):
    record = tokenize_conversation(tok, GOLDEN, settings(thinking=False))
    ids, mask = record["input_ids"], record["loss_mask"]
    runs = masked_runs(ids, mask)
    assert [decode(tok, ids[a:b]) for a, b in runs] == [
        f"{CALL_TEXT}<|im_end|>", "It is sunny in Paris.<|im_end|>", "Bye!<|im_end|>"]
    think, end_think = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    assert all(ids[a - 2:a] == [think, end_think] for a, _ in runs)
    assert not any(m for i, m in zip(ids, mask) if i in (think, end_think))
    assert "Let me look." not in decode(tok, ids)


def test_generation_prompt_ends_with_the_think_scaffold(tok):
    msgs = GOLDEN["messages"][:2]
    assert render(tok, msgs, settings(), add_generation_prompt=True).endswith(f"{HEAD}<think>")
    assert render(tok, msgs, settings(thinking=False), add_generation_prompt=True).endswith(f"{HEAD}<think></think>")


def test_stock_template_with_history_is_rejected_not_mismasked(tok):
    with pytest.raises(Reject) as err:
        generated_spans(tok, GOLDEN, settings(template=STOCK))
    assert err.value.reason == "template_not_prefix"
    # With the tokenizer's own template (the stock one) the same happens.
    with pytest.raises(Reject, match="template_not_prefix"):
        tokenize_conversation(tok, GOLDEN, settings(template=None))
    # A conversation entirely in the stock suffix masks identically under both templates.
    chain = {"id": "c", "tools": GOLDEN["tools"], "messages": GOLDEN["messages"][:4]}
    a, b = tokenize_conversation(tok, chain, settings(STOCK)), tokenize_conversation(tok, chain, settings())
    assert (a["input_ids"], a["loss_mask"]) == (b["input_ids"], b["loss_mask"])


def test_stock_template_dropping_the_only_answers_reasoning_is_rejected(tok):
    # Every prefix check passes here (the answer is history in S_i and in R alike), yet the
    # reasoning is gone: caught by its own check, not trained on silently.
    single = {"id": "s", "messages": GOLDEN["messages"][:2] + [GOLDEN["messages"][4]]}
    with pytest.raises(Reject, match="reasoning_dropped"):
        tokenize_conversation(tok, single, settings(template=STOCK))
    assert tokenize_conversation(tok, single, settings(template=STOCK, thinking=False))["n_turns"] == 1


# Qwen3-style: reasoning only for assistant turns after the last user message, so a later user
# turn rewrites an earlier answer; no later assistant turn exists to expose it through P_j/S_j.
LAST_USER_REASONING = (
    "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}"
    "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}<|im_user|>{{ m.role }}<|im_middle|>"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last -%}<think>{{ m.reasoning_content }}</think>"
    "{%- elif m.role == 'assistant' -%}<think></think>{%- endif -%}{{ m.content }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_user|>assistant<|im_middle|><think>{%- endif -%}")


def test_template_that_rewrites_earlier_turns_is_rejected(tok):
    conv = {"id": "q", "messages": [{"role": "user", "content": "a"},
                                    {"role": "assistant", "content": "b", "reasoning_content": "r"},
                                    {"role": "user", "content": "c"}]}
    with pytest.raises(Reject) as err:
        tokenize_conversation(tok, conv, settings(template=LAST_USER_REASONING))
    assert err.value.reason == "template_not_prefix" and "full render" in str(err.value.detail)
    ok = tokenize_conversation(tok, dict(conv, messages=conv["messages"][:2]), settings(template=LAST_USER_REASONING))
    assert ok["n_turns"] == 1
    # A generation prompt that the rendered turn does not continue (it opens a think block that
    # rendered turns never have): the tokens after the prompt are not what the model generated.
    no_think = ("{%- for m in messages -%}<|im_user|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>"
                "{%- endfor -%}{%- if add_generation_prompt -%}<|im_user|>assistant<|im_middle|><think>{%- endif -%}")
    with pytest.raises(Reject) as err:
        tokenize_conversation(tok, dict(conv, messages=conv["messages"][:2]), settings(template=no_think))
    assert err.value.reason == "template_not_prefix" and "generation prompt" in str(err.value.detail)


def test_boundary_inside_a_bpe_merge_is_rejected(tok):
    assert tok.encode("Th", add_special_tokens=False) + tok.encode("e", add_special_tokens=False) \
        != tok.encode("The", add_special_tokens=False)  # the premise of this test
    glued = ("{%- for m in messages -%}{%- if m.role == 'assistant' -%}Th{{ m.content }}"
             "{%- else -%}{{ m.content }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}Th{%- endif -%}")
    conv = {"id": "g", "messages": [{"role": "user", "content": "Q: "}, {"role": "assistant", "content": "e end"}]}
    with pytest.raises(Reject) as err:
        tokenize_conversation(tok, conv, settings(template=glued))
    assert err.value.reason == "boundary_merge"


def test_over_length_truncates_or_rejects(tok):
    full = tokenize_conversation(tok, GOLDEN, settings())
    n = full["seq_len"] - 5
    cut = tokenize_conversation(tok, GOLDEN, settings(max_len=n))
    assert cut["input_ids"] == full["input_ids"][:n] and cut["loss_mask"] == full["loss_mask"][:n]
    assert cut["truncated"] is True and cut["truncated_max_len"] is True and cut["seq_len"] == n
    assert cut["n_response_tokens"] == sum(full["loss_mask"][:n])
    with pytest.raises(Reject, match="too_long"):
        tokenize_conversation(tok, GOLDEN, settings(max_len=n, overlength="drop"))
    # Cut before the first generated token: nothing left to learn from.
    first = full["loss_mask"].index(1)
    with pytest.raises(Reject, match="no_response_tokens"):
        tokenize_conversation(tok, GOLDEN, settings(max_len=first))
    flagged = tokenize_conversation(tok, dict(GOLDEN, meta={"truncated": True}), settings())
    assert flagged["truncated"] is True and flagged["truncated_max_len"] is False


def test_bad_conversations_are_rejected_with_a_reason(tok):
    cases = {
        "no_response_tokens": {"id": 1, "messages": [{"role": "user", "content": "hi"}]},
        "invalid_conversation": {"id": 2, "messages": []},
    }
    for reason, conv in cases.items():
        with pytest.raises(Reject) as err:
            tokenize_conversation(tok, conv, settings())
        assert err.value.reason == reason
    raising = "{{ raise_exception('tool content must be a string') }}"
    with pytest.raises(Reject) as err:
        tokenize_conversation(tok, GOLDEN, settings(template=raising))
    assert err.value.reason == "template_error"
    assert err.value.detail == "TemplateError: tool content must be a string"


# ------------------------------------------------------------------ property test
WORDS = ("the", "data", "x", " ", "  ", "\n", "\n\n", "é", "日本", "🙂", "def f():", "## Return of", "{", "}",
         "functions.", "'", '"', "\t", "assistant", "user", "think", "<", ">", "/", "|", "0", "12")


def _text(rng, lo=0, hi=12):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def random_conversation(rng: random.Random, idx: int) -> dict:
    """A random composition of roles, reasoning, tool calls and tool results (no control tokens)."""
    messages = [{"role": "system", "content": _text(rng, 1)}] if rng.random() < 0.4 else []
    calls = 0
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": _text(rng, 1)})
        for _ in range(rng.randint(0, 2)):  # tool rounds
            batch = []
            for _ in range(rng.randint(1, 3)):
                args = json.dumps({"q": _text(rng)}, ensure_ascii=rng.random() < 0.5)
                batch.append({"id": f"functions.search:{calls}", "type": "function",
                              "function": {"name": "search", "arguments": args}})
                calls += 1
            messages.append({"role": "assistant", "content": _text(rng), "reasoning_content": _text(rng),
                             "tool_calls": batch})
            for call in batch:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": _text(rng)})
        final = {"role": "assistant", "content": _text(rng)}
        if rng.random() < 0.8:
            final["reasoning_content"] = _text(rng) if rng.random() < 0.9 else None
        messages.append(final)
    if rng.random() < 0.2:  # a chain that ends in a tool call
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"functions.search:{calls}", "type": "function",
             "function": {"name": "search", "arguments": "{}"}}]})
    conv = {"id": f"r{idx}", "messages": messages}
    if rng.random() < 0.5:
        conv["tools"] = [WEATHER_TOOL]
    return conv


def oracle_mask(tok, ids, thinking):
    """Expected mask from the token structure alone: in an assistant turn, 1 after the scaffold."""
    special = {name: tok.convert_tokens_to_ids(name) for name in
               (kf.IM_ASSISTANT, kf.IM_USER, kf.IM_SYSTEM, kf.IM_END, kf.THINK_OPEN, kf.THINK_CLOSE)}
    mask, state = [], "outside"  # outside | header | generated | context
    for token in ids:
        if state == "outside":
            state = "header" if token == special[kf.IM_ASSISTANT] else "context"
            mask.append(0)
        elif state == "header":
            mask.append(0)
            if token == special[kf.THINK_CLOSE if not thinking else kf.THINK_OPEN]:
                state = "generated"
        elif state == "generated":
            mask.append(1)
            if token == special[kf.IM_END]:
                state = "outside"
        else:
            mask.append(0)
            if token == special[kf.IM_END]:
                state = "outside"
    return mask


def expected_span(message, thinking):
    if thinking:
        return kf.assistant_tail(message)
    calls = kf.render_tool_calls(message["tool_calls"]) if message.get("tool_calls") else ""
    return (message.get("content") or "") + calls + kf.IM_END


def test_masks_match_an_independent_oracle_on_many_conversations(tok):
    rng = random.Random(1234)
    convs = [random_conversation(rng, i) for i in range(250)]
    for i, plan in enumerate(demo_convs.training_plans(150, seed=5)):
        convs.append(dict(demo_convs.kimi_conversation(plan), id=f"d{i}"))
    im_end = tok.convert_tokens_to_ids(kf.IM_END)
    before = {True: tok.convert_tokens_to_ids(kf.THINK_OPEN), False: tok.convert_tokens_to_ids(kf.THINK_CLOSE)}
    role_tokens = {tok.convert_tokens_to_ids(t) for t in (kf.IM_USER, kf.IM_SYSTEM)}
    checked = 0
    for conv in convs:
        for thinking in (True, False):
            rec = tokenize_conversation(tok, conv, settings(thinking=thinking))
            ids, mask = rec["input_ids"], rec["loss_mask"]
            assert len(ids) == len(mask) == rec["seq_len"]
            assert mask == oracle_mask(tok, ids, thinking), conv["id"]
            runs = masked_runs(ids, mask)
            assistants = [m for m in conv["messages"] if m["role"] == "assistant"]
            assert len(runs) == len(assistants) == rec["n_turns"]
            assert all(ids[b - 1] == im_end and ids[a - 1] == before[thinking] for a, b in runs)
            decoded = [decode(tok, ids[a:b]) for a, b in runs]
            assert decoded == [expected_span(m, thinking) for m in assistants], conv["id"]
            # No masked token between a user/system/tool header and its end of turn.
            inside = False
            for token, flag in zip(ids, mask):
                inside = (inside or token in role_tokens) and not (inside and token == im_end)
                assert not (inside and flag)
            checked += 1
    assert checked == 800
