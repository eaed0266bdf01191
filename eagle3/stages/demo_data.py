"""Stage `demo_data`: write the built-in demo datasets as raw files in their real schemas.

The demo sets are generated, not downloaded, so that every stage after this one reads them
exactly as it would read a hub or local dataset: `demo_prompts` in ShareGPT form (foreign
answers, prompt-only track) and `demo_native` in OpenAI `messages` form (answers sampled from
the demo target, target-native track). Only sources with a `generator` are handled here.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput, file_sha256, log_summary, progress
from eagle3.paths import asset_path
from eagle3.stages.base import StageContext

log = logging.getLogger("eagle3")

STAGE = "demo_data"
DATA_FILE = "data.jsonl"
DEMO_TARGET = "demo_target"


def _target_fingerprint() -> str:
    """Hash of the demo target's weights: demo_native answers change when the target does."""
    return file_sha256(asset_path(DEMO_TARGET) / "model.safetensors")[:16]


def _records(generator: str, num_samples: int, seed: int, done: set) -> Iterator[dict[str, Any]]:
    # Imported here: generating demo_native loads torch and the target, which config-only
    # commands (validation, --cfg) should not pay for.
    from eagle3.demo import datasets

    if generator == "demo_prompts":
        return datasets.demo_prompts_records(num_samples, seed)
    return datasets.demo_native_records(
        num_samples, seed, asset_path(DEMO_TARGET), skip_ids=done
    )


def _unit_config(src: DictConfig, seed: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "generator": src.generator,
        "schema": src.schema,
        "track": src.track,
        "num_samples": src.num_samples,
        "seed": seed,
    }
    if src.generator == "demo_native":
        config["target"] = _target_fingerprint()
    return config


def _materialise(name: str, src: DictConfig, seed: int, ctx: StageContext) -> Manifest:
    out = StageOutput.open(ctx.root, STAGE, name, _unit_config(src, seed), force=ctx.force)
    if out.complete:
        log.info("%s: complete, reusing %s (force=true to redo)", name, out.dir)
        return out.manifest
    records = out.records(DATA_FILE)
    total = src.num_samples
    stream = _records(src.generator, total, seed, set(out.done_ids))
    for record in progress(stream, total=total, desc=f"{STAGE} {name}"):
        out.count_in()
        if out.is_done(record["id"]):
            continue
        reject_reason = record.pop("reject_reason", None)
        if reject_reason:
            out.reject(record["id"], reject_reason, record.pop("reject_detail", None))
        else:
            records.write(record)
    return out.finalize(extra={"schema": src.schema, "track": src.track, "file": DATA_FILE})


def run_demo_data(cfg: DictConfig, ctx: StageContext) -> list[Manifest]:
    """Materialise every generator-backed source of `cfg.dataset`."""
    manifests = []
    for name, src in cfg.dataset.sources.items():
        if src.generator is None:
            continue
        manifest = _materialise(name, src, cfg.data.seed, ctx)
        log_summary(manifest)
        manifests.append(manifest)
    if not manifests:
        log.info("dataset=%s has no generated sources; nothing to do", cfg.dataset.name)
    return manifests
