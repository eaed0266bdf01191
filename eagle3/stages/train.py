"""Stage `train`: the EAGLE-3 draft, trained with Lightning on the target's hidden states.

The unit is one mix (`dataset.name`). Inputs: the extract manifest (store + merged splits) and
the vocab manifest (`d2t`/`t2d`); with `train.hidden_states=online` the merge manifest instead of
the extract one: each batch's states come from the target while it trains (`extract.backend`:
in this process, or a vLLM server launched for the fit) and nothing is stored. Outputs in the
unit directory: `checkpoints/` (Lightning, `last.ckpt` every `train.checkpoint_every_n_steps`
steps, or at each epoch end when that is 0; without the target's frozen embedding, `eagle3.draft.checkpoint_io`), the
exported draft under `draft/sglang` and `draft/vllm` -- for the engines that serve its geometry
(`eagle3.draft.geometry.geometry_refusals`: a layer variant, a capture of other than 3 layers or
one of layer 0 is exported for vLLM alone; config validation refused what no engine serves) -- and
`train_metrics.json`.

A killed run resumes from `last.ckpt` when rerun (optimizer, scheduler, step and the position
inside the epoch are all in it). Metrics go through Lightning to the job's loggers (CSV, W&B).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput, atomic_write_json
from eagle3.config.schema import Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.draft.fit import FIT_SUMMARY, TrainMetrics, export_engines, fit_draft, load_vocab_maps, training_sets
from eagle3.draft.options import COMPUTING_MODES, HYBRID, TTT_CHAINS_RESCORED
from eagle3.reports.loggers import log_report
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.extract import EXTRACT, states_identity
from eagle3.stages.merge import MERGE
from eagle3.stages.vocab import D2T_FILE, T2D_FILE, VOCAB

log = logging.getLogger("eagle3")
EXPORT_DIR = "draft"
METRICS_FILE = "train_metrics.json"
# 2: the slice is the schema's fingerprint of `train` and `model.draft` (eagle3.config.slices);
# 3: the teacher stays float32 under bf16-mixed autocast (earlier units learned a bf16-rounded teacher)
FORMAT_VERSION = 3
ONLINE_URLS_FILE = "online_servers.json"  # rank 0's state server, for ranks a launcher starts apart


def online(config: Eagle3Config) -> bool:
    """Whether this config trains on states computed while training (`train.hidden_states=online`,
    or `hybrid`, which computes them the first time): its input is the merged split, not a store."""
    return config.train.hidden_states in COMPUTING_MODES


def hybrid_store(config: Eagle3Config, ctx: StageContext, unit_dir: Path) -> Optional[dict[str, Any]]:
    """`HybridStateDataset`'s store arguments under `train.hidden_states=hybrid` (else None)."""
    if config.train.hidden_states != HYBRID:
        return None
    from eagle3.stages.extract import store_dir, store_spec, teacher_head_loader

    gb = config.train.hybrid_store_gb
    return {"store_dir": store_dir(config), "spec": store_spec(config), "unit": unit_dir.name,
            "budget_bytes": None if gb is None else int(gb * 1e9),
            "teacher_head": teacher_head_loader(config)}


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    slice_ = {"train": fingerprinted(config.train), "draft": fingerprinted(config.model.draft), "seed": config.seed,
              "format": FORMAT_VERSION}
    if online(config):  # what the states are a function of (in store mode: the extract input's fingerprint)
        states = states_identity(config)
        if config.train.hidden_states == HYBRID:  # it trains on the stored values, in this format
            from eagle3.states.formats import format_params

            fmt = config.extract.storage_format
            states["stored_as"] = {"storage_format": fmt, **format_params(fmt)}
        slice_["states"] = states
    return slice_


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    states = ("merged", MERGE) if online(config) else ("extract", EXTRACT)
    return {states[0]: require(states[1], config, ctx, unit), "vocab": require(VOCAB, config, ctx, unit)}


@contextlib.contextmanager
def _datasets(config: Eagle3Config, ctx: StageContext, unit: str, unit_dir: Path, rank: int = 0):
    """`(train, eval)` for the block: stored states, or online ones (a state server up for the block)."""
    from eagle3.extract.sources import online_states

    inputs = _unit_inputs(config, ctx, unit)
    if not online(config):
        yield training_sets(inputs)
        return
    with online_states(config, ctx.run_dir, unit_dir / ONLINE_URLS_FILE, wait_for_urls=rank > 0) as make_source:
        sets = training_sets(inputs, make_source, hybrid_store(config, ctx, unit_dir))
        try:
            yield sets
        finally:
            for dataset in sets:
                dataset.close_source()


def _fit(config: Eagle3Config, ctx: StageContext, unit: str, unit_dir: Path, sets: tuple):
    vocab_dir = _unit_inputs(config, ctx, unit)["vocab"].directory
    from eagle3.tracking import job_loggers

    return fit_draft(config, sets[0], sets[1], load_vocab_maps(vocab_dir / D2T_FILE, vocab_dir / T2D_FILE),
                     unit_dir, job_loggers(config, ctx.run_dir), rescorer=_rescorer(config))


