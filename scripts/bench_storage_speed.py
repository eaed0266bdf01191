"""Benchmark extraction and the loader (the numbers in BENCHMARKS.md).

Usage:
    python scripts/bench_storage_speed.py --demo-samples 200            # demo conversations, demo target
    python scripts/bench_storage_speed.py --merged DIR [overrides ...]  # a merge unit directory

For each storage format it extracts into a fresh store in a temporary directory (nothing is
reused, so the timing is real and the user's outputs are untouched), reads the train split back
through `HiddenStateDataset`, and prints tokens/s, bytes per token, store size and the measured
error; then the throughput of a stand-in for the trainer's per-token work, to compare with.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

import eagle3.config  # noqa: E402,F401  (registers the schema and resolvers)
from eagle3.artifacts import StageOutput, format_bytes  # noqa: E402
from eagle3.config.convert import to_settings  # noqa: E402
from eagle3.extract.runner import UnitJob, run_extraction  # noqa: E402
from eagle3.extract.sources import HFStates  # noqa: E402
from eagle3.paths import CONF_DIR  # noqa: E402
from eagle3.states.dataset import HiddenStateDataset  # noqa: E402
from eagle3.states.store import HiddenStateStore, StoreSpec  # noqa: E402
from eagle3.target.decoder import check_geometry, load_target  # noqa: E402
from eagle3.target_info import target_identity  # noqa: E402


def demo_records(n: int, tokenizer_dir: str) -> list[dict]:
    """Held-out demo conversations rendered as the demo target was trained (mask: all ones)."""
    from transformers import AutoTokenizer

    from eagle3.demo.conversations import kimi_conversation, training_plans
    from eagle3.demo.target_training import training_text

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    records = []
    for i, plan in enumerate(training_plans(n, seed=7, split="held_out")):
        ids = tok(training_text(tok, kimi_conversation(plan)), add_special_tokens=False)["input_ids"]
        records.append({"id": f"demo{i}", "input_ids": ids, "loss_mask": [1] * len(ids), "seq_len": len(ids)})
    return records


def write_split_files(directory: Path, records: list[dict], n_eval: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("eval.jsonl", records[:n_eval]), ("train.jsonl", records[n_eval:])):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def trainer_proxy_rate(hidden: int, n_capture: int, target_vocab: int, draft_vocab: int,
                       steps: int = 7, seq: int = 512) -> float:
    """Tokens/s of a stand-in for one EAGLE-3 training step (the trainer is not written yet).

    fc over the captured states, `steps` passes of one Llama decoder layer (the TTT unroll),
    draft head and the teacher logits from the final state, forward and backward: the work the
    trainer does per token, on the same cores, to compare the loader against.
    """
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer,
        LlamaRotaryEmbedding,
    )

    heads = max(hidden // 64, 1)
    # attn_implementation is one of the extra kwargs transformers' config dataclass takes but does not declare.
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=heads,  # type: ignore[call-arg]
                         num_key_value_heads=heads, max_position_embeddings=seq, attn_implementation="sdpa")
    fc, layer = torch.nn.Linear(n_capture * hidden, hidden), LlamaDecoderLayer(config, 0)
    rope = LlamaRotaryEmbedding(config)
    head, teacher = torch.nn.Linear(hidden, draft_vocab), torch.nn.Linear(hidden, target_vocab)
    aux, final = torch.randn(1, seq, n_capture * hidden), torch.randn(1, seq, hidden)  # [1, T, C*H], [1, T, H]
    pos = torch.arange(seq)[None]
    rotary = rope(final, pos)
    params = [*fc.parameters(), *layer.parameters(), *head.parameters()]
    start, runs = time.perf_counter(), 3
    for _ in range(runs):
        with torch.no_grad():
            target = teacher(final).softmax(-1)[..., :draft_vocab]  # [1, T, draft_vocab]
        h = fc(aux)
        loss: Any = 0.0  # a tensor once a step has run
        for _ in range(steps):
            h = layer(h, position_embeddings=rotary, position_ids=pos)
            loss = loss - (target * head(h).log_softmax(-1)).sum()
        torch.autograd.grad(loss, params)
    return runs * seq / (time.perf_counter() - start)


def loader_rate(store_dir: Path, split_file: Path, passes: int = 2) -> float:
    """Tokens/s of reading every sample (aux + final + ids + mask, as float32) from the store."""
    data = HiddenStateDataset(store_dir, split_file, dtype=torch.float32)
    tokens, start = 0, time.perf_counter()
    for _ in range(passes):
        for i in range(len(data)):
            tokens += int(data[i]["input_ids"].numel())
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="hydra overrides for the model (default model=demo)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--merged", type=Path, help="a merge unit directory (train.jsonl, eval.jsonl)")
    source.add_argument("--demo-samples", type=int, help="render this many demo conversations")
    parser.add_argument("--formats", default="bf16,fp8,compact")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        m = to_settings(compose(config_name="config", overrides=args.overrides)).model
    from eagle3.target.weights import load_embedding_and_head

    parts = load_target(m.path, dtype=m.dtype, trust_remote_code=m.trust_remote_code, revision=m.revision)
    check_geometry(parts, m.num_layers, m.hidden_size)
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmp_name:
        tmp = Path(tmp_name)
        merged = args.merged
        if merged is None:
            merged = tmp / "merged"
            write_split_files(merged, demo_records(args.demo_samples, m.path), n_eval=max(args.demo_samples // 10, 1))
        for fmt in args.formats.split(","):
            spec = StoreSpec(model=m.name, target={**target_identity(m.path, m.revision), "dtype": m.dtype},
                             capture_layers=tuple(m.capture_layers), storage_format=fmt, hidden_size=int(m.hidden_size))
            store_dir = tmp / "stores" / spec.dirname
            job = UnitJob(merged_dir=merged, store_dir=store_dir, spec=spec, shard=0, num_shards=1,
                          batch_tokens=args.batch_tokens, vocab_size=int(m.vocab_size), disk_margin_gb=0.0,
                          assume_free_bytes=None, open_source=lambda: HFStates(lambda: parts, m.capture_layers),
                          teacher_head=lambda: load_embedding_and_head(m.path, revision=m.revision)[1])
            with StageOutput.open(tmp / "units", "extract", fmt, {"format": fmt}) as out:
                stats = run_extraction(job, out)
            store = HiddenStateStore(store_dir)
            tokens = sum(e.seq_len for e in store.entries.values())
            err_max = [max(e.err_max[j] for e in store.entries.values()) for j in (0, 1)]
            err_mean = [sum(e.err_sum[j] for e in store.entries.values()) / tokens for j in (0, 1)]
            size = sum(p.stat().st_size for p in store_dir.rglob("*") if p.is_file())
            print(f"{fmt}: {len(store)} samples, {tokens:,} tokens; extract "
                  f"{stats['tokens_this_run'] / stats['seconds_this_run']:,.0f} tok/s ({args.threads} threads, "
                  f"batch_tokens {args.batch_tokens}); {spec_bytes(spec):,} B/token; store {format_bytes(size)} "
                  f"({size / tokens:,.0f} B/token on disk); rel. error per token: aux max {err_max[0]:.4f} "
                  f"mean {err_mean[0]:.4f}, {'teacher tail mass' if fmt == 'compact' else 'final'} max "
                  f"{err_max[1]:.4f} mean {err_mean[1]:.4f}; loader "
                  f"{loader_rate(store_dir, merged / 'train.jsonl'):,.0f} tok/s", flush=True)
    proxy = trainer_proxy_rate(int(m.hidden_size), len(m.capture_layers), int(m.vocab_size), int(m.draft.vocab_size))
    print(f"trainer stand-in (fc + 7 TTT passes of one decoder layer + heads, fwd+bwd): {proxy:,.0f} tok/s "
          f"({args.threads} threads)", flush=True)


def spec_bytes(spec: StoreSpec) -> int:
    from eagle3.states.formats import bytes_per_token

    return bytes_per_token(spec.storage_format, spec.hidden_size, len(spec.capture_layers))


if __name__ == "__main__":
    main()
