"""Benchmarks of draft training: the train step's tokens/s and utilisation, peak memory vs sequence length.

Usage:
    python scripts/bench_train.py                 # every part, prints markdown tables
    python scripts/bench_train.py --part step --targets demo smollm2 --precisions 32-true bf16-mixed
    python scripts/bench_train.py --part memory --lengths 2048 8192 32768
    python scripts/bench_train.py --device cuda --part step --targets kimi_llama kimi_mla \
        --precisions bf16-mixed --batch-tokens 8192          # Kimi-K2.5's draft geometries on a GPU
    python scripts/bench_train.py --device cuda --part memory --targets kimi_mla --lengths 4096 16384 32768
    python scripts/bench_train.py --part saved --targets kimi_llama kimi_mla --lengths 64 192 --target-vocab 32000
    python scripts/bench_train.py --part teacher --teacher-shapes gemma3_270m smollm2   # screened vs float32 head
    python scripts/bench_train.py --part teacher --teacher-chain /tmp/sbs_gemma/chain \
        --teacher-target .cache/targets/gemma-3-270m                                    # on a chain's own states

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
the blockwise TTT attention the growth must be linear in the length (no L x L tensor). On
`--device cuda` the step runs in this process at each `--targets` geometry (bf16-mixed, the
whole train step: teacher, TTT, backward, optimizer) and the figure is CUDA's peak allocation
minus what the draft, its optimizer state and the target head held before the step.

Teacher: the teacher's lm_head product (`teacher_targets`) on 1,024 positions at a target's vocab,
float32 over the whole vocab against the bf16-screened head (`eagle3.draft.teacher_head`), in turn
(A B A B, 5 each), with the share of rows the screen left to float32 and whether the teacher agreed.
Random states and heads at real head shapes leave more rows undecided than a model's own (a trained
head's top logit stands out); `--teacher-chain` measures on a chain's stored states and real head.

Targets: `demo`/`smollm2` are fixed tuples below; `kimi_llama`, `kimi_mla`, `demo_kimi_llama`
and `demo_kimi_mla` are composed from conf/ (`model=kimi_k25` / `model=demo_kimi`, with
`model.draft.attention=mla` for the `_mla` ones), so they measure the geometry stage train builds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterable

import torch

from eagle3.config.schema import TrainConfig
from eagle3.draft.geometry import DraftGeometry, config_geometry
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.shapes import draft_cost
from eagle3.draft.teacher import teacher_targets
from eagle3.draft.ttt import ttt_forward


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
#: Geometries composed from conf/ with these overrides (what stage train would build).
CONFIG_TARGETS = {"kimi_llama": ["model=kimi_k25"], "kimi_mla": ["model=kimi_k25", "model.draft.attention=mla"],
                  "demo_kimi_llama": ["model=demo_kimi"],
                  "demo_kimi_mla": ["model=demo_kimi", "model.draft.attention=mla"]}


#: Teacher part: (target vocab, hidden, draft vocab) of real targets' heads.
TEACHER_SHAPES = {"smollm2": (49152, 576, 32000), "gemma3_270m": (262144, 640, 32000),
                  "qwen2.5_0.5b": (151936, 896, 32000), "kimi_k25": (163840, 7168, 32000)}


def synthetic_teacher(shape: str, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final `[1, rows, H]` bf16, head `[V, H]`, draft ids) at a real target's head shape, random values."""
    vocab, hidden, draft_vocab = TEACHER_SHAPES[shape]
    gen = torch.Generator().manual_seed(0)
    head = torch.randn(vocab, hidden, generator=gen) / hidden ** 0.5
    draft_ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    final = (torch.randn(1, rows, hidden, generator=gen) * 4).bfloat16()  # logits of a few units, as a chat model's
    return final, head, draft_ids


