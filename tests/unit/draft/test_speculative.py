"""In-process greedy speculative decoding with the demo target: lossless, accounted exactly.

A random-weight draft accepts (almost) nothing, so it only exercises the rejection path. The
oracle drafters below propose the target's own greedy continuation (optionally corrupted at
random positions) to drive every accept length 0..K through both caches; they exist for
fault and bound testing only.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from eagle3.demo.corpus import DEMO_TARGET_PATH
from eagle3.demo.datasets import demo_prompts_records
from eagle3.draft.geometry import geometry_from_target
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.speculative import (
    Eagle3Drafter,
    evaluate_speculative,
    greedy_generate,
    speculative_generate,
)
from eagle3.reports.eval_report import write_eval_report
from eagle3.target_info import read_config as target_text_config

CAPTURE = (2, 4, 5)
DRAFT_VOCAB = 2048
EOS = 8175  # <|im_end|>
MAX_NEW = 48
_ROLE = {"system": "system", "human": "user", "gpt": "assistant"}


# the demo target and one intra-op thread: tests/unit/draft/conftest.py
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompts():
    """Held-out demo prompts: the conversation up to its last user turn, generation prompt added."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO_TARGET_PATH)
    out = []
    for rec in demo_prompts_records(12, seed=0):
        msgs = [{"role": _ROLE[t["from"]], "content": t["value"]} for t in rec["conversations"]]
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        enc = tok.apply_chat_template(msgs[:last_user + 1], add_generation_prompt=True, tokenize=True)
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


def random_draft(target, seed: int = 0, num_layers: int = 1) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(geometry_from_target(target_text_config(DEMO_TARGET_PATH), CAPTURE, DRAFT_VOCAB,
                                             {"num_layers": num_layers}))
    d2t = torch.zeros(DRAFT_VOCAB, dtype=torch.long)  # draft ids 0..2047 = target ids 0..2047
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    t2d[:DRAFT_VOCAB] = True
    draft.init_from_target(target.get_input_embeddings().weight.detach(),
                           target.get_output_embeddings().weight.detach(), d2t, t2d)
    return draft.eval()


@pytest.fixture(scope="module")
def draft(target):
    return random_draft(target)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-layer", "2-layer"])
def layered_draft(target, request):
    """The draft with one decoder layer, and with two (one KV cache per layer)."""
    return random_draft(target, num_layers=request.param)


class OracleDrafter:
    """Proposes the target's own greedy continuation, corrupting each token with probability p.

    With `inner` set, the real drafter's extend/propose run alongside (their tokens discarded),
    so the EAGLE-3 draft cache goes through every accept length the oracle produces.
    """

    def __init__(self, target, prompt: list[int], horizon: int, p_wrong: float = 0.0, seed: int = 0,
                 inner: Eagle3Drafter | None = None) -> None:
        cont = greedy_generate(target, prompt, horizon, eos_ids=()).tokens  # no EOS: defined past it
        self.full = list(prompt) + cont
        self.p_wrong, self.rng, self.inner = p_wrong, random.Random(seed), inner
        self.length = 0  # committed tokens

    def reset(self) -> None:
        self.length = 0
        if self.inner:
            self.inner.reset()

    def extend(self, aux, next_tokens, start) -> None:
        assert list(next_tokens) == self.full[start + 1:start + 1 + len(next_tokens)], "committed != greedy"
        self.length = start + len(next_tokens) + 1
        if self.inner:
            self.inner.extend(aux, next_tokens, start)

    def propose(self, k: int) -> list[int]:
        if self.inner:
            self.inner.propose(k)
        out = list(self.full[self.length:self.length + k])
        assert len(out) == k, "oracle horizon too short"
        for i in range(k):
            if self.rng.random() < self.p_wrong:
                out[i] = (out[i] + 1 + self.rng.randrange(100)) % 8192
        return out


