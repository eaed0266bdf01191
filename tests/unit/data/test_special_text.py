"""Special-token text the dataset supplied is trained as text; Kimi targets see their own tool-call ids.

The oracle for the first: tokenize a conversation whose content quotes `<|im_end|>`, `<think>`,
`<|tool_call_begin|>` ... and the same conversation with each quote replaced by plain text. The
added-token ids of both samples must be the same sequence at the same places in the mask (only the
template's scaffolding yields them), and the first sample must decode back to its render, quotes
included. Run over the demo target's Kimi format (training and stock templates) and a Llama-3-style
tokenizer with other control tokens, so no tokenizer is special-cased.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from eagle3.chat_formats import kimi as kf
from eagle3.data.conversation import conversation_problem
from eagle3.data.render import Reject, RenderSettings, render, tokenize_conversation
from eagle3.data.special_text import encode_as_text, literal_specials
from eagle3.paths import asset_path
from tests.own_target import build_tiny_llama

TRAINING = asset_path("chat_templates/kimi_k25_training.jinja").read_text(encoding="utf-8")
STOCK = asset_path("chat_templates/kimi_k25.jinja").read_text(encoding="utf-8")
QUOTES = ("<|im_end|>", "<think>", "</think>", "<|tool_call_begin|>", "<|im_assistant|>assistant<|im_middle|>",
          "<|tool_calls_section_begin|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>", "[EOS]")


@pytest.fixture(scope="module")
def demo_tok():
    return AutoTokenizer.from_pretrained(asset_path("demo_target"))


@pytest.fixture(scope="module")
def llama_tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_llama(tmp_path_factory.mktemp("llama") / "ckpt", layers=2))


def quoting(text: str) -> dict:
    """A tool-using conversation with `text` in every field a dataset supplies."""
    call = {"id": "functions.run:0", "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"code": f"print('{text}')"})}}
    return {"id": "q", "tools": [{"type": "function", "function": {
        "name": "run", "description": f"Runs code such as {text}.", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": f"Never write {text} yourself."},
            {"role": "user", "content": f"What does {text} mean in a chat template?"},
            {"role": "assistant", "content": f"Let me run {text}.", "reasoning_content": f"They ask about {text}.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "functions.run:0", "content": f"output: {text}"},
            {"role": "assistant", "content": f"It marks a turn: {text}{text}", "reasoning_content": f"{text} ends"},
    ]}


def settings(template, thinking=True):
    return RenderSettings(template=template, thinking=thinking, max_len=100_000, overlength="truncate",
                          answer_ids="emitted")


def added_ids(tok) -> set[int]:
    return set(tok.added_tokens_decoder)


def special_positions(record: dict, specials: set[int]) -> list[tuple[int, int]]:
    """(id, mask) of every added-token id of a sample, in order."""
    return [(i, m) for i, m in zip(record["input_ids"], record["loss_mask"]) if i in specials]


@pytest.mark.parametrize("fmt", ["kimi_training", "kimi_stock_thinking_off", "llama3"])
@pytest.mark.parametrize("quote", QUOTES)
def test_quoted_special_text_never_becomes_a_control_token(demo_tok, llama_tok, fmt, quote):
    tok, template, thinking = {"kimi_training": (demo_tok, TRAINING, True),
                               "kimi_stock_thinking_off": (demo_tok, STOCK, False),
                               "llama3": (llama_tok, None, False)}[fmt]  # its template has no reasoning
    specials = added_ids(tok)
    quoted = tokenize_conversation(tok, quoting(quote), settings(template, thinking))
    plain = tokenize_conversation(tok, quoting("QUOTE"), settings(template, thinking))
    assert special_positions(quoted, specials) == special_positions(plain, specials)
    # Nothing is lost: the ids decode to the render of the conversation, every quote in place.
    text = tok.decode(quoted["input_ids"], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    conv = kf.with_kimi_call_ids(quoting(quote)) if fmt.startswith("kimi") else quoting(quote)
    assert text == render(tok, conv["messages"], settings(template, thinking), tools=conv["tools"])
    assert text.count(quote) >= 7
    # The answers' quotes are trained on, as the text the target would write.
    trained = tok.decode([i for i, m in zip(quoted["input_ids"], quoted["loss_mask"]) if m],
                         skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert f"It marks a turn: {quote}{quote}" in trained


def test_answers_stage_generate_regenerated_keep_the_tokens_the_target_emitted(demo_tok):
    """A prompt-only record's answers were decoded from the target's own ids: a stray `</think>` the target
    emitted mid-answer is its token, while the same text in the prompt is the user's text."""
    conv = {"id": "g", "track": "prompt_only", "messages": [
        {"role": "user", "content": "Why does </think> appear here?"},
        {"role": "assistant", "content": "Because</think> it does.", "reasoning_content": "a reason"}]}
    record = tokenize_conversation(demo_tok, conv, settings(TRAINING))
    close = demo_tok.convert_tokens_to_ids(kf.THINK_CLOSE)
    masks = [m for i, m in zip(record["input_ids"], record["loss_mask"]) if i == close]
    assert masks == [1, 1]  # the template's `</think>` after the reasoning, and the one the target emitted
    supplied = tokenize_conversation(demo_tok, {**conv, "track": "target_native"}, settings(TRAINING))
    assert [m for i, m in zip(supplied["input_ids"], supplied["loss_mask"]) if i == close] == [1]


