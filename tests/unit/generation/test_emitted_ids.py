"""Regenerated answers train on the ids the target emitted, not on their text re-encoded.

A target can emit a split of its text that the tokenizer would not produce (`Hel` + `lo` where
re-encoding gives `Hello`, two `\n` where it gives `\n\n`); the draft must learn the target's
sequence. These tests build such answers on the demo tokenizer and check the training ids, the
mask, the drift counts and the refusal of ids that cannot be the target's; the chain tests check
the same on answers real engines emitted (tests/integration/test_pipeline.py: hf, tests/integration/test_demo_kimi.py:
vLLM, tests/integration/test_sglang_engine.py: SGLang).
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from eagle3.data.render import Reject, RenderSettings, tokenize_conversation
from eagle3.generation.hf_backend import HFBackend
from eagle3.generation.openai_chat import BadResponse, build_body, to_result
from eagle3.generation.regenerate import GenerateSettings, regenerate_batch
from eagle3.generation.types import GenerationRequest, SamplingParams
from eagle3.paths import asset_path
from tests.emitted_ids import answer_runs

CHATML = ("{% for m in messages %}<|im_user|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_user|>assistant<|im_middle|>{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(asset_path("demo_target"))


def _settings(answer_ids: str = "emitted", max_len: int = 10_000) -> RenderSettings:
    return RenderSettings(template=CHATML, thinking=False, max_len=max_len, overlength="truncate",
                          answer_ids=answer_ids)


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _odd_split(tok, text: str) -> list[int]:
    """Ids that decode to `text` but are not its encoding: each word encoded apart from its first letter."""
    ids: list[int] = []
    for k, word in enumerate(text.split(" ")):
        piece = word if k == 0 else " " + word
        ids += _encode(tok, piece[:2]) + _encode(tok, piece[2:])
    assert tok.decode(ids) == text and ids != _encode(tok, text)  # the premise: another split of the same text
    return ids


def _regenerated(tok, answers: list[str], emitted: list[list[int] | None], track: str = "prompt_only") -> dict:
    messages: list[dict] = []
    for k, answer in enumerate(answers):
        messages += [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": answer}]
    turns = [{"finish_reason": "stop", "completion_tokens": len(ids or []), "prompt_tokens": 3}
             | ({} if ids is None else {"token_ids": ids}) for ids in emitted]
    return {"id": "r", "source": "s", "track": track, "messages": messages,
            "meta": {"truncated": False, "generation": {"turns": turns}}}


def test_a_regenerated_answer_trains_on_the_emitted_ids_and_counts_what_re_encoding_would_miss(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    answers = ["Hello there general", "plain answer"]
    odd = _odd_split(tok, answers[0]) + [end]
    canonical = _encode(tok, answers[1]) + [end]
    record = tokenize_conversation(tok, _regenerated(tok, answers, [odd, canonical]), _settings())
    assert answer_runs(record) == [odd, canonical]  # exactly what the target emitted, turn by turn
    assert tok.decode(record["input_ids"]).count("question") == 2  # the context around them is the render
    reencoded = _encode(tok, answers[0]) + [end]
    assert record["emitted_tokens"] == len(odd) + len(canonical)
    assert record["emitted_unmatched_reencoded"] > 0 and record["emitted_unmatched_trained"] == 0
    assert record["answers_reencoded_differently"] == 1
    assert record["n_response_tokens"] == len(odd) + len(canonical)

    before = tokenize_conversation(tok, _regenerated(tok, answers, [odd, canonical]), _settings("reencoded"))
    assert answer_runs(before) == [reencoded, canonical]  # what format 3 trained on
    assert before["emitted_unmatched_trained"] == before["emitted_unmatched_reencoded"] \
        == record["emitted_unmatched_reencoded"]


def test_answers_without_ids_and_dataset_answers_are_re_encoded(tok):
    answers = ["Hello there general"]
    odd = _odd_split(tok, answers[0])
    for record in (_regenerated(tok, answers, [None]), _regenerated(tok, answers, [odd], track="target_native")):
        out = tokenize_conversation(tok, record, _settings())
        assert answer_runs(out) == [_encode(tok, answers[0]) + [tok.convert_tokens_to_ids("<|im_end|>")]]
        assert out["emitted_tokens"] == out["emitted_unmatched_reencoded"] == 0


def test_an_answer_cut_at_max_new_tokens_trains_on_what_was_emitted_and_no_template_closer(tok):
    text = "Hello there general"
    odd = _odd_split(tok, text)
    record = _regenerated(tok, [text], [odd])
    record["meta"]["truncated"] = True
    out = tokenize_conversation(tok, record, _settings())
    assert answer_runs(out) == [odd] and out["truncated_generation"]


def test_a_cut_answer_the_template_trims_still_trains_on_its_emitted_ids(tok):
    """Gemma-style templates `trim` content: a cut answer ending in a space is not in the render as
    written, so its text cannot be located; its emitted ids still are what the target produced."""
    trimming = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    text = "Hello there general "
    emitted = _encode(tok, text)
    record = _regenerated(tok, [text], [emitted])
    record["meta"]["truncated"] = True
    settings = RenderSettings(template=trimming, thinking=False, max_len=10_000, overlength="truncate",
                              answer_ids="emitted")
    out = tokenize_conversation(tok, record, settings)
    assert answer_runs(out) == [emitted] and out["emitted_unmatched_reencoded"] == len(emitted)
    with pytest.raises(Reject) as err:  # re-encoding had nothing to train on: what format 3 did
        tokenize_conversation(tok, record, RenderSettings(**{**settings.__dict__, "answer_ids": "reencoded"}))
    assert err.value.reason == "no_response_tokens"


def test_ids_that_cannot_be_the_targets_are_refused_with_the_field_named(tok):
    answers = ["a b", "c d"]
    for emitted, words in (([[len(tok) + 5], None], "below the vocabulary size"),
                           ([[1, "x"], None], "not a list of token ids"),
                           ([[1]], "1 entries for 2 assistant messages")):
        with pytest.raises(Reject) as err:
            tokenize_conversation(tok, _regenerated(tok, answers[: 2], emitted), _settings())
        assert err.value.reason == "emitted_ids_invalid" and words in str(err.value.detail), err.value.detail


def test_either_engine_is_asked_for_its_ids_and_its_answer_keeps_them():
    request = GenerationRequest(id="c:0", messages=[{"role": "user", "content": "q"}])
    assert build_body(request, SamplingParams(max_new_tokens=8), model="m")["return_token_ids"] is True

    def reply(**ids):
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
                             **ids}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}

    assert to_result(request, reply(token_ids=[5, 6])).token_ids == [5, 6]  # vLLM
    assert to_result(request, reply(response_token_ids=[7, 8])).token_ids == [7, 8]  # SGLang
    assert to_result(request, reply()).token_ids is None  # a server that does not say
    for bad in ("56", [5, -1], [5, 1.5], [True]):
        with pytest.raises(BadResponse, match="not a list of token ids"):
            to_result(request, reply(token_ids=bad))


MAX_NEW = 60  # greedy on these questions the demo target answers in 49-51 tokens, then 49-72: some turns are cut


def test_the_regenerated_record_keeps_the_ids_the_demo_target_emitted_and_a_reject_drops_them(tok):
    backend = HFBackend(str(asset_path("demo_target")))
    questions = [{"id": f"q{k}", "track": "prompt_only", "messages": [{"role": "user", "content": f"What is {k}?"},
                                                                    {"role": "user", "content": "And then?"}]}
                 for k in range(6)]
    settings = GenerateSettings(max_new_tokens=MAX_NEW, temperature=0.0, top_p=1.0, max_user_turns=2,
                                length_policy="drop", thinking=True, seed=0)
    outcomes = regenerate_batch(backend, questions, settings)
    kept = [o for o in outcomes if o.record is not None]
    cut = [o for o in outcomes if o.reason == "length_cut"]
    assert kept and cut, [o.reason for o in outcomes]  # the premise: both kinds in one batch
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for outcome in kept:
        turns = outcome.record["meta"]["generation"]["turns"]
        assert len(turns) == sum(m["role"] == "assistant" for m in outcome.record["messages"])
        for turn in turns:
            assert len(turn["token_ids"]) == turn["completion_tokens"] and turn["token_ids"][-1] == end
        tokenized = tokenize_conversation(tok, outcome.record, RenderSettings(
            template=None, thinking=True, max_len=10_000, overlength="truncate", answer_ids="emitted"))
        assert answer_runs(tokenized) == [t["token_ids"] for t in turns]
    assert all("token_ids" not in t for o in cut for t in o.generation["turns"])  # counted, never trained on
