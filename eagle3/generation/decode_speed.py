"""Raw decode speed of the `hf` generation backend: ms per step and tokens/s by batch size.

The stage's own throughput (in the generate manifest, `extra.this_run`) mixes decode speed with
how long the conversations are; this isolates the decode loop, so thread and batch settings
can be compared on one machine: `python -m eagle3.generation.decode_speed --threads 1`.
"""

from __future__ import annotations

import argparse
import time

import torch

from eagle3.generation.hf_backend import HFBackend
from eagle3.generation.types import GenerationRequest, SamplingParams
from eagle3.paths import asset_path


def main(argv: list[str] | None = None) -> None:
    """Time one sampled batch per batch size (after a warm-up) and print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(asset_path("demo_target")), help="target path (demo target)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    backend = HFBackend(args.model)
    backend.load()
    for bs in (int(x) for x in args.batch_sizes.split(",")):
        requests = [GenerationRequest(id=str(i),
                                      messages=[{"role": "user", "content": f"What does json.dumps do? ({i})"}])
                    for i in range(bs)]
        backend.generate(requests, SamplingParams(max_new_tokens=4, temperature=0.6, top_p=0.95))  # warm-up
        start = time.perf_counter()
        results = backend.generate(requests, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.6,
                                                            top_p=0.95, seed=1))
        seconds = time.perf_counter() - start
        steps = max(r.completion_tokens for r in results)
        tokens = sum(r.completion_tokens for r in results)
        print(f"threads={torch.get_num_threads()} batch={bs}: {steps} steps in {seconds:.2f} s = "
              f"{1000 * seconds / steps:.1f} ms/step, {tokens / seconds:.0f} generated tok/s", flush=True)


if __name__ == "__main__":
    main()