def chain_teacher(chain: str, target: str, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same from a chain: its stored final states (the first `rows` positions), the target's head, its d2t."""
    from pathlib import Path

    from eagle3.states.store import HiddenStateStore
    from eagle3.target.weights import load_embedding_and_head

    root = Path(chain)
    stores, maps = sorted((root / "hidden_states").iterdir()), sorted(root.glob("vocab/*/t2d.pt"))
    if len(stores) != 1 or len(maps) != 1:
        raise SystemExit(f"--teacher-chain {chain}: expected one store under hidden_states/ and one vocab/*/t2d.pt, "
                         f"found {len(stores)} and {len(maps)}")
    store = HiddenStateStore(stores[0])
    finals, have = [], 0
    for key in sorted(store.entries):
        finals.append(store.load(key)[1])
        have += len(finals[-1])
        if have >= rows:
            break
    draft_ids = torch.load(maps[0], weights_only=True).nonzero().squeeze(1)
    return torch.cat(finals)[:rows].unsqueeze(0), load_embedding_and_head(target)[1], draft_ids


def teacher_rates(final: torch.Tensor, head: torch.Tensor, draft_ids: torch.Tensor, reps: int,
                  device: str = "cpu") -> dict:
    """Median seconds of the float32 and the screened teacher on `final` `[1, n, H]`, and what the screen decided."""
    from eagle3.draft.teacher_head import TeacherHead

    final, head, draft_ids = final.to(device), head.to(device), draft_ids.to(device)
    heads = {"float32": TeacherHead.build(head, draft_ids, screen=False),
             "screened": TeacherHead.build(head, draft_ids, screen=True)}
    times: dict[str, list[float]] = {name: [] for name in heads}
    out = {}
    for _ in range(reps):
        for name, split in heads.items():
            sync(device)
            started = time.perf_counter()
            out[name] = teacher_targets(final, split, draft_ids)
            sync(device)
            times[name].append(time.perf_counter() - started)
    screened, states = heads["screened"], final[0]
    undecided, _ = screened.screen(states, (states.float() @ screened.in_vocab.T).max(-1).values)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()} | {
        "undecided": float(undecided.float().mean()),
        "same": bool(torch.equal(out["float32"].argmax, out["screened"].argmax))
        and bool(torch.allclose(out["float32"].probs, out["screened"].probs, rtol=1e-5, atol=1e-7))}


def target_geometry(name: str) -> DraftGeometry:
    if name in CONFIG_TARGETS:
        from hydra import compose, initialize_config_dir

        import eagle3.config  # noqa: F401  (registers the schema and resolvers)
        from eagle3.config.convert import to_settings
        from eagle3.paths import CONF_DIR

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return config_geometry(to_settings(compose(config_name="config", overrides=CONFIG_TARGETS[name])).model)
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


def one_sample(g: DraftGeometry, seq: int) -> dict[str, torch.Tensor]:
    """One `seq`-token sample, its first quarter a prompt (out of the loss)."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[:, : seq // 4] = 0
    return {"aux": torch.randn(1, seq, g.fc_in_features, generator=gen),
            "final": torch.randn(1, seq, g.hidden_size, generator=gen),
            "input_ids": torch.randint(0, g.vocab_size, (1, seq), generator=gen), "loss_mask": mask,
            "lengths": torch.tensor([seq])}


def step_flops(g: DraftGeometry, batch: dict[str, torch.Tensor], steps: int) -> float:
    """Matmul FLOPs of one training step over `batch` (see the module docstring)."""
    bsz, seq = batch["input_ids"].shape
    positions = bsz * seq  # the decoder layer runs on padded rows too
    counted = float(batch["loss_mask"].sum())
    cost = draft_cost(g)  # llama or MLA, from the same shapes the export checks
    head = 2 * g.hidden_size * g.draft_vocab_size
    layer = cost["step_flops"] - head  # per position: every layer's weights
    # scores and values over ~seq/2 causal keys (the extra TTT keys are few)
    attention = cost["attention_flops_per_context_token"] * (seq / 2)
    forward = positions * cost["fc_flops"] + steps * (positions * (layer + attention) + counted * head)
    teacher = counted * 2 * g.hidden_size * g.vocab_size
    return 3 * forward + teacher


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_gflops(dtype: torch.dtype, m: int = 512, k: int = 576, n: int = 8192, reps: int = 20,
                  device: str = "cpu") -> float:
    if device == "cuda":  # a GPU needs big products to reach its rate
        m, n, reps = 8192, 8192, 50
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    sync(device)
    started = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * m * k * n * reps / (time.perf_counter() - started) / 1e9


def train_parts(g: DraftGeometry, steps: int, device: str):
    """The train stage's module (random weights, a random target head) and its optimizer on `device`."""
    from eagle3.draft.lightning_module import DraftModule
    from eagle3.draft.optim import MuonAdamW

    torch.manual_seed(0)
    head = torch.randn(g.vocab_size, g.hidden_size, device=device) * 0.05
    train = TrainConfig(ttt_steps=steps, ttt_decay=0.8, out_of_vocab="mask", teacher="draft_vocab", loss="kl",
                        state_noise=0.0, attention_block=256, logits_memory_gb=4.0)
    module = DraftModule(g, head, train).to(device)
    optimizer = MuonAdamW(list(module.draft.named_parameters()), lr=1e-4)
    return module, optimizer


