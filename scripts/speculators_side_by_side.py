#!/usr/bin/env python
"""eagle3's draft beside one trained by speculators, on the same chain data, judged the same way.

    scripts/setup_vllm_cpu.sh && scripts/setup_speculators_cpu.sh
    python scripts/speculators_side_by_side.py --root /tmp/sbs --seeds 0 1 [-- OVERRIDES...]

(`data.seed` follows `seed` unless OVERRIDES fix it, e.g. `-- data.seed=0` for the same data
under every seed.)

For each seed: (1) the chain's stages through `train` (plus OVERRIDES; `--chain-root` reuses an
existing chain's units) train eagle3's draft; (2) speculators 0.9.0 (`speculators train`, its own
venv; on a CPU through scripts/speculators_cpu.py) trains an Eagle-3 draft on the same train split:
the same token ids and trained positions, capture ids, vocab maps (the chain's d2t/t2d), TTT steps,
epochs and tokens per batch, its eval split for validation. Its states are computed here by the same
target in the same forward (the chain's `model.dtype`) as the chain's hf extraction (speculators
needs the final residual before the target's last norm, which eagle3's store does not keep); the
captured states are rounded to bfloat16, as eagle3's store holds them. Everything else is
speculators' own recipe (its defaults: Muon, linear schedule, its layer variants). (3) Its
last-epoch checkpoint is converted into an eagle3 export and checked against speculators' own
forward (same draft tokens); (4) both drafts are judged on the chain's held-out prompts: vLLM CPU
(`stage=bench`, engine counters, per-position acceptance) at each K of `--vllm-ks` (default `--ks`),
and eagle3's in-process eval (simulated and real accept length at each K of `--ks`, lossless check).

Writes ROOT/side_by_side.json and ROOT/side_by_side.md; each step's logs under ROOT/logs.
Rerunning reuses finished steps (the chain's units, speculators' checkpoints, bench units, in-process
judgements of unchanged exports under ROOT/judged).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.artifacts import Manifest, atomic_write_json, file_sha256, fingerprint  # noqa: E402
from eagle3.config.schema import OptimizerConfig, TrainConfig  # noqa: E402
from eagle3.threads import onednn_cache_capacity  # noqa: E402

RUN_PY = REPO / "scripts" / "run.py"
CHECK_SNIPPET = r"""
import json, sys, torch
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
ckpt, sample, out = sys.argv[1:4]
data = torch.load(sample, weights_only=True)
config = Eagle3SpeculatorConfig.from_pretrained(ckpt)
config.transformer_layer_config._attn_implementation = "sdpa"  # as trained (--draft-attn-impl sdpa)
model = Eagle3DraftModel.from_pretrained(ckpt, config=config).float().eval()
with torch.no_grad():
    tokens = model(hidden_states=data["aux"][None], input_ids=data["input_ids"][None],
                   document_ids=torch.zeros(1, data["input_ids"].numel(), dtype=torch.long),
                   ttt_steps=int(data["steps"]))
json.dump([t[0].tolist() for t in tokens], open(out, "w"))
"""


def log_path(root: Path, name: str) -> Path:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    return root / "logs" / f"{name}.log"


def run_logged(cmd: list[str], root: Path, name: str, env: dict | None = None) -> float:
    """Run `cmd` with output in ROOT/logs/NAME.log; exit with its tail on failure. Returns wall seconds."""
    started = time.perf_counter()
    with open(log_path(root, name), "w") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        tail = log_path(root, name).read_text()[-3000:]
        sys.exit(f"{name}: exit {done.returncode}: {' '.join(cmd)}\n{tail}")
    return time.perf_counter() - started


def chain(root: Path, chain_root: Path, seed: int, overrides: list[str], stage: str, extra: tuple = ()) -> dict:
    """Run a stage of the chain; returns the job's job.json (its `outputs` name the unit dirs)."""
    tag = hashlib.sha256("\0".join((*overrides, *extra)).encode()).hexdigest()[:8]
    run_dir = root / "runs" / f"{stage}_s{seed}_{tag}"
    run_logged([sys.executable, str(RUN_PY), f"stage={stage}", f"seed={seed}", f"paths.root={chain_root}",
                f"hydra.run.dir={run_dir}", *overrides, *extra], root, run_dir.name)
    return json.loads((run_dir / "job.json").read_text())


