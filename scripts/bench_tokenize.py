#!/usr/bin/env python
"""Throughput and peak memory of the tokenize stage on demo conversations.

Each size runs in a fresh child process, so its peak RSS (the child's own and that of its pool
workers, from ``getrusage``) is its own. The conversations are written first as a prep-like
output; only ``tokenize_unit`` is timed, start-up included (importing transformers and loading the
tokenizer: in each pool worker, or in this process with one worker). The marginal rate between
two sizes separates that fixed cost from the per-sample work.

Usage:
    python scripts/bench_tokenize.py                       # 1K and 10K, all cores
    python scripts/bench_tokenize.py --sizes 1000 10000 --workers 2 --tokenizer eagle3/assets/demo_target
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle3.paths import asset_path


def one(n: int, workers: int, chunk: int, tokenizer: str, max_len: int) -> dict:
    """Tokenize ``n`` demo conversations once; returns the figures."""
    from eagle3.artifacts import StageOutput
    from eagle3.data.render import RenderSettings
    from eagle3.data.tokenize_run import TokenizerSpec, tokenize_unit
    from eagle3.demo import conversations as demo_convs
    from eagle3.stages.prep import CONVERSATIONS_FILE
    from eagle3.stages.tokenize import TOKENIZED_FILE

    root = Path(tempfile.mkdtemp(prefix="bench_tokenize_"))
    up = StageOutput.open(root, "prep", "bench", {"n": n})
    writer = up.records(CONVERSATIONS_FILE)
    for i, plan in enumerate(demo_convs.training_plans(n, seed=0)):
        up.count_in()
        writer.write({"id": f"b{i}", "source": "bench", **demo_convs.kimi_conversation(plan)})
    upstream = up.finalize()
    up.close()

    settings = RenderSettings(template=asset_path("chat_templates/kimi_k25_training.jinja").read_text(),
                              thinking=True, max_len=max_len, overlength="truncate", answer_ids="emitted")
    out = StageOutput.open(root, "tokenize", "bench", {"n": n}, inputs={"c": upstream})
    start = time.perf_counter()
    extra = tokenize_unit(out, upstream.directory / CONVERSATIONS_FILE, upstream.counts["out"], "bench", settings,
                          TokenizerSpec(tokenizer), workers, chunk, TOKENIZED_FILE)
    wall = time.perf_counter() - start
    manifest = out.finalize(extra=extra)
    out.close()
    shutil.rmtree(root)
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"n": n, "workers": extra["workers"], "chunk": chunk, "wall_s": round(wall, 2),
            "samples_per_s": round(manifest.counts["out"] / wall, 1),
            "tokens_per_s": round(manifest.counts["tokens"] / wall),
            "tokens": manifest.counts["tokens"], "out": manifest.counts["out"],
            "peak_rss_main_mb": round(self_kb / 1024), "peak_rss_worker_mb": round(child_kb / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--workers", type=int, default=0, help="0 = one per core")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--tokenizer", default=str(asset_path("demo_target")))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.workers, args.chunk, args.tokenizer, args.max_len)))
        return
    print(f"# {platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    rows = []
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--workers", str(args.workers), "--chunk",
               str(args.chunk), "--max-len", str(args.max_len), "--tokenizer", args.tokenizer]
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        per = (last["wall_s"] - first["wall_s"]) / (last["n"] - first["n"])
        for row in rows[1:-1]:  # linearity check: middle sizes against the line through the ends
            print(f"# {row['n']}: {row['wall_s']} s measured, "
                  f"{first['wall_s'] + per * (row['n'] - first['n']):.1f} s on the line through the ends")
        rate = (last["n"] - first["n"]) / (last["wall_s"] - first["wall_s"])
        print(f"# time ratio {last['n']}/{first['n']}: {last['wall_s'] / first['wall_s']:.2f} "
              f"(linear = {last['n'] / first['n']:.0f}); marginal rate {rate:.0f} samples/s, fixed cost "
              f"{first['wall_s'] - first['n'] / rate:.1f} s (pool start-up); "
              f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