@pytest.mark.slow
def test_lossless_random_draft_on_held_out_prompts(target, draft, prompts):
    assert len(prompts) >= 12
    report = evaluate_speculative(target, draft, prompts, ks=(1, 3, 5), max_new_tokens=MAX_NEW, eos_ids=[EOS],
                                  capture_layers=CAPTURE, warmup=False)
    assert json.loads(json.dumps(report)) == report  # plain types, string keys
    assert list(report) == ["1", "3", "5"]
    base_tokens = report["1"]["baseline"]["tokens"]
    assert base_tokens > len(prompts) * 10
    for k in (1, 3, 5):
        row = report[str(k)]
        assert row["num_prompts"] == len(prompts) and row["max_new_tokens"] == MAX_NEW
        assert row["lossless"] is True and row["first_mismatch"] is None, row
        c = row["counts"]
        assert c["tokens"] == base_tokens
        # Every output token but each prompt's prefill token comes from a verify forward.
        assert c["verify_tokens"] == base_tokens - len(prompts)
        assert row["accept_length"] == pytest.approx(c["verify_tokens"] / c["verify_forwards"])
        assert row["sglang_accept_length"] == pytest.approx(base_tokens / c["verify_forwards"])
        assert 1.0 <= row["accept_length"] <= k + 1
        assert len(row["acceptance_rate"]) == k and c["reached"][0] == c["verify_forwards"]
        assert row["accept_length_untruncated"] == pytest.approx(1 + sum(row["acceptance_rate_marginal"]))
        assert row["wall_s"] > 0 and row["draft_s"] > 0 and row["target_s"] > 0
        assert row["draft_s"] + row["target_s"] <= row["wall_s"] * 1.01


@pytest.mark.parametrize("k", [2, 5])
def test_oracle_draft_accepts_k_plus_one_per_verify(target, prompts, k):
    prompt = prompts[1]
    greedy = greedy_generate(target, prompt, MAX_NEW, [EOS]).tokens
    oracle = OracleDrafter(target, prompt, MAX_NEW + k + 1)
    res = speculative_generate(target, oracle, prompt, MAX_NEW, k, [EOS], CAPTURE)
    assert res.tokens == greedy
    after_prefill = len(greedy) - 1
    verifies = math.ceil(after_prefill / (k + 1))
    assert res.verify_forwards == verifies
    assert res.accepted_per_verify == [k] * verifies  # every draft accepted, before truncation
    last = after_prefill - (verifies - 1) * (k + 1)  # the final round is cut at EOS / max_new_tokens
    assert res.emitted_per_verify == [k + 1] * (verifies - 1) + [last]
    assert res.reached == [verifies] * k and res.accepted == [verifies] * k
    assert res.accept_length == pytest.approx(after_prefill / verifies)
    if after_prefill % (k + 1) == 0:
        assert res.accept_length == k + 1


@pytest.mark.slow
def test_noisy_oracle_is_lossless_and_draft_cache_holds_only_committed_positions(target, layered_draft, prompts):
    """Partial acceptance at every offset crops both caches; each draft layer's cache must equal a fresh prefill."""
    draft = layered_draft
    k = 4
    seen_accepts: set[int] = set()
    for i, prompt in enumerate(prompts[:4]):
        inner = Eagle3Drafter(draft)
        oracle = OracleDrafter(target, prompt, MAX_NEW + k + 1, p_wrong=0.25, seed=i, inner=inner)
        res = speculative_generate(target, oracle, prompt, MAX_NEW, k, [EOS], CAPTURE)
        assert res.tokens == greedy_generate(target, prompt, MAX_NEW, [EOS]).tokens
        seen_accepts |= set(res.accepted_per_verify)
        # Reference: one target forward over the committed sequence, one draft prefill over it.
        seq = prompt + res.tokens
        n = len(inner.caches[0])
        assert n == inner.length and n <= len(seq) - 1
        with torch.inference_mode():
            out = target(input_ids=torch.tensor([seq[:n]]), output_hidden_states=True)
            aux = torch.cat([out.hidden_states[c][0] for c in CAPTURE], dim=-1)
            fresh = Eagle3Drafter(draft)
            fresh.extend(aux, seq[1:n + 1], 0)
        for mine, ref in zip(inner.caches, fresh.caches, strict=True):
            assert torch.allclose(mine.keys, ref.keys, atol=1e-4) and torch.allclose(mine.values, ref.values, atol=1e-4)
        assert torch.allclose(inner.last_state, fresh.last_state, atol=1e-4)
    assert {0, k} <= seen_accepts and len(seen_accepts) >= 4