def _rescorer(config: Eagle3Config):
    """`train.ttt_chains=rescored`: the target, loaded with transformers, that scores the draft's chains."""
    if config.train.ttt_chains != TTT_CHAINS_RESCORED:
        return None
    from eagle3.draft.rescoring import Rescorer
    from eagle3.extract.sources import load_hf_target
    from eagle3.target.tree import TreeScorer

    t = config.train
    scorer = TreeScorer(load_hf_target(config), config.model.text_config_key)
    return Rescorer(scorer, steps=t.ttt_steps, block_size=t.attention_block)


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    from eagle3.draft.evaluate import evaluate_pooled
    from eagle3.tracking import job_loggers

    t = config.train
    with _datasets(config, ctx, unit, out.dir) as sets:
        fit = _fit(config, ctx, unit, out.dir, sets)
        module, train_set, eval_set, wall = fit.module, fit.train_set, fit.eval_set, fit.wall_s
        rescorer = module.rescorer
        if rescorer is not None:
            log.info("train: the target scored %d tokens of the draft's own chains in %.1f s (%.0f%% of the fit)",
                     rescorer.scored_tokens, rescorer.seconds, 100 * rescorer.seconds / max(wall, 1e-9))
        module.to("cpu").eval()
        pooled = evaluate_pooled(module, eval_set, batch_tokens=t.batch_tokens) if len(eval_set) else None
    done = json.loads((out.dir / FIT_SUMMARY).read_text())  # what rank 0 saw (also under ddp_spawn)
    out.count_in(len(train_set))
    out.count_out(len(train_set))

    exports = export_engines(module, out.dir / EXPORT_DIR, t.export_dtype,
                             {"dataset": unit, "global_step": done["global_step"]})
    metrics = TrainMetrics(
        global_step=done["global_step"],
        epochs=done["epochs"],
        train_samples=len(train_set),
        eval_samples=len(eval_set),
        train_tokens_per_epoch=int(sum(int(n) for n in train_set.lengths)),
        fit_wall_s=round(wall, 1),
        train_tokens_this_run=done["tokens_this_run"],
        train_tokens_per_s=round(done["tokens_this_run"] / wall, 1) if wall > 0 else None,
        resumed_at_step=fit.resumed_at,
        world_size=done["world_size"],
        eval=pooled,
        geometry=module.draft.geometry.to_dict(),
        trainable_parameters=sum(p.numel() for p in module.draft.parameters() if p.requires_grad),
        hidden_states=t.hidden_states,
        states_source=done.get("states_source", []) if online(config) else None,
    ).record()
    atomic_write_json(out.dir / METRICS_FILE, metrics)
    if pooled:
        # Lightning validates every `eval_every_n_epochs`, which need not divide the epoch count; the
        # final figures are what a sweep compares, so every run ends with them, at the last step.
        final = {"eval/sim_accept_len": pooled["sim_accept_len"], "eval/chain_accept_len": pooled["chain_accept_len"]}
        final.update({f"eval/acc_{k}": a for k, a in enumerate(pooled["acc"])})
        final.update({f"eval/loss_{k}": x for k, x in enumerate(pooled["step_kl"])})
        log_report(job_loggers(config, ctx.run_dir), final, step=done["global_step"], summary=final)
        log.info("train: eval simulated accept length %.3f (acc per step %s), chain by chain %.3f",
                 pooled["sim_accept_len"], ", ".join(f"{a:.3f}" for a in pooled["acc"]), pooled["chain_accept_len"])
    return {**metrics, "exports": exports, "files": {"metrics": METRICS_FILE}}


class TrainStage(UnitStage):
    """UnitStage, plus the worker side of multi-process launches.

    Under torchrun/SLURM (or Lightning's own `ddp` launcher, which re-runs this command) every
    rank runs the job. Rank 0 owns the unit directory as usual; the other ranks join `fit`
    for the same directory without taking its lock (rank 0 holds it while it waits for them)
    and end the job after training: manifests, exports and later stages are rank 0's.
    """

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        from lightning.pytorch.utilities import rank_zero_only

        # From RANK / LOCAL_RANK / SLURM_PROCID, as Lightning reads them; Lightning sets `rank` on the
        # function at import, which its type does not declare.
        rank = int(rank_zero_only.rank)  # type: ignore[attr-defined]
        if rank == 0:
            return super().__call__(config, ctx)
        for unit in self.units(config):
            where, manifest = self.locate(config, ctx, unit)
            if manifest is None:
                log.info("train: rank %d joins training of %s", rank, where)
                with _datasets(config, ctx, unit, where, rank) as sets:
                    _fit(config, ctx, unit, where, sets)
        raise SystemExit(0)


TRAIN = TrainStage(
    name="train",
    help="EAGLE-3 draft with the training-time test (Lightning), exported for SGLang and vLLM",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
