"""A turn cut at max_new_tokens: the closers the template adds are not target output."""

from __future__ import annotations

from eagle3.data.render import tokenize_conversation
from tests.unit.data.test_render_masks import decode, masked_runs, settings, tok  # noqa: F401  (fixture)

PROMPT = [{"role": "user", "content": "Explain heapq.heappush."}]


def last_run_text(tok, conv):
    record = tokenize_conversation(tok, conv, settings())
    start, end = masked_runs(record["input_ids"], record["loss_mask"])[-1]
    return decode(tok, record["input_ids"][start:end]), record


def test_cut_inside_content_masks_out_the_template_end_of_turn(tok):
    answer = {"role": "assistant", "reasoning_content": "It pushes.", "content": "Push an item onto"}
    whole = {"id": "a", "messages": PROMPT + [answer]}
    cut = {**whole, "meta": {"truncated": True}}
    assert last_run_text(tok, whole)[0] == "It pushes.</think>Push an item onto<|im_end|>"
    text, record = last_run_text(tok, cut)
    assert text == "It pushes.</think>Push an item onto"
    assert record["truncated"] and record["truncated_generation"]


def test_cut_inside_reasoning_masks_out_think_close_and_end_of_turn(tok):
    answer = {"role": "assistant", "reasoning_content": "The user asks about", "content": ""}
    text, _ = last_run_text(tok, {"id": "b", "messages": PROMPT + [answer], "meta": {"truncated": True}})
    assert text == "The user asks about"
