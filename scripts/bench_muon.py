"""Time one Muon step on a target's draft matrices: the Gram-space Newton-Schulz against the direct one.

    python scripts/bench_muon.py --config .cache/targets/Qwen2.5-Coder-1.5B-Instruct/config.json
    python scripts/bench_muon.py --config eagle3/assets/demo_target/config.json --reps 20

The draft decoder layer's matrices follow the target's geometry (q/k/v read the 2H-wide input of an
EAGLE-3 layer, fc fuses the 3 captured layers); `lm_head` stays on AdamW, so it is not timed. The two
forms alternate (A B A B) and the median per-step ratio is printed, as BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.draft import optim  # noqa: E402


def draft_matrix_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """`[out, in]` of each Muon matrix of a one-layer EAGLE-3 draft of this target."""
    text = config.get("text_config", config)
    hidden, inter = text["hidden_size"], text["intermediate_size"]
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads", heads)
    head_dim = text.get("head_dim") or hidden // heads
    return {"q_proj": (heads * head_dim, 2 * hidden), "k_proj": (kv_heads * head_dim, 2 * hidden),
            "v_proj": (kv_heads * head_dim, 2 * hidden), "o_proj": (hidden, heads * head_dim),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
            "fc": (hidden, 3 * hidden)}


def step_seconds(shapes: dict[str, tuple[int, int]], gram: bool, ns_dtype: str) -> float:
    generator = torch.Generator().manual_seed(0)
    params = [(name, torch.nn.Parameter(torch.randn(*shape, generator=generator) * 0.02))
              for name, shape in shapes.items()]
    for _, param in params:
        param.grad = torch.randn(param.shape, generator=generator)
    saved = optim.GRAM_MIN_ASPECT
    optim.GRAM_MIN_ASPECT = saved if gram else float("inf")
    try:
        opt = optim.MuonAdamW(params, lr=1e-3, ns_dtype=ns_dtype)
        opt.step()  # warm-up: momentum buffers, kernels
        started = time.perf_counter()
        opt.step()
        return time.perf_counter() - started
    finally:
        optim.GRAM_MIN_ASPECT = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the target's config.json")
    parser.add_argument("--reps", type=int, default=5, help="A B pairs")
    parser.add_argument("--ns-dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    args = parser.parse_args()
    shapes = draft_matrix_shapes(json.loads(Path(args.config).read_text()))
    gram_s, direct_s = [], []
    for _ in range(args.reps):
        gram_s.append(step_seconds(shapes, True, args.ns_dtype))
        direct_s.append(step_seconds(shapes, False, args.ns_dtype))
    ratio = statistics.median(d / g for g, d in zip(gram_s, direct_s, strict=True))
    print(f"{args.config}: Muon step {statistics.median(gram_s):.3f} s (Gram space) vs "
          f"{statistics.median(direct_s):.3f} s (direct), {ratio:.2f}x faster; threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