def optimizer_step(module, optimizer, batch: dict[str, torch.Tensor], precision: str, device: str) -> None:
    with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        out = module.run_batch(batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_rate(target: str, precision: str, batch_tokens: int, steps: int, reps: int, device: str = "cpu") -> dict:
    """Median tokens/s of `reps` optimizer steps (after one warm-up) of the train stage's module."""
    import statistics

    g = target_geometry(target)
    module, optimizer = train_parts(g, steps, device)
    batches = [{k: v.to(device) for k, v in chat_batch(g, batch_tokens, seed).items()} for seed in range(reps + 1)]
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for batch in batches:
        sync(device)
        started = time.perf_counter()
        optimizer_step(module, optimizer, batch, precision, device)
        sync(device)
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times[1:])
    tokens = float(batches[0]["lengths"].sum())
    flops = step_flops(g, batches[0], steps)
    peak = matmul_gflops(torch.bfloat16 if precision == "bf16-mixed" else torch.float32, k=g.hidden_size,
                         device=device)
    achieved = flops / seconds / 1e9
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    del module, optimizer, batches
    return {"target": target, "precision": precision, "tok_s": tokens / seconds,
            "gflop_per_token": flops / tokens / 1e9, "gflops": achieved, "matmul_gflops": peak,
            "utilisation": achieved / peak, "params": draft_cost(g)["trainable_parameters"], "peak_gib": peak_gib}


def cuda_step_memory(target: str, lengths: list[int], steps: int) -> list[dict]:
    """CUDA memory of one bf16-mixed train step on one sample of each length, above what was resident."""
    g = target_geometry(target)
    module, optimizer = train_parts(g, steps, "cuda")
    optimizer_step(module, optimizer, {k: v.cuda() for k, v in chat_batch(g, 512, 0).items()}, "bf16-mixed",
                   "cuda")  # the optimizer state now exists, as it does in every step after the first
    rows = []
    for seq in lengths:
        batch = {k: v.cuda() for k, v in one_sample(g, seq).items()}
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            optimizer_step(module, optimizer, batch, "bf16-mixed", "cuda")
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            rows.append({"target": target, "seq": seq, "resident_gib": base / 2**30, "oom": True,
                         "step_gib": (torch.cuda.max_memory_allocated() - base) / 2**30, "seconds": float("nan")})
            break  # longer samples need more
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated()
        rows.append({"target": target, "seq": seq, "resident_gib": base / 2**30, "step_gib": (peak - base) / 2**30,
                     "seconds": seconds, "oom": False})
        del batch
    del module, optimizer
    torch.cuda.empty_cache()
    return rows


