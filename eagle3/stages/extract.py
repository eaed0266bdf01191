"""Stage `extract`: the target's captured aux layers and final state for every merged sample.

The unit is one merge output (`dataset.name`), both splits. The tensors go to the shared,
content-keyed hidden-state store (`extract.store_root`, see `eagle3.states.store`); the unit
directory holds `keys.jsonl` (sample id -> store key, and whether this unit extracted or reused
it), the rejects, and a manifest whose `extra` says where the store is, what it cost per token,
how lossy it is, and which aux layer ids each serving engine must be given for this capture.

`extract.dry_run=true` prints the disk estimate of the configured plan and stops (no merge
output, no model). A store that does not fit (`eagle3.extract.preflight.DiskSpaceError`), or a disk
that fills mid-run, ends the job with one line on stderr and exit code 4 (`eagle3.cli`); the rerun
resumes from the complete shards. `force=true` redoes
the unit's bookkeeping, not the stored tensors (they are shared; delete the store directory to
recompute them).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.draft.options import COMPUTING_MODES
from eagle3.extract.preflight import plan_report
from eagle3.extract.runner import UnitJob, run_extraction
from eagle3.extract.sources import extraction_batch_tokens, open_states
from eagle3.extract.summary import lost_samples, unit_summary
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.intake import Intake
from eagle3.stages.merge import MERGE
from eagle3.states import formats
from eagle3.states.store import StoreSpec
from eagle3.target_info import target_identity

if TYPE_CHECKING:
    import torch

    from eagle3.config.schema import Eagle3Config

log = logging.getLogger("eagle3")
FORMAT_VERSION = 1


def store_spec(config: Eagle3Config) -> StoreSpec:
    """The store identity this config extracts into (no model load, no data)."""
    m = config.model
    target = {**target_identity(m.path, m.revision, config.paths.hf_cache), "dtype": m.dtype}
    return StoreSpec(model=m.name, target=target,
                     capture_layers=tuple(int(i) for i in m.capture_layers),
                     storage_format=config.extract.storage_format, hidden_size=m.hidden_size,
                     source=config.extract.backend)


def store_dir(config: Eagle3Config) -> Path:
    return Path(config.extract.store_root).expanduser().resolve() / store_spec(config).dirname


def states_identity(config: Eagle3Config) -> dict[str, Any]:
    """What the hidden states are a function of, stored or not (online training fingerprints it)."""
    spec = store_spec(config)
    return {"backend": config.extract.backend, "target": spec.target, "capture_layers": list(spec.capture_layers),
            "text_config_key": config.model.text_config_key}


def _units(config: Eagle3Config) -> list[str]:
    # Online training computes states while it trains: there is nothing to store.
    return [] if config.train.hidden_states in COMPUTING_MODES else mixture_unit(config)


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    spec = store_spec(config)
    return {
        "backend": config.extract.backend,
        "target": spec.target,
        "text_config_key": config.model.text_config_key,
        "capture_layers": list(spec.capture_layers),
        "storage_format": spec.storage_format,
        **({"format_params": params} if (params := formats.format_params(spec.storage_format)) else {}),
        "shard": config.extract.shard,
        "num_shards": config.extract.num_shards,
        # Included although the store is keyed without it: on CPU fp32 the states of a sample
        # differ in the last bits (~1e-6 measured) between batch compositions, because GEMM and
        # attention kernels block differently per shape, so the budget does shape this unit's
        # results. The store stays shared across budgets on purpose: those differences are far
        # below the bf16/fp8 storage step, and re-extracting per budget would defeat reuse.
        "batch_tokens": extraction_batch_tokens(config.extract),
        "format": FORMAT_VERSION,
    }


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"merged": require(MERGE, config, ctx, unit)}


def teacher_head_loader(config: Eagle3Config) -> Callable[[], torch.Tensor]:
    """A picklable loader of the target lm_head (DataLoader workers and DDP ranks load their own)."""
    return functools.partial(_teacher_head, config)


def _teacher_head(config: Eagle3Config) -> torch.Tensor:
    """The target lm_head `[V, H]` for formats that store the teacher's top k."""
    from eagle3.target.weights import load_embedding_and_head

    m = config.model
    return load_embedding_and_head(m.path, revision=m.revision, cache_dir=config.paths.hf_cache,
                                   text_config_key=m.text_config_key)[1]


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    merged = _unit_inputs(config, ctx, unit)["merged"]
    ex = config.extract
    job = UnitJob(merged_dir=merged.directory, store_dir=store_dir(config), spec=store_spec(config), shard=ex.shard,
                  num_shards=ex.num_shards, batch_tokens=extraction_batch_tokens(ex),
                  vocab_size=config.model.vocab_size,
                  disk_margin_gb=ex.disk_margin_gb, assume_free_bytes=ex.assume_free_bytes,
                  open_source=lambda: open_states(config, ctx.run_dir),
                  teacher_head=teacher_head_loader(config))
    return unit_summary(job, out, run_extraction(job, out))


def dry_run(config: Eagle3Config) -> str:
    """The plan's disk estimate (printed by `extract.dry_run=true`)."""
    from eagle3.planning.forwards import dry_run_lines

    ex = config.extract
    return "\n".join([plan_report(model=config.model.name, hidden=config.model.hidden_size,
                       capture_layers=list(config.model.capture_layers), scale=config.data.scale,
                       eval_size=config.data.eval_size, tokens_per_sample=ex.assumed_tokens_per_sample,
                       store_dir=store_dir(config), margin_gb=ex.disk_margin_gb,
                       assume_free_bytes=ex.assume_free_bytes, num_shards=ex.num_shards),
                      *dry_run_lines(config)])


class ExtractStage(UnitStage):
    """UnitStage plus the dry run, and a complete unit redone when its store lost samples.

    A full disk is the entrypoint's one line and exit 4, as for every stage.
    """

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        if config.extract.dry_run:
            print(dry_run(config), flush=True)
            return []
        if not ctx.force and self._lost_states(config, ctx):
            # The unit's bookkeeping is redone; the store is content-keyed, so only what is gone is computed.
            ctx = dataclasses.replace(ctx, force=True)
        return super().__call__(config, ctx)

    def kept_nothing(self, counts: dict[str, Any]) -> bool:
        """Only a slot whose every sample was rejected stops: with extract.num_shards > 1 a small
        mixture may rightly leave a shard's slot without any sample."""
        return super().kept_nothing(counts) and bool(counts.get("in"))

    def _lost_states(self, config: Eagle3Config, ctx: StageContext) -> bool:
        """Whether a complete unit's samples are no longer all in the store (shards or the store deleted)."""
        lost_any = False
        for unit in self.units(config):
            where, manifest = self.locate(config, ctx, unit)
            lost = lost_samples(where, store_dir(config)) if manifest is not None else []
            if lost:
                log.warning("[extract] %s: complete, but %d of its samples are no longer in the store %s (e.g. %s); "
                            "extracting them again", unit, len(lost), store_dir(config), ", ".join(map(str, lost[:3])))
                lost_any = True
        return lost_any


EXTRACT = ExtractStage(
    name="extract",
    help="target hidden states (capture layers + final norm) into the shared content-keyed store",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("samples", "mixture", "Fix the merged samples or the extract options (model.vocab_size, "
                  "extract.*)"),
)