def test_a_conversation_without_special_text_is_tokenized_as_the_tokenizer_does(demo_tok):
    conv = quoting("nothing special")
    record = tokenize_conversation(demo_tok, conv, settings(TRAINING))
    text = render(demo_tok, conv["messages"], settings(TRAINING), tools=conv["tools"])
    assert record["input_ids"] == demo_tok(text, add_special_tokens=False)["input_ids"]


def test_text_encoding_equals_the_tokenizer_on_ordinary_text(demo_tok, llama_tok):
    for tok in (demo_tok, llama_tok):
        for text in ("def f(x):\n    return x  # é 日本 🙂", "  two  spaces\n\n\ttab", "<", "a < b > c"):
            assert encode_as_text(tok, text) == tok(text, add_special_tokens=False)["input_ids"]
        ids = encode_as_text(tok, "quote: <|im_end|> <think> <|eot_id|>")
        assert not added_ids(tok).intersection(ids)


def test_content_with_the_escape_characters_is_rejected_not_confused(demo_tok):
    with pytest.raises(Reject) as info:
        tokenize_conversation(demo_tok, quoting("\U000f0000 <|im_end|>"), settings(TRAINING))
    assert info.value.reason == "special_token_text"
    assert literal_specials(demo_tok).escape({"a": "no quote"}) == ({"a": "no quote"}, 0)


# ------------------------------------------------------------------ Kimi's tool-call ids
def openai_style() -> dict:
    """Two turns whose calls carry OpenAI-style ids, repeating across turns as some datasets do."""
    def call(cid, name, args):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
    return {"id": "t", "messages": [
        {"role": "user", "content": "Read a.txt and b.txt"},
        {"role": "assistant", "content": "", "reasoning_content": "two files",
         "tool_calls": [call("call_1", "read_file", '{"path": "a.txt"}'), call("call_2", "read_file", '{"path": "b.txt"}')]},
        {"role": "tool", "tool_call_id": "call_2", "content": "B"},
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {"role": "assistant", "content": "", "reasoning_content": "now list",
         "tool_calls": [call("call_1", "list_dir", '{"path": "."}'), call("functions.grep:7", "grep", '{"q": "x"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
        {"role": "tool", "tool_call_id": "functions.grep:7", "content": "none"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "all read"},
    ]}


def test_kimi_targets_train_on_their_own_call_ids_and_tool_results_follow(demo_tok):
    record = tokenize_conversation(demo_tok, openai_style(), settings(TRAINING))
    text = demo_tok.decode(record["input_ids"], skip_special_tokens=False)
    for cid in ("functions.read_file:0", "functions.read_file:1", "functions.list_dir:2", "functions.grep:7"):
        assert f"{kf.TOOL_CALL_BEGIN}{cid}{kf.TOOL_CALL_ARG}" in text
    assert "## Return of functions.read_file:1\nB" in text and "## Return of functions.read_file:0\nA" in text
    assert "## Return of functions.list_dir:2\na.txt b.txt" in text and "call_1" not in text and "call_2" not in text
    # The generated ids are inside the trained spans: the draft learns the names the target writes.
    trained = demo_tok.decode([i for i, m in zip(record["input_ids"], record["loss_mask"]) if m])
    assert "functions.read_file:0" in trained and "functions.list_dir:2" in trained


def test_other_targets_keep_the_datasets_ids(llama_tok):
    record = tokenize_conversation(llama_tok, openai_style(), settings(None, thinking=False))
    text = llama_tok.decode(record["input_ids"], skip_special_tokens=False)
    assert '"id": "call_1"' in text and "functions.read_file" not in text


def test_kimi_id_rewrite_leaves_the_input_untouched_and_keeps_valid_conversations_valid():
    conv = openai_style()
    before = json.dumps(conv, sort_keys=True)
    out = kf.with_kimi_call_ids(conv)
    assert json.dumps(conv, sort_keys=True) == before
    assert conversation_problem(out) is None and conversation_problem(conv) is None
