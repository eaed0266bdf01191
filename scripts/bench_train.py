"""Benchmarks of draft training: tokens/s on the demo geometry, peak memory vs sequence length.

Usage:
    python scripts/bench_train.py                 # both parts, prints a markdown table
    python scripts/bench_train.py --part memory --lengths 2048 8192 32768

Memory: one training step (forward + backward, 7 TTT steps) on a single sequence per length,
each in a fresh subprocess, reporting peak RSS minus the process's RSS before the step. With
the blockwise TTT attention the growth must be linear in the length (no L x L tensor).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.ttt import teacher_targets, ttt_forward


def geometry(hidden: int, draft_vocab: int, vocab: int) -> DraftGeometry:
    heads = max(1, hidden // 64)
    return DraftGeometry(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads, head_dim=64,
                         intermediate_size=hidden * 11 // 4, fc_in_features=3 * hidden, vocab_size=vocab,
                         draft_vocab_size=draft_vocab, capture_layers=(2, 4, 5), target_num_layers=8)


def one_step(g: DraftGeometry, batch: int, seq: int, steps: int, block: int) -> float:
    torch.manual_seed(0)
    draft = Eagle3Draft(g)
    head = torch.randn(g.vocab_size, g.hidden_size) * 0.05
    aux = torch.randn(batch, seq, g.fc_in_features)
    ids = torch.randint(0, g.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    teacher = teacher_targets(torch.randn(batch, seq, g.hidden_size), head, draft.draft_ids())
    started = time.perf_counter()
    out = ttt_forward(draft, aux, ids, mask, torch.full((batch,), seq), teacher, steps=steps, block_size=block)
    out.loss.backward()
    return time.perf_counter() - started


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def memory_child(seq: int, hidden: int, draft_vocab: int, steps: int, block: int) -> None:
    """Runs in a subprocess: prints {seq, base_mb, peak_mb, seconds} as JSON."""
    torch.set_num_threads(2)
    g = geometry(hidden, draft_vocab, 8192)
    one_step(g, 1, 64, steps, block)  # warm up allocator and kernels
    base = rss_mb()
    seconds = one_step(g, 1, seq, steps, block)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seq": seq, "base_mb": round(base, 1), "peak_mb": round(peak, 1),
                      "step_mb": round(peak - base, 1), "seconds": round(seconds, 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "throughput", "memory"], default="all")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--hidden", type=int, default=128, help="memory part: small draft geometry")
    parser.add_argument("--draft-vocab", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args.child, args.hidden, args.draft_vocab, args.steps, args.block)
        return
    if args.part in ("all", "throughput"):
        g = geometry(256, 2048, 8192)  # the demo draft
        one_step(g, 8, 128, args.steps, args.block)
        runs = [one_step(g, 8, 128, args.steps, args.block) for _ in range(3)]
        best = min(runs)
        print(f"| throughput | demo geometry (H=256, Vd=2048), 8 x 128 tokens, {args.steps} TTT steps | "
              f"{8 * 128 / best:.0f} tok/s (best of 3; median {8 * 128 / sorted(runs)[1]:.0f}) |")
    if args.part in ("all", "memory"):
        rows = []
        for seq in args.lengths:
            out = subprocess.run([sys.executable, __file__, "--child", str(seq), "--hidden", str(args.hidden),
                                  "--draft-vocab", str(args.draft_vocab), "--steps", str(args.steps),
                                  "--block", str(args.block)], capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"| seq len | step memory (peak - before), MB | per 1K tokens, MB | seconds |  (H={args.hidden}, "
              f"Vd={args.draft_vocab}, {args.steps} TTT steps, block {args.block})")
        for row in rows:
            print(f"| {row['seq']} | {row['step_mb']} | {1024 * row['step_mb'] / row['seq']:.1f} | {row['seconds']} |")


if __name__ == "__main__":
    main()
