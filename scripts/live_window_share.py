"""How much decoder-layer work the TTT live window saves on a chain's tokenized data.

    python scripts/live_window_share.py outputs/tokenize/*/tokenized_data.jsonl --batch-tokens 512 --steps 7

Batches are planned as training plans them (`eagle3.draft.batching.plan_token_batches`, padded rows of
similar length); per batch, step 0 runs on B x T columns and each later step on B x W
(`eagle3.draft.window.LiveWindow`), against B x T for every step without the window. Prints the share
of the decoder layer's column-steps that remain and the prompt's share of the tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.draft.batching import plan_token_batches  # noqa: E402
from eagle3.draft.window import LiveWindow  # noqa: E402


def column_steps(masks: list[list[int]], batch_tokens: int, steps: int) -> tuple[int, int]:
    """(columns x steps without the window, with it) over all batches of one epoch."""
    lengths = [len(m) for m in masks]
    full = windowed = 0
    for batch in plan_token_batches(lengths, batch_tokens):
        seq = max(lengths[i] for i in batch)
        loss_mask = torch.zeros(len(batch), seq, dtype=torch.long)
        for row, index in enumerate(batch):
            loss_mask[row, :lengths[index]] = torch.tensor(masks[index])
        window = LiveWindow.of(loss_mask, torch.tensor([lengths[i] for i in batch]), steps)
        width = window.width if window is not None else seq
        full += len(batch) * seq * steps
        windowed += len(batch) * (seq + width * (steps - 1))
    return full, windowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a tokenize stage's tokenized_data.jsonl")
    parser.add_argument("--batch-tokens", type=int, default=512, help="train.batch_tokens")
    parser.add_argument("--steps", type=int, default=7, help="train.ttt_steps")
    args = parser.parse_args()
    with args.data.open() as handle:
        masks = [json.loads(line)["loss_mask"] for line in handle if line.strip()]
    tokens = sum(len(m) for m in masks)
    in_loss = sum(sum(m) for m in masks)
    full, windowed = column_steps(masks, args.batch_tokens, args.steps)
    print(f"{args.data}: {len(masks)} samples, {tokens} tokens, {1 - in_loss / tokens:.1%} outside the loss; "
          f"decoder column-steps with the live window {windowed / full:.1%} of the full unroll's "
          f"(batch_tokens {args.batch_tokens}, {args.steps} steps)")


if __name__ == "__main__":
    main()
