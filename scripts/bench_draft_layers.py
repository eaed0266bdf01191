#!/usr/bin/env python
"""What each extra draft decoder layer, or MLA attention, costs: parameters, a training step, a drafted token.

    python scripts/bench_draft_layers.py [--target eagle3/assets/demo_target] [--layers 1 2 3] [--rounds 7]
    python scripts/bench_draft_layers.py --target eagle3/assets/demo_kimi_target --layers 1 \
        --attentions llama mla --draft-vocab 2048      # the Llama-style vs the MLA draft on demo_kimi

For each `--attentions` choice (`model.draft.attention`) and `model.draft.num_layers` the draft is
built on the target's geometry with random weights (cost does not depend on the values) and timed
in rounds that visit every variant in turn (1 2 3 1 2 3 ...), so a noisy shared machine slows all
of them alike; the medians are reported as ratios to the first variant:

* train step: forward and backward of `ttt_forward` (train.ttt_steps TTT steps, the default 7) over
  one `--train-tokens`-token sample, loss on every answer position;
* drafted token: `Eagle3Drafter.propose(K)` after a `--prefix`-token prefill, per proposed token
  (the draft's share of a speculative step; the target's verify is the same for every draft).

Parameters are also counted at the Kimi-K2.5 draft geometry (conf/model/kimi_k25.yaml: hidden
7168, fc 21504 -> 7168, 64 query and 8 kv heads, MLP 18432, draft vocab 32K, target vocab
163840) on the meta device, without allocating them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from eagle3.draft.geometry import DraftGeometry, geometry_from_target  # noqa: E402
from eagle3.draft.model import Eagle3Draft, count_trainable  # noqa: E402
from eagle3.draft.speculative import Eagle3Drafter  # noqa: E402
from eagle3.draft.teacher import teacher_targets  # noqa: E402
from eagle3.draft.ttt import ttt_forward  # noqa: E402
from eagle3.layer_ids import default_capture_layers  # noqa: E402
from eagle3.target_info import read_config  # noqa: E402

KIMI = {"hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 112,
        "intermediate_size": 18432, "vocab_size": 163840, "num_hidden_layers": 61,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def draft_for(target_cfg: dict, layers: int, draft_vocab: int, attention: str = "llama") -> Eagle3Draft:
    capture = default_capture_layers(int(target_cfg["num_hidden_layers"]))
    g = geometry_from_target(target_cfg, capture, min(draft_vocab, int(target_cfg["vocab_size"])),
                             {"num_layers": layers, "attention": attention})
    draft = Eagle3Draft(g)
    with torch.no_grad():
        draft.d2t.zero_()
        draft.t2d.zero_()
        draft.t2d[: g.draft_vocab_size] = True
    return draft


def kimi_params(layers: int, attention: str = "llama") -> int:
    with torch.device("meta"):
        draft = draft_for(KIMI, layers, 32000, attention)
    return count_trainable(draft)


def train_step_seconds(draft: Eagle3Draft, head: torch.Tensor, tokens: int, steps: int) -> float:
    g: DraftGeometry = draft.geometry
    ids = torch.randint(0, g.draft_vocab_size, (1, tokens))
    mask = torch.ones(1, tokens, dtype=torch.long)
    aux, final = torch.randn(1, tokens, g.fc_in_features), torch.randn(1, tokens, head.shape[1])
    lengths = torch.tensor([tokens])
    started = time.perf_counter()
    teacher = teacher_targets(final, head, draft.draft_ids())
    out = ttt_forward(draft, aux, ids, mask, lengths, teacher, steps=steps, decay=0.8, out_of_vocab="mask",
                      block_size=256)
    out.loss.backward()
    draft.zero_grad(set_to_none=True)
    return time.perf_counter() - started


@torch.no_grad()
def drafted_token_seconds(draft: Eagle3Draft, prefix: int, k: int) -> float:
    g = draft.geometry
    drafter = Eagle3Drafter(draft)
    drafter.extend(torch.randn(prefix, g.fc_in_features), torch.randint(0, g.draft_vocab_size, (prefix,)).tolist(), 0)
    started = time.perf_counter()
    for _ in range(8):
        drafter.propose(k)
    return (time.perf_counter() - started) / (8 * k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=str(REPO / "eagle3" / "assets" / "demo_target"))
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--attentions", nargs="+", default=["llama"], choices=["llama", "mla"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--train-tokens", type=int, default=512)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--prefix", type=int, default=128)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--draft-vocab", type=int, default=32000)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.manual_seed(0)
    target_cfg = read_config(args.target)
    if target_cfg is None:
        sys.exit(f"--target {args.target}: no config.json there (a local checkpoint directory is needed)")
    variants = [(a, n) for a in args.attentions for n in args.layers]  # (attention, layers)
    drafts = {v: draft_for(target_cfg, v[1], args.draft_vocab, v[0]) for v in variants}
    head = torch.randn(int(target_cfg["vocab_size"]), int(target_cfg["hidden_size"]))
    train: dict[tuple, list[float]] = {v: [] for v in variants}
    decode: dict[tuple, list[float]] = {v: [] for v in variants}
    for v in variants:  # warm-up, not timed
        train_step_seconds(drafts[v], head, args.train_tokens, args.ttt_steps)
        drafted_token_seconds(drafts[v], args.prefix, args.k)
    for _ in range(args.rounds):
        for v in variants:
            train[v].append(train_step_seconds(drafts[v], head, args.train_tokens, args.ttt_steps))
            decode[v].append(drafted_token_seconds(drafts[v], args.prefix, args.k))
    first = variants[0]
    rows = []
    for v in variants:
        t, d = statistics.median(train[v]), statistics.median(decode[v])
        rows.append({"attention": v[0], "num_layers": v[1], "params": count_trainable(drafts[v]),
                     "kimi_params": kimi_params(v[1], v[0]), "train_step_s": t,
                     "train_ratio": t / statistics.median(train[first]), "drafted_token_ms": d * 1e3,
                     "draft_ratio": d / statistics.median(decode[first])})
    print(f"target {args.target}: {args.train_tokens}-token sample, {args.ttt_steps} TTT steps; "
          f"propose K={args.k} after {args.prefix} tokens; medians of {args.rounds} interleaved rounds")
    print(f"| attention | layers | trainable params | at Kimi geometry | train step | vs {first[0]} x{first[1]} | "
          f"per drafted token | vs {first[0]} x{first[1]} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['attention']} | {r['num_layers']} | {r['params']:,} | {r['kimi_params'] / 1e9:.2f} B | "
              f"{r['train_step_s']:.3f} s | {r['train_ratio']:.2f}x | {r['drafted_token_ms']:.2f} ms | "
              f"{r['draft_ratio']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