def saved_bytes(target: str, seq: int, steps: int, target_vocab: int | None) -> int:
    """Bytes autograd keeps for backward in one bf16-mixed CPU train step on a `seq`-token sample.

    Counted with saved-tensor hooks, each storage once, weights left out (they are resident anyway);
    checkpointed regions keep only their inputs, as in training. `target_vocab` shrinks the target
    vocabulary (embedding, teacher head), which no activation depends on, so Kimi's geometry fits a CPU.
    """
    import dataclasses

    g = target_geometry(target)
    if target_vocab:
        g = dataclasses.replace(g, vocab_size=target_vocab)
    module, _ = train_parts(g, steps, "cpu")
    weights = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    kept: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        out = module.run_batch(one_sample(g, seq))
    del out
    return sum(kept.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "step", "throughput", "memory", "saved", "teacher"], default="all")
    parser.add_argument("--teacher-shapes", nargs="+", default=["smollm2", "gemma3_270m"], choices=list(TEACHER_SHAPES))
    parser.add_argument("--teacher-rows", type=int, default=1024)
    parser.add_argument("--teacher-chain", help="teacher part: a chain's paths.root (its stored states and d2t) ...")
    parser.add_argument("--teacher-target", help="... and its target's checkpoint directory (the head)")
    parser.add_argument("--target-vocab", type=int, help="saved part: shrink the target vocabulary (Kimi on a CPU)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=[*TARGETS, *CONFIG_TARGETS])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
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
    if args.part == "teacher":  # not in "all": the float32 side takes seconds per rep at a 262K vocab
        print(f"| target head (V, H, Vd) | float32, s | screened, s | ratio | left to float32 | same teacher |  "
              f"({args.teacher_rows} positions, median of {args.reps}, A B A B)")
        cases: Iterable[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]
        if args.teacher_chain:
            cases = [(f"{args.teacher_target}, {args.teacher_chain}'s states",
                      chain_teacher(args.teacher_chain, args.teacher_target, args.teacher_rows))]
        else:  # a generator: one random head in memory at a time
            cases = ((f"{shape}, random", synthetic_teacher(shape, args.teacher_rows)) for shape in args.teacher_shapes)
        for label, (final, head, draft_ids) in cases:
            r = teacher_rates(final, head, draft_ids, args.reps, args.device)
            print(f"| {label} (V {head.shape[0]:,}, H {head.shape[1]}, Vd {len(draft_ids):,}) | {r['float32']:.3f} "
                  f"| {r['screened']:.3f} | {r['float32'] / r['screened']:.2f}x | {100 * r['undecided']:.1f}% "
                  f"| {r['same']} |", flush=True)
        return
    if args.part == "saved":  # not in "all": at Kimi geometry it takes minutes on a CPU
        short, long = sorted(args.lengths)[0], sorted(args.lengths)[-1]
        print(f"| target | kept for backward at {short} / {long} tokens, MiB | per token, MiB |  (bf16-mixed on "
              f"the CPU, {args.steps} TTT steps, weights excluded)")
        for target in args.targets:
            a, b = (saved_bytes(target, n, args.steps, args.target_vocab) for n in (short, long))
            print(f"| {target} | {a / 2**20:,.0f} / {b / 2**20:,.0f} | {(b - a) / (long - short) / 2**20:.2f} |",
                  flush=True)
        return
    if args.part in ("all", "step"):
        torch.set_num_threads(max(1, torch.get_num_threads()))
        where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        print(f"| target | trainable params | precision | tok/s | GFLOP/token | achieved GFLOP/s | matmul GFLOP/s "
              f"| utilisation | peak GiB |  ({args.batch_tokens}-token batches, {args.steps} TTT steps, median of "
              f"{args.reps}, {where})")
        for target in args.targets:
            for precision in args.precisions:
                try:
                    r = step_rate(target, precision, args.batch_tokens, args.steps, args.reps, args.device)
                except torch.OutOfMemoryError:
                    print(f"| {target} | | {precision} | out of memory at {args.batch_tokens} tokens | | | | | |",
                          flush=True)
                    torch.cuda.empty_cache()
                    continue
                print(f"| {target} | {r['params'] / 1e9:.3f} B | {precision} | {r['tok_s']:,.0f} "
                      f"| {r['gflop_per_token']:.3f} | {r['gflops']:,.1f} | {r['matmul_gflops']:,.0f} "
                      f"| {100 * r['utilisation']:.0f}% | {r['peak_gib']:.2f} |", flush=True)
    if args.part in ("all", "memory") and args.device == "cuda":
        print(f"| target | seq len | resident GiB | step GiB (peak - resident) | per 1K tokens, GiB | seconds |  "
              f"(bf16-mixed, {args.steps} TTT steps, {torch.cuda.get_device_name()})")
        for target in args.targets:
            for m in cuda_step_memory(target, args.lengths, args.steps):
                if m["oom"]:
                    print(f"| {target} | {m['seq']} | {m['resident_gib']:.2f} | out of memory after "
                          f"{m['step_gib']:.2f} | | |", flush=True)
                    continue
                print(f"| {target} | {m['seq']} | {m['resident_gib']:.2f} | {m['step_gib']:.2f} "
                      f"| {1024 * m['step_gib'] / m['seq']:.3f} | {m['seconds']:.2f} |", flush=True)
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