def chain_through_train(root: Path, chain_root: Path, seed: int, overrides: list[str]) -> dict:
    """The chain's stages up to train, one job each (eval is the judging below, not the chain's)."""
    from eagle3.stages import CHAIN

    names = [entry.name for entry in CHAIN]
    for name in names[: names.index("train") + 1]:
        job = chain(root, chain_root, seed, overrides, name)
    return job


def unit_dir(job: dict, stage: str) -> Path:
    [path] = [Path(o["dir"]) for o in job["outputs"] if o["stage"] == stage]
    return path


# --------------------------------------------------------------------------------------------
# speculators' data, training and the converted draft


def write_speculators_data(train_unit: Path, target: str, out: Path) -> dict[str, Any]:
    """speculators' file layout of the chain's splits: an arrow dataset + hs_<i>.safetensors."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from eagle3.artifacts import read_jsonl
    from eagle3.data.mixture import SPLIT_FILES
    from eagle3.dtypes import torch_dtype

    train = Manifest.load(train_unit)
    extract = Manifest.load(train.inputs["extract"]["path"])
    vocab_dir = Path(train.inputs["vocab"]["path"])
    merged = Path(extract.inputs["merged"]["path"])
    capture = list(train.extra["geometry"]["capture_layers"])
    done_file = out / "prepared.json"
    if done_file.is_file():
        return json.loads(done_file.read_text())
    records = [*read_jsonl(merged / SPLIT_FILES["train"]), *read_jsonl(merged / SPLIT_FILES["eval"])]
    n_train = sum(1 for _ in read_jsonl(merged / SPLIT_FILES["train"]))
    started = time.perf_counter()
    # the dtype the chain's extraction ran the target in (model.dtype), so both states come from the same forward
    dtype = torch_dtype(extract.extra["store_identity"]["target"]["dtype"])
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).eval()
    prenorm: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_pre_hook(lambda _m, args: prenorm.append(args[0].detach()))
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    with torch.no_grad():
        for i, rec in enumerate(records):
            ids = torch.tensor(rec["input_ids"])
            prenorm.clear()
            # the decoder alone: speculators needs states, not the head's logits (a 262K-token head
            # would be most of the forward on Gemma)
            states = model.model(input_ids=ids[None], output_hidden_states=True).hidden_states
            aux = [states[c][0].to(torch.bfloat16).float() for c in capture]  # what eagle3's store holds
            stacked = torch.stack([*aux, prenorm[0][0].float()], dim=1)  # [T, C + 1, H]
            save_file({"hidden_states": stacked.contiguous(), "token_ids": ids},
                      str(out / "hidden_states" / f"hs_{i}.safetensors"))
            mask = list(rec["loss_mask"])
            # speculators trains the prediction of token p+1 when loss_mask[p] is set; eagle3 that of
            # token j when loss_mask[j] is: shifted so both train exactly the same predictions.
            rows["input_ids"].append(rec["input_ids"])
            rows["loss_mask"].append(mask[1:] + [0])
            rows["seq_len"].append(len(mask))
    hook.remove()
    Dataset.from_dict(rows).with_format("torch").save_to_disk(str(out / "dataset"))
    import numpy as np

    d2t = torch.load(vocab_dir / "d2t.pt", weights_only=True)
    t2d = torch.load(vocab_dir / "t2d.pt", weights_only=True)
    np.save(out / "d2t.npy", d2t.long().numpy())
    np.save(out / "t2d.npy", t2d.bool().numpy())
    # The forward (model load, every sample's target pass, the files written): what speculators'
    # offline recipe runs before training, beside eagle3's extract stage.
    info = {"target": target, "capture_layers": capture, "n_train": n_train, "n_eval": len(records) - n_train,
            "train_tokens_per_epoch": sum(rows["seq_len"][:n_train]), "tokens": sum(rows["seq_len"]),
            "forward_wall_s": round(time.perf_counter() - started, 1)}
    done_file.write_text(json.dumps(info))
    return info


def speculators_verifier(target: str, out: Path) -> str:
    """The verifier path to hand speculators: the target itself, or a view of it whose final norm
    weight is stored as the scale it applies.

    speculators 0.9.0 computes its teacher with a Llama RMSNorm holding the target's `norm.weight`;
    for a family whose norm scales by `1 + weight` (Gemma 3) that teacher would be wrong and the
    side-by-side would measure the bug, not the recipe. The view links every file of the target but
    the weights, and holds only the tensors speculators reads (embedding, head, final norm).
    """
    from safetensors.torch import save_file

    from eagle3.target.weights import load_embedding_and_head, load_final_norm, norm_adds_one
    from eagle3.target_info import read_config

    if not norm_adds_one(read_config(target) or {}):
        return target
    view = out / "verifier"
    if (view / "model.safetensors").is_file():
        return str(view)
    view.mkdir(parents=True, exist_ok=True)
    for f in Path(target).iterdir():
        if f.is_file() and not f.name.startswith("model") and not (view / f.name).exists():
            (view / f.name).symlink_to(f.resolve())
    embed, head = load_embedding_and_head(target)
    scale, _ = load_final_norm(target)  # weight + 1: the scale the target applies
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": scale}
    if head is not embed:
        tensors["lm_head.weight"] = head
    save_file(tensors, str(view / "model.safetensors.tmp"))
    (view / "model.safetensors.tmp").rename(view / "model.safetensors")
    return str(view)


def train_speculators(root: Path, data: Path, info: dict, train_cfg: dict, seed: int, python: str) -> dict:
    """`speculators train` on the prepared data; returns its checkpoint dir and wall time."""
    epochs = int(train_cfg["max_epochs"])
    out = root / "speculators" / f"{data.name}-s{seed}-k{train_cfg['ttt_steps']}-e{epochs}-b{train_cfg['batch_tokens']}"
    last = out / "checkpoints" / str(epochs - 1)
    timing = out / "timing.json"
    if last.is_dir() and timing.is_file():
        return {"checkpoint": str(last), **json.loads(timing.read_text())}
    n = info["n_train"] + info["n_eval"]
    cmd = [python, str(REPO / "scripts" / "speculators_cpu.py"), "train", "--speculator-type", "eagle3",
           "--verifier-name-or-path", speculators_verifier(info["target"], data), "--data-path", str(data / "dataset"),
           "--hidden-states-path", str(data / "hidden_states"), "--save-path", str(out / "checkpoints"),
           "--log-dir", str(out / "logs"), "--d2t-path", str(data / "d2t.npy"), "--t2d-path", str(data / "t2d.npy"),
           "--target-layer-ids", *[str(c) for c in info["capture_layers"]],
           "--ttt-steps", str(train_cfg["ttt_steps"]), "--epochs", str(epochs),
           "--total-seq-len", str(train_cfg["batch_tokens"]), "--train-data-ratio", repr((info["n_train"] + 0.5) / n),
           "--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--num-workers", "0",
           "--hidden-states-dtype", "bfloat16", "--seed", str(seed), "--no-resume-from-checkpoint"]
    # The oneDNN kernel cache eagle3's stages run with (eagle3.threads), so both recipes keep an epoch's kernels.
    wall = run_logged(cmd, root, f"speculators_train_s{seed}",
                      env={"WANDB_MODE": "disabled", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": onednn_cache_capacity()})
    result = {"wall_s": round(wall, 1),
              "train_tokens_per_s": round(info["train_tokens_per_epoch"] * epochs / wall, 1)}
    timing.write_text(json.dumps(result))
    return {"checkpoint": str(last), **result}


def convert(checkpoint: Path, target: str, out: Path) -> Path:
    """The speculators checkpoint as an eagle3 vLLM export (same tensors; its layer flags kept)."""
    from safetensors.torch import load_file

    from eagle3.draft.export import export_draft
    from eagle3.draft.geometry import geometry_from_target
    from eagle3.draft.model import Eagle3Draft
    from eagle3.target.weights import load_embedding_and_head
    from eagle3.target_info import read_config

    cfg = json.loads((checkpoint / "config.json").read_text())
    flags = {k: bool(cfg.get(k, False)) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")}
    state = {k.replace("layers.0.", "midlayer."): v.float() if v.is_floating_point() else v
             for k, v in load_file(str(checkpoint / "model.safetensors")).items()}
    target_cfg = read_config(Path(target))
    assert target_cfg is not None, f"{target} has no config.json"
    g = geometry_from_target(target_cfg, cfg["eagle_aux_hidden_state_layer_ids"],
                             int(cfg["draft_vocab_size"]), flags)
    draft = Eagle3Draft(g)
    embed, _ = load_embedding_and_head(target)
    state["embed_tokens.weight"] = embed.float()
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"convert {checkpoint}: missing {missing}, unexpected {unexpected}")
    return export_draft(draft, out, "vllm", dtype="bfloat16", extra_metadata={"trained_by": "speculators 0.9.0"})


def check_conversion(checkpoint: Path, export: Path, data: Path, steps: int, python: str, root: Path) -> float:
    """Share of positions and steps where speculators' own forward and the converted draft draft the
    same token (teacher-forced TTT, one eval sample)."""
    import torch

    from eagle3.draft.attention import TTTAttention
    from eagle3.draft.export import load_exported
    from eagle3.target.weights import load_embedding_and_head

    info = json.loads((data / "prepared.json").read_text())
    from safetensors.torch import load_file

    hs = load_file(str(data / "hidden_states" / f"hs_{info['n_train']}.safetensors"))
    ids = hs["token_ids"]
    sample = root / "logs" / "conversion_sample.pt"
    torch.save({"aux": hs["hidden_states"][:-1, :-1].flatten(1), "input_ids": ids[1:], "steps": steps}, sample)
    theirs_file = root / "logs" / f"conversion_{checkpoint.parent.parent.name}.json"
    snippet = root / "logs" / "check_conversion.py"
    snippet.write_text(CHECK_SNIPPET)
    run_logged([python, str(snippet), str(checkpoint), str(sample), str(theirs_file)], root, "check_conversion")
    theirs = json.loads(theirs_file.read_text())
    _, _, draft = load_exported(export)
    embed, _ = load_embedding_and_head(info["target"])
    draft.embed_tokens.weight.data.copy_(embed)
    aux, inputs = hs["hidden_states"][:-1, :-1].flatten(1)[None].float(), ids[1:][None]
    seq = inputs.shape[1]
    attention = TTTAttention(draft.geometry.num_layers, 64)  # each layer's keys over the steps
    agree = total = 0
    with torch.no_grad():
        hidden, tokens = draft.project(aux), inputs
        for k in range(steps):
            state = draft.step(hidden, tokens, torch.arange(seq) + 1 + k, attention.attends)
            ours = draft.logits(state).argmax(-1)[0]  # draft ids
            mine = ours[: seq - k].tolist()
            agree += sum(int(a == b) for a, b in zip(mine, theirs[k][: seq - k], strict=False))
            total += seq - k
            hidden = draft.carry(state)
            tokens = torch.cat([inputs[:, 1 + k:], inputs.new_zeros(1, 1 + k)], dim=1)
    return agree / max(total, 1)


# --------------------------------------------------------------------------------------------
# Judging


def judged_once(root: Path, export: Path, train_unit: Path, target: str, ks: list[int], num_prompts: int,
                max_new: int, train_cfg: dict) -> dict:
    """`in_process`, kept under ROOT/judged by the export's bytes and the judge's inputs.

    The in-process judge decodes every prompt with the target at each K (about 12 min per draft on
    gemma-3-270m), so a rerun after retraining one side re-judges that side only.
    """
    kept = root / "judged" / f"{judge_key(export, train_unit, target, ks, num_prompts, max_new, train_cfg)}.json"
    if kept.is_file():
        print(f"[side-by-side] in-process judge of {export}: reusing {kept}", flush=True)
        return {k: v for k, v in json.loads(kept.read_text()).items() if k != "export"}
    result = in_process(export, train_unit, target, ks, num_prompts, max_new, train_cfg)
    kept.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(kept, {**result, "export": str(export)})
    return result


def judge_key(export: Path, train_unit: Path, target: str, ks: list[int], num_prompts: int, max_new: int,
              train_cfg: dict) -> str:
    """What an in-process judgement depends on: the export's files, the target, the eval split, the judge's knobs."""
    local = Path(target).expanduser()
    return fingerprint({"files": {f.name: file_sha256(f) for f in sorted(export.iterdir()) if f.is_file()},
                        "target": str(local.resolve()) if local.exists() else target, "ks": ks,
                        "prompts": num_prompts, "max_new": max_new, "train": train_cfg,
                        "extract": Manifest.load(train_unit).inputs["extract"]["path"]}, length=16)


def in_process(export: Path, train_unit: Path, target: str, ks: list[int], num_prompts: int, max_new: int,
               train_cfg: dict) -> dict:
    """eagle3's eval of any export: simulated on the eval split, real decoding on held-out prompts."""
    from eagle3.data.heldout import heldout_prompts
    from eagle3.data.mixture import EVAL_FILE
    from eagle3.draft.evaluate import load_eval_draft, real_acceptance, simulated_acceptance
    from eagle3.draft.fit import split_dataset

    extract = Manifest.load(Manifest.load(train_unit).inputs["extract"]["path"])
    geometry, draft, head = load_eval_draft(Path(export), target, revision=None, cache_dir=None, text_config_key=None)
    eval_set = split_dataset({"extract": extract}, "eval")
    train = TrainConfig(**{**train_cfg, "optimizer": OptimizerConfig(**train_cfg["optimizer"])})
    simulated = simulated_acceptance(geometry, draft, head, train, eval_set, ks, batch_tokens=train.batch_tokens)
    if num_prompts == 0:
        return {"sim_accept_len": simulated["sim_accept_len"], "acc": simulated["acc"], "real": {}}
    prompts = heldout_prompts(Path(extract.inputs["merged"]["path"]) / EVAL_FILE, num_prompts)
    real = real_acceptance(target, draft, [p["input_ids"] for p in prompts], ks=ks, max_new_tokens=max_new,
                           capture_layers=list(geometry.capture_layers), check_lossless=True, revision=None,
                           trust_remote_code=False, cache_dir=None)
    return {"sim_accept_len": simulated["sim_accept_len"], "acc": simulated["acc"],
            "real": {str(k): {"accept_length": r["accept_length"], "lossless": r["lossless"]} for k, r in real.items()}}


