"""Checks that a chain's training ids are the ids its target emitted (shared by the engine tests)."""

from __future__ import annotations

from pathlib import Path

from eagle3.artifacts import read_jsonl


def answer_runs(record: dict) -> list[list[int]]:
    """The loss-masked runs of a tokenized record, one per answer, as token ids."""
    runs, run = [], []
    for token, flag in zip(record["input_ids"], record["loss_mask"], strict=True):
        if flag:
            run.append(token)
        elif run:
            runs, run = runs + [run], []
    return runs + ([run] if run else [])


def assert_trained_on_emitted_ids(generated: Path, tokenized: Path) -> int:
    """Every regenerated record that tokenize kept whole trains, answer by answer, on the ids its
    `generate` unit says the target emitted; returns how many records were compared."""
    emitted = {r["id"]: [t["token_ids"] for t in r["meta"]["generation"]["turns"]]
               for r in read_jsonl(generated / "conversations.jsonl")}
    compared = 0
    for record in read_jsonl(tokenized / "tokenized_data.jsonl"):
        if record["truncated_max_len"]:
            continue
        assert answer_runs(record) == emitted[record["id"]], record["id"]
        assert record["emitted_unmatched_trained"] == 0
        compared += 1
    assert compared > 0
    return compared
