#!/usr/bin/env python
"""Train, save and evaluate the demo target (``eagle3/assets/demo_target``) on CPU.

Runs corpus -> conversations -> BPE tokenizer -> Llama training -> held-out evaluation in one go
(about 21 minutes on 2 CPU cores) and writes ``training_report.json`` beside the weights.
The figures in the report come from the *saved* bfloat16 weights reloaded from disk, so
``--eval-only`` reproduces them exactly from the committed files.

Usage:
    python scripts/train_demo_target.py                 # full run (overwrites the assets)
    python scripts/train_demo_target.py --eval-only     # re-evaluate the committed model
    python scripts/train_demo_target.py --steps 10 --out /tmp/dt   # timing probe
    python scripts/train_demo_target.py --architecture deepseek_v3 --tokenizer-kind tiktoken \
        --steps 500 --out eagle3/assets/demo_kimi_target         # the Kimi-shaped demo_kimi target
"""

from __future__ import annotations

import os

# Before torch loads OpenMP: sleep rather than spin at barriers. On a shared 2-core machine a
# spinning 2-thread job that loses a core to another process slows down ~10x, not ~2x. It does
# not change any result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import platform
import random
import time
from dataclasses import fields
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.demo import corpus
from eagle3.demo import evaluation as ev
from eagle3.demo import target_training as tt
from eagle3.demo import tokenizer as demo_tok


def machine() -> dict:
    """Enough about the host to interpret the timings."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(int(row.split()[1]) for row in Path("/proc/meminfo").read_text().splitlines()
                      if row.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem_kb = 0
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "mem_gib": round(mem_kb / 2**20, 1), "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def evaluate_saved(out: Path, cfg: tt.TrainConfig, train_ids: torch.Tensor | None = None) -> dict:
    """Held-out loss, unigram baseline and greedy samples of the model saved in ``out``."""
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=cfg.tokenizer_kind == "tiktoken")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    if train_ids is None:
        train_ids = tt.packed_rows(cfg, tokenizer, cfg.steps * cfg.batch_size)[0]
    unigram = ev.unigram_logprobs(train_ids, len(tokenizer), tokenizer.pad_token_id)
    seqs = ev.heldout_sequences(tokenizer, cfg.eval_conversations, cfg.seed)
    result = {"heldout": ev.evaluate(model, tokenizer, seqs, unigram)}
    ev.greedy_sample(model, tokenizer, ev.heldout_prompt("explain", cfg.seed), max_new_tokens=4)  # warm-up
    result["samples"] = {kind: ev.greedy_sample(model, tokenizer, ev.heldout_prompt(kind, cfg.seed))
                         for kind in ("explain", "tool")}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=corpus.DEMO_TARGET_PATH)
    parser.add_argument("--eval-only", action="store_true", help="evaluate the saved model only")
    for f in fields(tt.TrainConfig):
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(f.default, bool) else type(f.default)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    args = parser.parse_args()
    cfg = tt.TrainConfig(**{f.name: getattr(args, f.name) for f in fields(tt.TrainConfig)})

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    t_start = time.time()
    if args.eval_only:
        report_path = args.out / "training_report.json"
        if report_path.exists():  # evaluate with the configuration the model was trained with
            saved = json.loads(report_path.read_text())["config"]
            cfg = tt.TrainConfig(**{k: v for k, v in saved.items() if k in cfg.__dict__})
        print(json.dumps(evaluate_saved(args.out, cfg), indent=2))
        return

    tokenizer = tt.build_tokenizer(cfg)
    if cfg.tokenizer_kind == "tiktoken":  # the same BPE, as tiktoken ranks behind remote code
        tokenizer = demo_tok.save_as_tiktoken(tokenizer, args.out)
    print(f"tokenizer: {len(tokenizer)} tokens ({time.time() - t_start:.0f}s)")
    rows = tt.packed_rows(cfg, tokenizer, cfg.steps * cfg.batch_size)
    fill = float((rows[2] != -100).float().mean())
    print(f"packed {rows[0].shape[0]} rows of {cfg.seq_len} ({fill:.1%} real tokens) "
          f"({time.time() - t_start:.0f}s)")
    model = tt.build_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters")
    stats = tt.train(cfg, model, rows)

    args.out.mkdir(parents=True, exist_ok=True)
    if cfg.architecture == "deepseek_v3":
        tt.untie_output_embedding(model)  # vLLM's DeepSeek class reads lm_head.weight, never the tie
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)  # type: ignore[arg-type]  # transformers' @wraps(nn.Module.to) types .to unbound
    tt.generation_config(tokenizer).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    bytes_on_disk = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file()
                        and p.name != "training_report.json")

    result = evaluate_saved(args.out, cfg, rows[0])
    report = {
        "seed": cfg.seed, "steps": cfg.steps, "tokens_seen": stats["tokens_seen"],
        "train_wall_s": stats["train_wall_s"], "total_wall_s": round(time.time() - t_start, 1),
        "parameters": n_params, "bytes_on_disk": bytes_on_disk, "weights_dtype": "bfloat16",
        "loss_target": "all tokens of each conversation (prompt, tool results and answers)",
        "corpus_python": corpus.load_corpus().header.get("python"),
        "machine": machine(), **result, "config": stats["config"], "loss_curve": stats["loss_curve"],
    }
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    summary = {k: report[k] for k in ("steps", "tokens_seen", "train_wall_s", "total_wall_s",
                                      "parameters", "bytes_on_disk", "heldout")}
    print(json.dumps(summary, indent=2))
    for kind, sample in result["samples"].items():
        print(f"--- greedy sample ({kind}): {sample['prompt']!r}\n{sample['text']}")


if __name__ == "__main__":
    main()