def vllm_bench(root: Path, chain_root: Path, seed: int, overrides: list[str], export: Path, k: int,
               python: str) -> dict:
    job = chain(root, chain_root, seed, overrides, "bench", extra=(
        "server=vllm", f"server.python={python}", f"server.speculative.draft_path={export}",
        f"server.speculative.num_steps={k}", f"server.speculative.num_draft_tokens={k + 1}", "bench.baseline=false",
        "bench.repeats=1"))
    report = json.loads((unit_dir(job, "bench") / "bench_report.json").read_text())
    accept = report["accept"]
    return {"accept_length": accept["accept_length"], "per_position": accept.get("acceptance_per_position"),
            "drafts": accept.get("drafts")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--target", default=None, help="the chain's model.path (default: the demo target)")
    parser.add_argument("--chain-root", type=Path, default=None,
                        help="the chain's paths.root (default ROOT/chain); an existing one's units are reused")
    parser.add_argument("--in-process-prompts", type=int, default=16,
                        help="held-out prompts of the in-process real decoding (0: simulated τ only)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--vllm-ks", type=int, nargs="+", default=None,
                        help="the Ks vLLM judges at (default: --ks; the in-process judge keeps --ks)")
    parser.add_argument("--speculators-python", default=str(REPO / ".speculators-venv" / "bin" / "python"))
    parser.add_argument("--vllm-python", default=str(REPO / ".vllm-venv" / "bin" / "python"))
    parser.add_argument("--skip-vllm", action="store_true", help="in-process judging only")
    parser.add_argument("overrides", nargs="*", help="overrides of both chains (after --)")
    args = parser.parse_args()
    root = args.root.resolve()
    chain_root = (args.chain_root or root / "chain").resolve()
    from eagle3.paths import asset_path

    target = args.target or str(asset_path("demo_target"))
    vllm_ks = args.vllm_ks or args.ks
    results = root / "side_by_side.json"
    earlier = json.loads(results.read_text()) if results.is_file() else []
    rows: list[dict] = []
    for seed in args.seeds:
        job = chain_through_train(root, chain_root, seed, args.overrides)
        train_unit = unit_dir(job, "train")
        trained = Manifest.load(train_unit)
        # The manifest keeps the keys that change the draft; the schema's defaults fill the rest
        # (memory and logging knobs the in-process judge also reads).
        metrics, train_cfg = trained.extra, {**dataclasses.asdict(TrainConfig()), **trained.config["train"]}
        extracted = Manifest.load(trained.inputs["extract"]["path"])
        extract_fp = extracted.fingerprint
        data = root / "speculators" / f"data-{extract_fp}"  # seeds that change data.seed get their own
        info = write_speculators_data(train_unit, target, data)
        spec = train_speculators(root, data, info, train_cfg, seed, args.speculators_python)
        export = convert(Path(spec["checkpoint"]), info["target"], Path(spec["checkpoint"]).parent.parent / "export")
        agreement = check_conversion(Path(spec["checkpoint"]), export, data, int(train_cfg["ttt_steps"]),
                                     args.speculators_python, root)
        ours_export = train_unit / "draft" / "vllm"
        row = {"seed": seed, "epochs": int(train_cfg["max_epochs"]), "conversion_agreement": round(agreement, 4),
               "ours": {"train_tokens_per_s": metrics["train_tokens_per_s"], "fit_wall_s": metrics["fit_wall_s"],
                        "extract_tokens_per_s": extracted.extra.get("extract_tokens_per_s")},
               "speculators": {"train_tokens_per_s": spec["train_tokens_per_s"], "wall_s": spec["wall_s"],
                               "forward_wall_s": info.get("forward_wall_s"), "forward_tokens": info.get("tokens")}}
        for who, path in (("ours", ours_export), ("speculators", export)):
            row[who]["in_process"] = judged_once(root, path, train_unit, target, args.ks, args.in_process_prompts,
                                                 128, train_cfg)
            if not args.skip_vllm:
                row[who]["vllm"] = {str(k): vllm_bench(root, chain_root, seed, args.overrides, path, k,
                                                       args.vllm_python) for k in vllm_ks}
        rows.append(row)
        kept = [r for r in earlier if (r["seed"], r.get("epochs")) not in {(x["seed"], x["epochs"]) for x in rows}]
        results.write_text(json.dumps(kept + rows, indent=1))
    write_table(root, json.loads(results.read_text()), sorted({*args.ks, *vllm_ks}), not args.skip_vllm)


def _accept_length(judged: dict, source: str, k: int) -> float:
    """One draft's accept length at K=k from vLLM's counters or the in-process real decoding."""
    return (judged["vllm"] if source == "vllm" else judged["in_process"]["real"])[str(k)]["accept_length"]


def _ks_in_every_row(rows: list[dict], ks: list[int], source: str) -> list[int]:
    """The Ks every row was judged at by `source` (rows of earlier runs may have other --ks)."""
    def judged(r: dict) -> dict:
        return r.get("vllm", {}) if source == "vllm" else r["in_process"]["real"]

    return [k for k in ks if all(str(k) in judged(row[w]) for row in rows for w in ("ours", "speculators"))]


def write_table(root: Path, rows: list[dict], ks: list[int], with_vllm: bool) -> None:
    real_ks = _ks_in_every_row(rows, ks, "in_process")
    if with_vllm:
        ks = _ks_in_every_row(rows, ks, "vllm")
    header = ["seed", "epochs", "draft", "train tok/s", "sim τ", *[f"in-process τ K={k}" for k in real_ks]]
    if with_vllm:
        header += [*[f"vLLM τ K={k}" for k in ks], *[f"vLLM per position K={k}" for k in ks]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios: dict[str, list[float]] = {}
    for row in rows:
        for who in ("ours", "speculators"):
            r = row[who]
            cells = [str(row["seed"]), str(row.get("epochs", "")), who, f"{r['train_tokens_per_s']:.0f}",
                     f"{r['in_process']['sim_accept_len']:.3f}"]
            cells += [f"{r['in_process']['real'][str(k)]['accept_length']:.3f}" for k in real_ks]
            if with_vllm:
                cells += [f"{r['vllm'][str(k)]['accept_length']:.3f}" for k in ks]
                cells += [", ".join(f"{p:.2f}" for p in (r["vllm"][str(k)].get("per_position") or [])) for k in ks]
            lines.append("| " + " | ".join(cells) + " |")
        group = f"epochs {row.get('epochs', '?')}"
        judged = [("vllm", k) for k in ks] if with_vllm else []
        judged += [("in_process", k) for k in real_ks]
        for src, k in judged:
            ratios.setdefault(f"{group}, {src} τ K={k}", []).append(
                _accept_length(row["ours"], src, k) / _accept_length(row["speculators"], src, k))
        ratios.setdefault(f"{group}, sim τ", []).append(
            row["ours"]["in_process"]["sim_accept_len"] / row["speculators"]["in_process"]["sim_accept_len"])
        ratios.setdefault(f"{group}, train tok/s", []).append(
            row["ours"]["train_tokens_per_s"] / row["speculators"]["train_tokens_per_s"])
    lines.append("")
    for name, values in ratios.items():
        spread = f" (min {min(values):.3f}, max {max(values):.3f})" if len(values) > 1 else ""
        lines.append(f"- ours / speculators, {name}: {statistics.mean(values):.3f}x over {len(values)} seeds{spread}")
    (root / "side_by_side.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