def test_draft_chain_equals_ttt_steps_at_the_last_position(target, layered_draft, prompts):
    """propose() = TTT steps 0..K-1 at position t = n-1 fed with the proposed tokens, caches unchanged."""
    from eagle3.draft.attention import TTTAttention

    draft = layered_draft
    prompt = prompts[2]
    with torch.inference_mode():
        out = target(input_ids=torch.tensor([prompt]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[c][0] for c in CAPTURE], dim=-1)
        y = int(out.logits[0, -1].argmax())
        drafter = Eagle3Drafter(draft)
        drafter.extend(aux, prompt[1:] + [y], 0)
        keys_before = [cache.keys.clone() for cache in drafter.caches]
        proposed = drafter.propose(3)
        assert len(drafter.caches) == draft.geometry.num_layers
        assert all(torch.equal(c.keys, before) for c, before in zip(drafter.caches, keys_before, strict=True))
        # TTT reference over the whole sequence: tokens shifted by 1+k, rope position t+k.
        n = len(prompt)
        ids = torch.tensor([prompt + [y] + proposed])  # token n+1+k is the k-th proposal
        attention = TTTAttention(draft.geometry.num_layers, block_size=16)
        hidden = draft.project(aux.unsqueeze(0))
        pos = torch.arange(n)
        for step in range(3):
            state = draft.step(hidden, ids[:, 1 + step:n + 1 + step], pos + step, attention.attends)
            pred = int(draft.draft_ids()[draft.logits(state[0, -1]).argmax()])
            assert pred == proposed[step]
            hidden = state


def test_eos_and_length_limits(target, draft, prompts):
    prompt = prompts[3]
    greedy = greedy_generate(target, prompt, MAX_NEW, eos_ids=()).tokens
    # A token first produced mid-output acts as EOS: both decoders stop right after it, even
    # when it falls inside an accepted chain (oracle, K=5).
    stop = next(t for i, t in enumerate(greedy) if i >= 7 and t not in greedy[:i])
    cut = greedy.index(stop) + 1
    for drafter in (draft, OracleDrafter(target, prompt, MAX_NEW + 6)):
        ref = greedy_generate(target, prompt, MAX_NEW, [stop])
        res = speculative_generate(target, drafter, prompt, MAX_NEW, 5, [stop], CAPTURE)
        assert ref.tokens == greedy[:cut] and res.tokens == ref.tokens
        assert sum(res.emitted_per_verify) == cut - 1
    # EOS as the very first token: no verify forward at all.
    res = speculative_generate(target, draft, prompt, MAX_NEW, 3, [greedy[0]], CAPTURE)
    assert res.tokens == greedy[:1] and res.verify_forwards == 0 and res.accept_length == 1.0
    # max_new_tokens 1 and 0.
    assert speculative_generate(target, draft, prompt, 1, 3, [], CAPTURE).tokens == greedy[:1]
    assert speculative_generate(target, draft, prompt, 0, 3, [], CAPTURE).tokens == []
    assert greedy_generate(target, prompt, 0, []).tokens == []
    # Odd limits against the oracle: the last round is cut to the budget exactly.
    res = speculative_generate(target, OracleDrafter(target, prompt, 30), prompt, 11, 4, [], CAPTURE)
    assert res.tokens == greedy[:11] and res.emitted_per_verify == [5, 5]
    # An EOS just past the budget inside the last accepted chain: the budget wins, as in greedy
    # decoding (the stop token at index `cut - 1`, the budget one short of it).
    res = speculative_generate(target, OracleDrafter(target, prompt, MAX_NEW + 6), prompt, cut - 1, 5, [stop],
                               CAPTURE)
    assert res.tokens == greedy_generate(target, prompt, cut - 1, [stop]).tokens == greedy[:cut - 1]


def test_report_files(tmp_path, target, draft, prompts):
    real = evaluate_speculative(target, draft, prompts[:2], ks=(2, 3), max_new_tokens=8, eos_ids=[EOS],
                                capture_layers=CAPTURE)
    # The layout stages/eval.py writes: simulated TTT metrics (int keys, as evaluate_pooled returns them).
    report = {"dataset": "demo", "real": real, "prompt_ids": ["a", "b"],
              "simulated": {"acc": [0.7, 0.6, 0.5, 0.4], "sim_accept_len": 2.4,
                            "sim_accept_len_by_k": {1: 1.7, 2: 2.12, 3: 2.33, 4: 2.4}}}
    paths = write_eval_report(report, tmp_path / "eval")
    assert set(paths) == {"json", "md", "png"}
    assert [p.name for p in paths.values()] == ["eval_report.json", "eval_report.md", "acceptance.png"]
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(report))
    md = paths["md"].read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 2 |") or line.startswith("| 3 |")]
    assert len(rows) == 2 and "| 2.12 |" in rows[0] and "| 2.33 |" in rows[1]
    assert all(line.rstrip().endswith("| yes |") for line in rows)
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not [p for p in paths["json"].parent.iterdir() if p.name.startswith(".")]  # no temp leftovers

    # Simulated from per-step acc only (no by-K table); K beyond the simulated steps is flagged.
    short = {"real": real, "simulated": {"acc": [0.7, 0.6]}}
    md = write_eval_report(short, tmp_path / "short")["md"].read_text()
    assert "| 2 | " in md and "| 2.12 |" in md and "| 2.12* |" in md
