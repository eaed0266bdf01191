"""Benchmarks of draft training: the train step's tokens/s and utilisation, peak memory vs sequence length.

Usage:
    python scripts/bench_train.py                 # every part, prints markdown tables
    python scripts/bench_train.py --part step --targets demo smollm2 --precisions 32-true bf16-mixed
    python scripts/bench_train.py --part memory --lengths 2048 8192 32768

Step: one optimizer step of `DraftModule` as the train stage runs it (teacher from the target
head, the TTT forward, backward, MuonAdamW), at each target's draft geometry, on a batch shaped
like chat data (right-padded samples of 128-512 tokens, the first quarter of each a prompt out
of the loss), under each precision. It reports tokens/s, the step's FLOPs per token (counted
from the geometry: the matmuls of fc, the decoder layer and attention per TTT step, the draft
head on counted positions only, the teacher head once; backward = 2x forward of what trains),
the achieved GFLOP/s and that as a share of this machine's measured matmul rate at the same
precision. It imports whichever eagle3 is first on sys.path, so `PYTHONPATH=<old checkout>`
measures an older commit's step on the same batches.

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

from eagle3.config.schema import TrainConfig
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
    out = ttt_forward(draft, aux, ids, mask, torch.full((batch,), seq), teacher, steps=steps, decay=0.8,
                      out_of_vocab="mask", block_size=block)
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


#: Draft geometries of the targets measured: hidden, heads, kv heads, intermediate, draft vocab,
#: target vocab, captured layers (demo: the embedded target; smollm2: SmolLM2-135M-Instruct).
TARGETS = {"demo": (256, 4, 4, 704, 2048, 8192, 3), "smollm2": (576, 9, 3, 1536, 32000, 49152, 3)}


def target_geometry(name: str) -> DraftGeometry:
    hidden, heads, kv, inter, draft_vocab, vocab, captures = TARGETS[name]
    return DraftGeometry(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                         head_dim=hidden // heads, intermediate_size=inter, fc_in_features=captures * hidden,
                         vocab_size=vocab, draft_vocab_size=draft_vocab, capture_layers=(2, 4, 5),
                         target_num_layers=8)


def chat_batch(g: DraftGeometry, batch_tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded samples of 128-512 tokens up to `batch_tokens`, the first quarter of each a prompt."""
    gen = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < batch_tokens:
        lengths.append(int(torch.randint(128, 513, (1,), generator=gen)))
    lengths[-1] -= sum(lengths) - batch_tokens
    if lengths[-1] < 16:
        lengths.pop()
    seq, bsz = max(lengths), len(lengths)
    mask = torch.zeros(bsz, seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, n // 4:n] = 1
    return {"aux": torch.randn(bsz, seq, g.fc_in_features, generator=gen),
            "final": torch.randn(bsz, seq, g.hidden_size, generator=gen),
            "input_ids": torch.randint(0, g.vocab_size, (bsz, seq), generator=gen), "loss_mask": mask,
            "lengths": torch.tensor(lengths)}


def step_flops(g: DraftGeometry, batch: dict[str, torch.Tensor], steps: int) -> float:
    """Matmul FLOPs of one training step over `batch` (see the module docstring)."""
    bsz, seq = batch["input_ids"].shape
    positions = bsz * seq  # the decoder layer runs on padded rows too
    counted = float(batch["loss_mask"].sum())
    h, q, kv = g.hidden_size, g.num_attention_heads * g.head_dim, g.num_key_value_heads * g.head_dim
    layer = 2 * (2 * h) * (q + 2 * kv) + 2 * q * h + 3 * 2 * h * g.intermediate_size  # per position
    attention = 2 * 2 * q * (seq / 2)  # scores and values over ~seq/2 causal keys (the extra keys are few)
    head = 2 * h * g.draft_vocab_size
    forward = positions * 2 * g.fc_in_features * h + steps * (positions * (layer + attention) + counted * head)
    teacher = counted * 2 * h * g.vocab_size
    return 3 * forward + teacher


def matmul_gflops(dtype: torch.dtype, m: int = 512, k: int = 576, n: int = 8192, reps: int = 20) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        a @ b
    started = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * m * k * n * reps / (time.perf_counter() - started) / 1e9


def step_rate(target: str, precision: str, batch_tokens: int, steps: int, reps: int) -> dict:
    """Median tokens/s of `reps` optimizer steps (after one warm-up) of the train stage's module."""
    import statistics

    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.optim import MuonAdamW

    torch.manual_seed(0)
    g = target_geometry(target)
    head = torch.randn(g.vocab_size, g.hidden_size) * 0.05
    train = TrainConfig(ttt_steps=steps, ttt_decay=0.8, out_of_vocab="mask", teacher="draft_vocab", loss="kl",
                        state_noise=0.0, attention_block=256, logits_memory_gb=4.0)
    module = DraftModule(g, head, train)
    optimizer = MuonAdamW(list(module.draft.named_parameters()), lr=1e-4)
    batches = [chat_batch(g, batch_tokens, seed) for seed in range(reps + 1)]
    times = []
    for batch in batches:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            out = module.run_batch(batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times[1:])
    tokens = float(batches[0]["lengths"].sum())
    flops = step_flops(g, batches[0], steps)
    peak = matmul_gflops(torch.bfloat16 if precision == "bf16-mixed" else torch.float32, k=g.hidden_size)
    achieved = flops / seconds / 1e9
    return {"target": target, "precision": precision, "tok_s": tokens / seconds,
            "gflop_per_token": flops / tokens / 1e9, "gflops": achieved, "matmul_gflops": peak,
            "utilisation": achieved / peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "step", "throughput", "memory"], default="all")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5)
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
    if args.part in ("all", "step"):
        torch.set_num_threads(max(1, torch.get_num_threads()))
        print(f"| target | precision | tok/s | GFLOP/token | achieved GFLOP/s | matmul GFLOP/s | utilisation |  "
              f"({args.batch_tokens}-token batches, {args.steps} TTT steps, median of {args.reps})")
        for target in args.targets:
            for precision in args.precisions:
                r = step_rate(target, precision, args.batch_tokens, args.steps, args.reps)
                print(f"| {target} | {precision} | {r['tok_s']:,.0f} | {r['gflop_per_token']:.3f} "
                      f"| {r['gflops']:.1f} | {r['matmul_gflops']:.0f} | {100 * r['utilisation']:.0f}% |", flush=True)
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
