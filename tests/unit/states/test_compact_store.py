"""The compact storage format: int8 group-quantised captures and the teacher as its top k.

Math against naive references (quantisation bound, top k, the teacher rebuilt from the top k
equals the teacher from the final state), the byte budget at Kimi geometry, and stage `extract`
writing a compact store that the trainer's loader reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.draft.batching import collate_padded
from eagle3.draft.teacher import teacher_from_topk, teacher_targets
from eagle3.states import codec, formats
from eagle3.states.dataset import HiddenStateDataset
from eagle3.states.store import HiddenStateStore

# The tiny saved Llama and the merge stand-in of the extract tests (their fixtures, reused).
from tests.unit.stages.test_extract import (  # noqa: F401
    CAPTURE,
    _merge_standin,
    config,
    make_records,
    run,
    target_dir,
    write_merge,
)

KIMI_HIDDEN, KIMI_CAPTURES = 7168, 3


def test_compact_fits_24_kib_per_token_at_kimi_geometry_and_says_what_it_holds():
    per_token = formats.bytes_per_token("compact", KIMI_HIDDEN, KIMI_CAPTURES)
    values = KIMI_CAPTURES * KIMI_HIDDEN
    assert per_token == values + values // 64 * 2 + 64 * (4 + 2) + 4 == 22_564
    assert per_token <= 24 * 1024 < formats.bytes_per_token("fp8", KIMI_HIDDEN, KIMI_CAPTURES)
    assert formats.tensor_names("compact") == ("aux", "aux_scale", "teacher_ids", "teacher_logprob", "ids")
    assert formats.format_params("compact") == {"group": 64, "topk": 64} and formats.format_params("bf16") == {}
    # A hidden size that is no multiple of the group still counts its short last group.
    assert formats.bytes_per_token("compact", 100, 1) == 100 + 2 * 2 + 64 * 6 + 4


@pytest.mark.parametrize("width", [256, 100])
def test_int8_groups_round_trip_within_half_a_step_of_each_groups_scale(width):
    torch.manual_seed(0)
    x = torch.randn(7, width) * torch.logspace(-3, 3, width)  # values spanning six decades
    x[2] = 0.0  # an all-zero token keeps scale 1 and decodes to zeros
    x[3, 5] = 4000.0  # an outlier channel spoils only its own group
    q, scale = codec.quantize_int8_groups(x, group=32)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (7, -(-width // 32))
    back = codec.dequantize_int8_groups(q, scale, group=32)
    for t in range(7):
        for g in range(scale.shape[1]):
            block = slice(32 * g, min(32 * (g + 1), width))
            naive_scale = float(x[t, block].abs().max()) / 127 or 1.0
            assert float(scale[t, g]) == pytest.approx(naive_scale, rel=2 ** -8)
            assert (back[t, block] - x[t, block]).abs().max() <= float(scale[t, g]) / 2 * (1 + 1e-6)
    assert torch.equal(back[2], torch.zeros(width)) and back[3, 5] == pytest.approx(4000.0, rel=2 ** -8)


def test_teacher_topk_is_the_naive_log_softmax_top_k():
    torch.manual_seed(1)
    final, head = torch.randn(9, 16), torch.randn(300, 16)
    ids, logp = codec.teacher_topk(final, head, k=5, chunk_tokens=4)
    assert ids.dtype == torch.int32 and logp.dtype == torch.float16 and ids.shape == (9, 5)
    for t in range(9):
        naive = torch.log_softmax(final[t] @ head.T, dim=-1)
        order = sorted(range(300), key=lambda i: -float(naive[i]))[:5]
        assert ids[t].tolist() == order
        assert torch.allclose(logp[t].float(), naive[order], atol=2e-3)
    small_vocab_ids, _ = codec.teacher_topk(final, head[:3], k=64)
    assert small_vocab_ids.shape == (9, 3)  # k is at most the vocab


@pytest.mark.parametrize("renormalise", [True, False])
def test_teacher_from_the_whole_top_k_equals_the_teacher_from_the_final_state(renormalise):
    torch.manual_seed(2)
    bsz, seq, hidden, vocab = 2, 6, 16, 40
    final, head = torch.randn(bsz, seq, hidden), torch.randn(vocab, hidden) * 2
    draft_ids = torch.tensor([0, 3, 4, 7, 9, 11, 20, 33])
    needed = torch.rand(bsz, seq) > 0.3
    exact = teacher_targets(final, head, draft_ids, renormalise=renormalise, needed=needed)
    ids, logp = codec.teacher_topk(final.reshape(-1, hidden), head, k=vocab)
    top = teacher_from_topk(ids.long().view(bsz, seq, -1), logp.float().view(bsz, seq, -1), vocab, draft_ids,
                            renormalise=renormalise, needed=needed)
    assert torch.equal(top.row_of, exact.row_of) and torch.equal(top.argmax, exact.argmax)
    assert torch.allclose(top.probs, exact.probs, atol=2e-3)

    # A short top k keeps the in-vocab part of it; what it leaves out is the tail, nothing else.
    ids3, logp3 = codec.teacher_topk(final.reshape(-1, hidden), head, k=3)
    cut = teacher_from_topk(ids3.long().view(bsz, seq, -1), logp3.float().view(bsz, seq, -1), vocab, draft_ids,
                            renormalise=renormalise, needed=needed)
    assert torch.equal(cut.argmax, exact.argmax)
    full = torch.softmax(final.reshape(-1, hidden) @ head.T, dim=-1)
    for b, t in needed.nonzero().tolist():
        row = full[b * seq + t]
        kept = row.topk(3).indices.tolist()
        naive = torch.tensor([float(row[i]) if int(i) in kept else 0.0 for i in draft_ids])
        if renormalise and naive.sum() > 0:
            naive = naive / naive.sum()
        assert torch.allclose(cut.at(b, t), naive, atol=2e-3), (b, t)


def test_encode_records_the_teacher_tail_and_decode_item_gives_what_training_reads():
    torch.manual_seed(3)
    aux, final, head = torch.randn(5, 3 * 64), torch.randn(5, 64), torch.randn(100, 64)
    ids = torch.arange(5)
    enc = codec.encode(aux, final, ids, "compact", head=head)
    assert set(enc.tensors) == set(formats.tensor_names("compact"))
    tail = 1 - torch.softmax(final @ head.T, -1).topk(64).values.sum(-1)
    assert enc.rel_err_max[1] == pytest.approx(float(tail.max()), abs=2e-3)
    assert enc.rel_err_sum[1] == pytest.approx(float(tail.sum()), abs=1e-2)
    assert 0 < enc.rel_err_max[0] < 0.02  # int8 in groups of 64: well under fp8's ~3%
    item = codec.decode_item(enc.tensors, "compact")
    assert set(item) == {"aux", "input_ids", "teacher_ids", "teacher_logprob"}
    assert item["teacher_ids"].dtype == torch.long and item["teacher_logprob"].shape == (5, 64)
    with pytest.raises(ValueError, match="needs the target lm_head"):
        codec.encode(aux, final, ids, "compact")
    with pytest.raises(ValueError, match="read it with decode_item"):
        codec.decode(enc.tensors, "compact")


def test_extract_writes_a_compact_store_the_loader_reads(target_dir, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    records = make_records(10)
    cfg = config(target_dir, tmp_path, "extract.storage_format=compact")
    write_merge(cfg, tmp_path, records[:8], records[8:])
    manifest = run(cfg, tmp_path)
    assert manifest.status == "complete" and manifest.counts["out"] == 10
    assert manifest.extra["bytes_per_token"] == formats.bytes_per_token("compact", 64, len(CAPTURE))
    assert Path(manifest.extra["store_dir"]).name.endswith("-compact")
    assert HiddenStateStore(manifest.extra["store_dir"]).meta["format_params"] == {"group": 64, "topk": 64}

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    data = HiddenStateDataset.from_manifests(manifest, "train")
    items = list(data)
    for item, record in zip(items, records[:8], strict=True):
        with torch.no_grad():
            out = model(torch.tensor([record["input_ids"]]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i][0] for i in CAPTURE], dim=-1)
        assert (item["aux"] - aux).norm(dim=-1).div(aux.norm(dim=-1)).max() < 0.02
        naive = torch.log_softmax(out.logits[0].float(), dim=-1).topk(64)
        assert torch.equal(item["teacher_ids"], naive.indices)
        assert torch.allclose(item["teacher_logprob"], naive.values, atol=5e-3)
        assert "final" not in item
    batch = collate_padded(items[:3])
    assert batch["teacher_ids"].shape == (3, int(batch["lengths"].max()), 64) and "final" not in batch


@pytest.fixture(scope="module")
def peaked_target_dir(tmp_path_factory):
    """The tiny Llama with a 40x lm_head: a randomly initialised head is almost flat over 512 ids
    (logit std ~0.2), where no top k is the distribution; a trained target is peaked, as this one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    path = tmp_path_factory.mktemp("peaked_llama")
    model.save_pretrained(path)
    return path


