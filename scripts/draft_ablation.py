#!/usr/bin/env python
"""One row per candidate change to draft training, each over several seeds, on the same chain.

    python scripts/draft_ablation.py --root /tmp/ablation --seeds 0 1 [--rows baseline muon ...] [-- OVERRIDES]
    python scripts/draft_ablation.py --root /tmp/abl --base defaults --chain-root /tmp/smol \
        --rows baseline loss_tv loss_jsd -- experiment=smollm2 data.scale=400 train.max_epochs=1 data.seed=0

Every row is `stage=train` of the same chain (data, extraction and vocab are reused: only the
draft is trained again) with the row's overrides on top of the base recipe (`--base issue14`:
BASE, the recipe before issue 14's ablation; `--base defaults`: today's defaults) and OVERRIDES,
once per seed. `--chain-root` points at an existing chain's paths.root (default ROOT/chain). The figures
are the train stage's pooled eval over the eval split: per-step top-1 agreement with the target
and the simulated accept length it implies at K = 3 and 5 (`1 + sum_k prod_{j<=k} acc_j`), the
mean over seeds with the spread (max - min), and the ratio to the baseline row.
Writes ROOT/ablation.json and ROOT/ablation.md; rerunning reuses finished train units.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.draft.acceptance import simulated_accept_length  # noqa: E402

RUN_PY = REPO / "scripts" / "run.py"
MUON = "train.optimizer._target_=eagle3.draft.optim.MuonAdamW"
#: The recipe the rows change: the defaults before the ablation (AdamW, the plain layer, 1,024
#: tokens per step); the winners (norm_before_residual + Muon + 512 tokens) are today's demo defaults.
BASE = ["train.optimizer._target_=torch.optim.AdamW", "model.draft.norm_before_residual=false",
        "train.batch_tokens=1024"]
SPECULATORS_LAYER = ["model.draft.norm_before_residual=true", "model.draft.norm_before_fc=true",
                     "model.draft.norm_output=true"]
#: name -> (what it tests, overrides)
ROWS = {
    "baseline": ("the base recipe (--base)", []),
    "norm_before_residual": ("residual after hidden_norm", ["model.draft.norm_before_residual=true"]),
    "norm_before_fc": ("one norm over the captured states before fc", ["model.draft.norm_before_fc=true"]),
    "fc_norm": ("one norm per captured state before fc", ["model.draft.fc_norm=true"]),
    "norm_output": ("next step reads the normed state", ["model.draft.norm_output=true"]),
    "speculators_layer": ("norm_before_residual + norm_before_fc + norm_output", SPECULATORS_LAYER),
    "muon": ("Muon on matrices, AdamW on the rest", [MUON]),
    "adamw": ("AdamW on every parameter (no Muon)", ["train.optimizer._target_=torch.optim.AdamW"]),
    "decay_1.0": ("TTT steps weighted equally", ["train.ttt_decay=1.0"]),
    "decay_0.6": ("TTT steps weighted 0.6^k", ["train.ttt_decay=0.6"]),
    "ttt_3": ("3 TTT steps", ["train.ttt_steps=3"]),
    "linear_to_0": ("linear schedule to 0 (speculators')", ["train.lr_schedule=linear", "train.min_lr_ratio=0.0"]),
    "warmup_0.01": ("1% warmup", ["train.warmup_ratio=0.01"]),
    "lr_1e-3": ("half the LR", ["train.optimizer.lr=1e-3"]),
    "lr_4e-3": ("twice the LR", ["train.optimizer.lr=4e-3"]),
    "batch_512": ("512 tokens per step", ["train.batch_tokens=512"]),
    "batch_1024": ("1,024 tokens per step", ["train.batch_tokens=1024"]),
    "batch_2048": ("2,048 tokens per step", ["train.batch_tokens=2048"]),
    "oov_keep": ("out-of-vocab argmax positions kept in the loss", ["train.out_of_vocab=keep"]),
    "teacher_full_vocab": ("teacher not renormalised over the draft vocab", ["train.teacher=full_vocab"]),
    "loss_tv": ("total variation instead of KL", ["train.loss=tv"]),
    "loss_jsd": ("Jensen-Shannon instead of KL", ["train.loss=jsd"]),
    "loss_nla": ("negative log-acceptance -log sum min(p, q) instead of KL", ["train.loss=nla"]),
    "loss_lk": ("the LK loss: KL/TV blended by the step's acceptance", ["train.loss=lk"]),
    "dpace": ("D-PACE step weights (each chain's smoothed acceptance) instead of 0.8^k", ["train.step_weights=dpace"]),
    "dpace_raw": ("D-PACE step weights, acceptance not smoothed",
                  ["train.step_weights=dpace", "train.dpace_smoothing=0"]),
    "lk_dpace": ("the LK loss with D-PACE step weights", ["train.loss=lk", "train.step_weights=dpace"]),
    "ttt_5": ("5 TTT steps", ["train.ttt_steps=5"]),
    "noise_0.1": ("noise on the captured states, 0.1 x their RMS", ["train.state_noise=0.1"]),
    "layers_2": ("two decoder layers (vLLM only)", ["model.draft.num_layers=2"]),
    "layers_3": ("three decoder layers (vLLM only)", ["model.draft.num_layers=3"]),
    "mla": ("MLA attention at the target's MLA geometry (MLA targets)", ["model.draft.attention=mla"]),
    # Combinations of the single-change winners.
    "nbr_muon": ("norm_before_residual + muon", ["model.draft.norm_before_residual=true", MUON]),
    "nbr_nbfc_muon": ("norm_before_residual + norm_before_fc + muon",
                      ["model.draft.norm_before_residual=true", "model.draft.norm_before_fc=true", MUON]),
    "spec_layer_muon": ("speculators_layer + muon", [*SPECULATORS_LAYER, MUON]),
    "nbr_muon_b512": ("norm_before_residual + muon, 512 tokens per step",
                      ["model.draft.norm_before_residual=true", MUON, "train.batch_tokens=512"]),
}


def train_row(root: Path, chain_root: Path, name: str, overrides: list[str], seed: int) -> dict:
    run_dir = root / "runs" / f"{name}_s{seed}"
    job_file = run_dir / "job.json"
    if not job_file.is_file() or json.loads(job_file.read_text()).get("status") != "complete":
        (root / "logs").mkdir(parents=True, exist_ok=True)
        with open(root / "logs" / f"{name}_s{seed}.log", "w") as fh:
            done = subprocess.run([sys.executable, str(RUN_PY), "stage=train", f"seed={seed}",
                                   f"paths.root={chain_root}", f"hydra.run.dir={run_dir}", *overrides],
                                  stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
        if done.returncode != 0:
            sys.exit(f"{name} seed {seed}: exit {done.returncode}; see {root / 'logs' / f'{name}_s{seed}.log'}")
    job = json.loads(job_file.read_text())
    [unit] = [Path(o["dir"]) for o in job["outputs"] if o["stage"] == "train"]
    extra = json.loads((unit / "manifest.json").read_text())["extra"]
    acc = extra["eval"]["acc"]
    return {"seed": seed, "unit": str(unit), "acc": acc, "sim_k3": simulated_accept_length(acc[:3]),
            "sim_k5": simulated_accept_length(acc[:5]), "sim": extra["eval"]["sim_accept_len"],
            "train_tokens_per_s": extra["train_tokens_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), metavar="ROW")
    parser.add_argument("--base", choices=["issue14", "defaults"], default="issue14",
                        help="the recipe the rows change: issue 14's BASE or today's defaults")
    parser.add_argument("--chain-root", type=Path, default=None, help="the chain's paths.root (default ROOT/chain)")
    parser.add_argument("overrides", nargs="*", help="overrides of every row (after --)")
    args = parser.parse_args()
    root = args.root.resolve()
    chain_root = (args.chain_root or root / "chain").resolve()
    base = BASE if args.base == "issue14" else []
    rows = ["baseline", *[r for r in args.rows if r != "baseline"]]
    results = {}
    for name in rows:
        results[name] = [train_row(root, chain_root, name, [*base, *args.overrides, *ROWS[name][1]], s)
                         for s in args.seeds]
        (root / "ablation.json").write_text(json.dumps(results, indent=1))
        print(name, [round(r["sim_k3"], 3) for r in results[name]], flush=True)
    baseline = statistics.mean(r["sim_k3"] for r in results["baseline"])
    lines = ["| row | what | acc@1 | acc@2 | acc@3 | acc@5 | sim τ K=3 (spread) | sim τ K=5 | vs baseline K=3 "
             "| train tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in rows:
        rs = results[name]
        acc = [statistics.mean(r["acc"][i] for r in rs) if all(len(r["acc"]) > i for r in rs) else float("nan")
               for i in range(5)]
        k3 = [r["sim_k3"] for r in rs]
        k5 = statistics.mean(r["sim_k5"] for r in rs)
        lines.append(f"| {name} | {ROWS[name][0]} | {acc[0]:.3f} | {acc[1]:.3f} | {acc[2]:.3f} | {acc[4]:.3f} | "
                     f"{statistics.mean(k3):.3f} ({max(k3) - min(k3):.3f}) | {k5:.3f} | "
                     f"{statistics.mean(k3) / baseline:.3f}x | "
                     f"{statistics.mean(r['train_tokens_per_s'] for r in rs):,.0f} |")
    (root / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
