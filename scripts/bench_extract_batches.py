"""In-process extraction throughput against the padded-token budget of a batch (`extract.batch_tokens`).

    python scripts/bench_extract_batches.py --target .cache/targets/gemma-3-270m --dtype bfloat16
    python scripts/bench_extract_batches.py --target eagle3/assets/demo_target --dtype float32 --budgets 8192 2048

The extract stage's own path (hooks on three capture layers and the final norm, batches planned
longest first within the budget) over the same random samples at each budget, chat-answer lengths
(40-200 tokens); prints tokens/s per budget. Run alone: two torch jobs on the cores slow each other.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.extract.capture import LayerCapture, capture_samples, plan_batches  # noqa: E402
from eagle3.target.decoder import load_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a checkpoint directory")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--budgets", type=int, nargs="+", default=[8192, 2048, 512, 128])
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    parts = load_target(args.target, dtype=args.dtype, trust_remote_code=False)
    vocab = next(m for m in parts.base.modules() if isinstance(m, nn.Embedding)).num_embeddings
    rng = np.random.default_rng(0)
    lengths = sorted(rng.integers(40, 200, size=args.samples).tolist(), reverse=True)
    samples = [rng.integers(0, vocab, size=n) for n in lengths]
    with LayerCapture(parts, [1, 2, len(parts.layers) - 2]) as capture:
        capture_samples(capture, samples[:2])  # warm-up
        for budget in args.budgets:
            started = time.perf_counter()
            for batch in plan_batches(lengths, budget):
                capture_samples(capture, [samples[i] for i in batch])
            seconds = time.perf_counter() - started
            print(f"{args.target} {args.dtype} batch_tokens {budget}: {sum(lengths) / seconds:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
