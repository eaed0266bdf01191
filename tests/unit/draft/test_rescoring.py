"""train.ttt_chains=rescored against the serving path: the draft's own chains, scored by the real target.

The reference drafts each chain as a served draft does (`Eagle3Drafter`'s KV cache, one token at a time)
and asks the target for its distribution after each explicit prefix (the data through the chain's start,
then the drafted tokens), one forward per prefix: nothing of the batched path (TTT attention, the prefix
tree, the per-step teacher tables) is shared with it.
"""

from __future__ import annotations

import pytest
import torch

from eagle3.demo.corpus import DEMO_TARGET_PATH
from eagle3.draft.attention import DraftKVCache
from eagle3.draft.geometry import geometry_from_target
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.rescoring import chain_nodes, draft_chains, rescore
from eagle3.draft.speculative import Eagle3Drafter
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.ttt import ttt_forward
from eagle3.target.decoder import find_decoder
from eagle3.target.tree import TreeScorer
from eagle3.target_info import read_config

CAPTURE = (2, 4, 5)
DRAFT_VOCAB = 512
STEPS = 3


# the demo target and one intra-op thread: tests/unit/draft/conftest.py
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(target):
    """Two right-padded samples (11 and 8 tokens), the target's captured and final states."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([11, 8])
    ids = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros(2, 11, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        ids[b, :n] = torch.randint(10, DRAFT_VOCAB, (n,), generator=gen)
        mask[b, 3:n] = 1  # a 3-token prompt, then the answer
    mask[0, 7] = 0  # a hole in the answer: a chain's deeper steps count past it
    aux = torch.zeros(2, 11, len(CAPTURE) * target.config.hidden_size)
    final = torch.zeros(2, 11, target.config.hidden_size)
    with torch.no_grad():
        for b, n in enumerate(lengths.tolist()):
            out = target.model(input_ids=ids[b:b + 1, :n], output_hidden_states=True)
            aux[b, :n] = torch.cat([out.hidden_states[i][0] for i in CAPTURE], -1)
            final[b, :n] = out.last_hidden_state[0]
    return ids, mask, lengths, aux, final


def make_draft(target, seed: int) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(geometry_from_target(read_config(DEMO_TARGET_PATH), CAPTURE, DRAFT_VOCAB))
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    t2d[:DRAFT_VOCAB] = True
    draft.init_from_target(target.get_input_embeddings().weight.detach(),
                           target.get_output_embeddings().weight.detach(),
                           torch.zeros(DRAFT_VOCAB, dtype=torch.long), t2d)
    return draft


def test_the_chains_are_what_a_served_draft_proposes_after_each_prefix(target, batch):
    ids, _, lengths, aux, _ = batch
    draft = make_draft(target, 0).eval()
    drafted = draft_chains(draft, aux, ids, STEPS, block_size=4)  # [K-1, B, T]
    drafter = Eagle3Drafter(draft)
    for b, n in enumerate(lengths.tolist()):
        for t in range(n - 1):
            drafter.reset()
            drafter.extend(aux[b, :t + 1], ids[b, 1:t + 2].tolist(), 0)
            assert drafted[:, b, t].tolist() == drafter.propose(STEPS - 1), (b, t)


def test_chain_nodes_mark_the_steps_that_count():
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1, 0]])
    started, depth = chain_nodes(mask, torch.tensor([7]), steps=4)
    # chain t: step 0 predicts t+2, step k predicts t+2+k; token 7 is past the sample's 7 tokens
    assert started[0].tolist() == [True, True, False, True, True, False, False, False]
    # t=0: steps 1 (token 3) and 3 (5) count -> depth 3; t=1: 3 (k=0), 5 (k=2), 6 (k=3) -> 3;
    # t=3: 5 (k=0), 6 (k=1) -> 1; t=4: 6 (k=0) only -> 0
    assert depth[0].tolist() == [3, 3, 0, 1, 0, 0, 0, 0]


def naive_rescored_loss(draft, target, batch, decay=0.8):
    """Per chain: the served draft's own tokens (a KV cache per layer, with grad), and per counted step
    the KL from the target's draft-vocab distribution after the explicit prefix."""
    ids, mask, lengths, aux, _ = batch
    draft_ids = draft.draft_ids()
    sums = [0.0] * STEPS
    rows = [0] * STEPS
    for b, n in enumerate(lengths.tolist()):
        for t in range(n - 2):
            if not mask[b, t + 2]:
                continue  # not started: a served draft starts its chains in the answer
            caches = [DraftKVCache() for _ in range(draft.geometry.num_layers)]
            attends = [c.attend for c in caches]
            state = draft.step(draft.project(aux[b:b + 1, :t + 1]), ids[b:b + 1, 1:t + 2], torch.arange(t + 1),
                               attends)[:, -1:]
            prefix = ids[b, :t + 2].tolist()
            for k in range(STEPS):
                if k > 0:
                    token = draft_ids[draft.logits(state).argmax(-1)]  # [1, 1]
                    prefix.append(int(token))
                    state = draft.step(draft.carry(state), token, torch.tensor([t + k]), attends)
                j = t + 2 + k
                if j >= n or not mask[b, j]:
                    continue
                with torch.no_grad():
                    logits = target(input_ids=torch.tensor([prefix])).logits[0, -1]
                if int(logits.argmax()) >= DRAFT_VOCAB:
                    continue  # the target's token is outside the draft vocab: out of the loss
                p = torch.softmax(logits[:DRAFT_VOCAB], -1)
                logq = torch.log_softmax(draft.logits(state)[0, 0], -1)
                sums[k] = sums[k] + (torch.xlogy(p, p) - p * logq).sum()
                rows[k] += 1
    return sum(decay ** k * sums[k] / max(rows[k], 1) for k in range(STEPS)), rows


def test_rescored_ttt_equals_the_served_chains_scored_by_the_target(target, batch):
    ids, mask, lengths, aux, final = batch
    draft = make_draft(target, 1)
    head = target.get_output_embeddings().weight.detach()
    teacher = teacher_targets(final, head, draft.draft_ids())
    rollout = rescore(draft, TreeScorer(find_decoder(target)), head, aux, ids, mask, lengths, steps=STEPS,
                      block_size=4)
    fast = ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=STEPS, decay=0.8, out_of_vocab="mask",
                       block_size=4, ttt_chains="rescored", rollout=rollout)
    ref, rows = naive_rescored_loss(draft, target, batch)
    assert fast.loss_tokens.tolist() == rows and min(rows) > 0
    assert fast.loss.item() == pytest.approx(float(ref.detach()), rel=1e-4)
    weights = [draft.fc.weight, draft.midlayer.self_attn.q_proj.weight]
    for fast_grad, ref_grad in zip(torch.autograd.grad(fast.loss, weights), torch.autograd.grad(ref, weights),
                                   strict=True):
        torch.testing.assert_close(fast_grad, ref_grad, atol=1e-5, rtol=1e-3)
    # the steps after the first read the draft's tokens, not the data's: the data's chains train elsewhere
    plain = ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=STEPS, decay=0.8, out_of_vocab="mask",
                        block_size=4)
    assert fast.step_loss[0] == pytest.approx(float(plain.step_loss[0]), rel=1e-6)
    assert abs(float(fast.step_loss[1]) - float(plain.step_loss[1])) > 1e-3
