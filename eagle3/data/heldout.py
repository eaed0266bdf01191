"""Held-out prompts: what the eval stage and the serving benchmark both decode.

The prompt of an eval-split sample is its tokens up to its first target token (the first
assistant turn's generation prompt), so the draft is judged on exactly the turns it will draft
in serving, and the in-process eval and the engine benchmark decode the same prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.artifacts import read_jsonl


def heldout_prompts(eval_split: Path, limit: int) -> list[dict[str, Any]]:
    """`{"id", "input_ids"}` of the first assistant turn of up to `limit` samples of a merged eval split."""
    prompts: list[dict[str, Any]] = []
    for record in read_jsonl(eval_split):
        if len(prompts) >= limit:
            break
        mask = record["loss_mask"]
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is None or first == 0:
            continue
        prompts.append({"id": record["id"], "input_ids": record["input_ids"][:first]})
    return prompts