def test_the_trainer_scores_a_compact_batch_as_it_scores_the_exact_one(peaked_target_dir, tmp_path):
    """One TTT forward of the same draft on the same samples, from an fp32 store and a compact one:
    the loss and the agreement counts the trainer sees are those of the exact states."""
    target_dir = peaked_target_dir
    import json

    from eagle3.config.schema import TrainConfig
    from eagle3.draft.geometry import geometry_from_target
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.target.weights import load_embedding_and_head

    records = make_records(12, seed=5)
    batches, stores = {}, {}
    for fmt in ("fp32", "compact"):
        root = tmp_path / fmt
        cfg = config(target_dir, root, f"extract.storage_format={fmt}")
        write_merge(cfg, root, records[:10], records[10:])
        stores[fmt] = run(cfg, root)
        data = HiddenStateDataset.from_manifests(stores[fmt], "train")
        batches[fmt] = collate_padded([data[i] for i in range(len(data))])
    assert torch.equal(batches["fp32"]["input_ids"], batches["compact"]["input_ids"])
    assert stores["compact"].extra["reconstruction_error"]["teacher_tail_max"] < 0.01  # the tail the top 64 leaves out

    embed, head = load_embedding_and_head(str(target_dir))
    geometry = geometry_from_target(json.loads((target_dir / "config.json").read_text()), CAPTURE, 256)
    d2t = torch.arange(0, 512, 2) - torch.arange(256)  # the even ids: half the vocab is outside the draft's
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[::2] = True
    torch.manual_seed(0)
    module = DraftModule(geometry, head, TrainConfig(ttt_steps=3), embed=embed, d2t=d2t, t2d=t2d)
    with torch.no_grad():
        exact, compact = module.run_batch(batches["fp32"]), module.run_batch(batches["compact"])
    assert exact.counted.tolist() == compact.counted.tolist() and exact.counted.sum() > 100
    assert float(compact.loss) == pytest.approx(float(exact.loss), rel=0.01)
    assert (compact.correct - exact.correct).abs().max() <= 2, (compact.correct, exact.correct)
