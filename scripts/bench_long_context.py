"""Long context: one packed TTT training step per row length, its peak memory and tokens/s.

Usage:
    python scripts/bench_long_context.py                                   # 2K/4K/8K/16K, one sample per row
    python scripts/bench_long_context.py --sample-tokens 2048              # rows of 2,048-token samples
    python scripts/bench_long_context.py --geometry smollm2 --lengths 2048 4096 --precision bf16-mixed

Each length runs in a fresh process: the draft (random weights, the `--geometry` target's draft
shape), random captured and final states, a packed row (`eagle3.draft.packing.collate_packed`)
of `--sample-tokens` samples (default: one sample as long as the row, the long-trajectory case),
the first quarter of each sample a prompt out of the loss; then one step as the train stage runs
it: the teacher at the positions a loss reads, the K-step TTT forward with `train.attention_block`
blocking and the `train.logits_memory_gb` budget, backward. Memory is the step's peak RSS minus the
RSS before it (the inputs already built); on a GPU also torch's peak allocated bytes. Linear in
length means a constant cost per added token: the table gives MB per 1K tokens and the marginal
MB per 1K tokens from the previous length.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.packing import collate_packed
from eagle3.draft.teacher import teacher_positions, teacher_targets
from eagle3.draft.ttt import ttt_forward

#: hidden, heads, kv heads, intermediate, draft vocab, target vocab (scripts/bench_train.py's targets).
GEOMETRIES = {"demo": (256, 4, 4, 704, 2048, 8192), "smollm2": (576, 9, 3, 1536, 32000, 49152)}


def geometry(name: str) -> DraftGeometry:
    hidden, heads, kv, inter, draft_vocab, vocab = GEOMETRIES[name]
    return DraftGeometry(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                         head_dim=hidden // heads, intermediate_size=inter, fc_in_features=3 * hidden,
                         vocab_size=vocab, draft_vocab_size=draft_vocab, capture_layers=(2, 4, 5),
                         target_num_layers=8)


def packed_row(g: DraftGeometry, tokens: int, sample_tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A row of `tokens` tokens: samples of `sample_tokens` (the last one shorter), random states."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [min(sample_tokens, tokens - start) for start in range(0, tokens, sample_tokens)]
    samples = []
    for n in sizes:
        mask = torch.ones(n, dtype=torch.long)
        mask[:n // 4] = 0
        samples.append({"input_ids": torch.randint(0, g.vocab_size, (n,), generator=gen), "loss_mask": mask,
                        "aux": torch.randn(n, g.fc_in_features, generator=gen),
                        "final": torch.randn(n, g.hidden_size, generator=gen)})
    return collate_packed(samples)


def train_step(draft: Eagle3Draft, head: torch.Tensor, batch: dict[str, torch.Tensor], args) -> float:
    """Teacher, TTT forward and backward of one batch as `DraftModule.run_batch` runs them; seconds."""
    device = head.device
    batch = {k: v.to(device) for k, v in batch.items()}
    started = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"):
        needed = teacher_positions(batch["loss_mask"], batch["lengths"], batch["positions"], batch["segment_ends"])
        teacher = teacher_targets(batch["final"], head, draft.draft_ids(), needed=needed)
        out = ttt_forward(draft, batch["aux"], batch["input_ids"], batch["loss_mask"], batch["lengths"], teacher,
                          steps=args.steps, decay=0.8, out_of_vocab="mask", block_size=args.block,
                          logits_budget_bytes=args.logits_gb * 2**30, positions=batch["positions"],
                          segment_ends=batch["segment_ends"])
    out.loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def child(tokens: int, args) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    g = geometry(args.geometry)
    draft = Eagle3Draft(g).to(device)
    head = (torch.randn(g.vocab_size, g.hidden_size) * 0.05).to(device)
    train_step(draft, head, packed_row(g, 256, 128, seed=1), args)  # warm up kernels and the allocator
    draft.zero_grad(set_to_none=False)
    batch = packed_row(g, tokens, args.sample_tokens or tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
    base = rss_mb()
    seconds = train_step(draft, head, batch, args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"tokens": tokens, "samples": int(batch["segment_ids"].max()) + 1, "base_mb": round(base, 1),
              "peak_mb": round(peak, 1), "step_mb": round(peak - base, 1), "seconds": round(seconds, 2),
              "tokens_per_s": round(tokens / seconds, 1), "device": str(device)}
    if device.type == "cuda":
        result["step_alloc_mb"] = round((torch.cuda.max_memory_allocated() - base_alloc) / 2**20, 1)
    return result


def table(results: list[dict]) -> str:
    key = "step_alloc_mb" if "step_alloc_mb" in results[0] else "step_mb"
    lines = [f"| row tokens | samples | step memory, MB ({'peak allocated' if key == 'step_alloc_mb' else 'peak RSS'}"
             " − before) | MB per 1K tokens | marginal MB per 1K tokens | seconds | tokens/s |",
             "|---|---|---|---|---|---|---|"]
    previous = None
    for r in results:
        per_k = r[key] / (r["tokens"] / 1024)
        marginal = ("—" if previous is None else
                    f"{(r[key] - previous[key]) / ((r['tokens'] - previous['tokens']) / 1024):.1f}")
        lines.append(f"| {r['tokens']:,} | {r['samples']} | {r[key]:,.0f} | {per_k:.1f} | {marginal} | "
                     f"{r['seconds']:.1f} | {r['tokens_per_s']:,.0f} |")
        previous = r
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--sample-tokens", type=int, default=None, help="tokens per sample (default: the row)")
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="demo")
    parser.add_argument("--steps", type=int, default=7, help="TTT steps (train.ttt_steps)")
    parser.add_argument("--block", type=int, default=256, help="train.attention_block")
    parser.add_argument("--logits-gb", type=float, default=4.0, help="train.logits_memory_gb")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU when a GPU is present")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    own = ["--geometry", args.geometry, "--steps", str(args.steps), "--block", str(args.block), "--logits-gb",
           str(args.logits_gb), "--precision", args.precision, "--threads", str(args.threads),
           *(["--sample-tokens", str(args.sample_tokens)] if args.sample_tokens else []),
           *(["--cpu"] if args.cpu else [])]
    results = []
    for tokens in args.lengths:
        done = subprocess.run([sys.executable, __file__, *own, "--child", str(tokens)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"length {tokens}: {done.stderr[-2000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    print(f"\ngeometry {args.geometry}, {args.steps} TTT steps, attention block {args.block}, logits budget "
          f"{args.logits_gb} GiB, {args.precision}, {args.threads} threads, samples of "
          f"{args.sample_tokens or 'the row'} tokens\n")
    print(table(results))


if __name__ == "__main__":
    main()
