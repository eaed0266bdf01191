#!/usr/bin/env python
"""What each extra draft decoder layer costs: parameters, a training step, a drafted token.

    python scripts/bench_draft_layers.py [--target eagle3/assets/demo_target] [--layers 1 2 3] [--rounds 7]

For each `model.draft.num_layers` the draft is built on the target's geometry with random weights
(cost does not depend on the values) and timed in rounds that visit every layer count in turn
(1 2 3 1 2 3 ...), so a noisy shared machine slows all of them alike; the medians are reported as
ratios to the one-layer draft:

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
from eagle3.draft.ttt import teacher_targets, ttt_forward  # noqa: E402
from eagle3.layer_ids import default_capture_layers  # noqa: E402
from eagle3.target_info import read_config  # noqa: E402

KIMI = {"hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 112,
        "intermediate_size": 18432, "vocab_size": 163840, "num_hidden_layers": 61}


def draft_for(target_cfg: dict, layers: int, draft_vocab: int) -> Eagle3Draft:
    capture = default_capture_layers(int(target_cfg["num_hidden_layers"]))
    g = geometry_from_target(target_cfg, capture, min(draft_vocab, int(target_cfg["vocab_size"])),
                             {"num_layers": layers})
    draft = Eagle3Draft(g)
    with torch.no_grad():
        draft.d2t.zero_()
        draft.t2d.zero_()
        draft.t2d[: g.draft_vocab_size] = True
    return draft


def kimi_params(layers: int) -> int:
    with torch.device("meta"):
        draft = draft_for(KIMI, layers, 32000)
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
    drafts = {n: draft_for(target_cfg, n, args.draft_vocab) for n in args.layers}
    head = torch.randn(int(target_cfg["vocab_size"]), int(target_cfg["hidden_size"]))
    train: dict[int, list[float]] = {n: [] for n in args.layers}
    decode: dict[int, list[float]] = {n: [] for n in args.layers}
    for n in args.layers:  # warm-up, not timed
        train_step_seconds(drafts[n], head, args.train_tokens, args.ttt_steps)
        drafted_token_seconds(drafts[n], args.prefix, args.k)
    for _ in range(args.rounds):
        for n in args.layers:
            train[n].append(train_step_seconds(drafts[n], head, args.train_tokens, args.ttt_steps))
            decode[n].append(drafted_token_seconds(drafts[n], args.prefix, args.k))
    first = args.layers[0]
    rows = []
    for n in args.layers:
        t, d = statistics.median(train[n]), statistics.median(decode[n])
        rows.append({"num_layers": n, "params": count_trainable(drafts[n]), "kimi_params": kimi_params(n),
                     "train_step_s": t, "train_ratio": t / statistics.median(train[first]),
                     "drafted_token_ms": d * 1e3, "draft_ratio": d / statistics.median(decode[first])})
    print(f"target {args.target}: {args.train_tokens}-token sample, {args.ttt_steps} TTT steps; "
          f"propose K={args.k} after {args.prefix} tokens; medians of {args.rounds} interleaved rounds")
    print("| layers | trainable params | at Kimi geometry | train step | vs 1 layer | per drafted token | vs 1 layer |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['num_layers']} | {r['params']:,} | {r['kimi_params'] / 1e9:.2f} B | {r['train_step_s']:.3f} s | "
              f"{r['train_ratio']:.2f}x | {r['drafted_token_ms']:.2f} ms | {r['draft_ratio']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
