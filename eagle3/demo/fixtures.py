"""Write the small committed demo fixtures and measure demo_native generation speed.

The fixtures let tests (and the data stages' tests) read realistic records without loading the
target. ``demo_prompts_small.jsonl`` is checked against the generator in the tests, so it must
be rewritten whenever the generator changes; ``demo_native_small.jsonl`` is only schema-checked
because regenerating it takes tens of seconds.

Usage:
    python -m eagle3.demo.fixtures                 # rewrite tests/fixtures/demo_*_small.jsonl
    python -m eagle3.demo.fixtures --bench 64      # also time 64 demo_native records
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eagle3.demo import datasets as ds

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def _write(path: Path, records) -> int:
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=FIXTURES)
    parser.add_argument("--num", type=int, default=30)
    parser.add_argument("--bench", type=int, default=0, help="time this many demo_native records")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    n = _write(args.out / "demo_prompts_small.jsonl", ds.demo_prompts_records(args.num, seed=0))
    print(f"wrote {n} demo_prompts records")
    ds.load_target(str(ds.corpus.DEMO_TARGET_PATH))  # keep model loading out of the timing
    t0 = time.time()
    n = _write(args.out / "demo_native_small.jsonl", ds.demo_native_records(args.num, seed=0))
    print(f"wrote {n} demo_native records in {time.time() - t0:.1f}s")
    if args.bench:
        t0 = time.time()
        recs = list(ds.demo_native_records(args.bench, seed=1))
        dt = time.time() - t0
        turns = sum(m["role"] == "assistant" for r in recs for m in r["messages"])
        print(f"demo_native: {len(recs)} records ({turns} assistant turns) in {dt:.1f}s = "
              f"{len(recs) / dt:.2f} records/s (batch_size=8, max_new_tokens=256, "
              f"temperature=0.7, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
