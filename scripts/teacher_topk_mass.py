"""How much of the target's next-token distribution a top-k teacher leaves out, where the loss reads it.

The compact store keeps the teacher as its top `COMPACT_TOPK` log-probabilities; this prints, for a
target and a merged split, the probability mass beyond the top k at the positions training reads
(position t teaches token t+1, read where `loss_mask[t+1]` is set), for several k.

    python scripts/teacher_topk_mass.py eagle3/assets/demo_target <root>/merge/<unit>/train.jsonl
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a transformers checkpoint directory")
    parser.add_argument("split", help="a merged train.jsonl / eval.jsonl")
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--ks", default="32,64,128,256,512")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    ks = [int(k) for k in args.ks.split(",")]
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    with open(args.split) as fh:
        rows = [json.loads(line) for line, _ in zip(fh, range(args.samples), strict=False)]
    tails: dict[int, list[torch.Tensor]] = {k: [] for k in ks}
    for row in rows:
        mask = torch.tensor(row["loss_mask"]).bool()
        read = torch.zeros_like(mask)
        read[:-1] = mask[1:]  # [T] positions whose teacher row the loss reads
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([row["input_ids"]])).logits[0].float(), dim=-1)[read]  # [N, V]
        for k in ks:
            tails[k].append(1 - probs.topk(min(k, probs.shape[-1]), dim=-1).values.sum(-1))
    for k in ks:
        tail = torch.cat(tails[k])
        print(f"top {k}: mass left out at {len(tail):,} loss positions: mean {tail.mean():.4f}, "
              f"p99 {tail.quantile(0.99):.4f}, max {tail.max():.4f}")


if __name__ == "__main__":
    main()
