"""Stage `generate`: regenerate every assistant turn of prompt-only sources through the target.

EAGLE-3 learns the *target's* next-token distribution, so answers written by another model are
replaced (docs/design.md, 'Two tracks'): each prompt-only conversation from prep is replayed user
turn by user turn against the backend `generate.backend` names, with the source's thinking mode.

The work is `eagle3.generation.pipeline.generate_file` (resumable by id, deterministic per batch,
several batches in flight over HTTP, batches an earlier output of the same source ran under the
same config copied instead of regenerated: `eagle3.generation.reuse`, `generate.reuse_earlier`).

Servers (`generate.backend=vllm|sglang`, the server node `generate.server`): with
`generate.server.urls=[...]` the stage talks to running servers; without, it launches the
configured one for the stage's duration (`GenerateStage`). `server` is not read here: it is the
engine that serves the draft (stages serve, bench).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import STATUS_COMPLETE, STATUS_RUNNING, Manifest, StageOutput
from eagle3.artifacts.locks import exclusive_lock
from eagle3.artifacts.stage_output import unit_lock_path
from eagle3.config.schema import Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.data.conversation import TRACK_PROMPT_ONLY
from eagle3.engines import ENGINES
from eagle3.generation.pipeline import generate_file
from eagle3.generation.reuse import EarlierGenerations
from eagle3.generation.types import RETRYABLE_REJECT_REASONS
from eagle3.stages.base import StageContext, UnitStage, require
from eagle3.stages.intake import Intake
from eagle3.stages.prep import (  # prep's output name is ours (tokenize reads either)
    CONVERSATIONS_FILE,
    PREP,
)
from eagle3.target_info import target_identity

# 2: one target identity (eagle3.target_info.target_identity), served settings;
# 3: each answer keeps the ids the target emitted (meta.generation.turns[k].token_ids);
# 4: the slice is the schema's fingerprint of `generate` (eagle3.config.slices).
FORMAT_VERSION = 4
GENERATE_NAME = "generate"

log = logging.getLogger("eagle3")


def _units(config: Eagle3Config) -> list[str]:
    return [name for name, src in config.dataset.sources.items() if src.track == TRACK_PROMPT_ONLY]


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    """What shapes the answers: the target, the source's thinking mode, and `generate` as its schema
    marks it (endpoints, concurrency, timeouts and retries are not keyed: a resumed run may use other
    ones; the request fields and how the engine serves the target -- dtype, parsers, context, its
    command line -- are)."""
    model = config.model
    return {
        "target": {**target_identity(model.path, model.revision, config.paths.hf_cache), "dtype": model.dtype},
        "thinking": config.dataset.sources[unit].thinking,
        "generate": fingerprinted(config.generate),
        "seed": config.data.seed,
        "format": FORMAT_VERSION,
    }


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"conversations": require(PREP, config, ctx, unit)}


def _earlier_outputs(config: Eagle3Config, ctx: StageContext, unit: str, out_dir: Path,
                     unit_slice: dict[str, Any]) -> Optional[EarlierGenerations]:
    """Earlier complete outputs of `unit` under `unit_slice` (None when reuse is off or there are none)."""
    if not config.generate.reuse_earlier:
        return None
    earlier = EarlierGenerations(ctx.root / GENERATE_NAME, unit, unit_slice, exclude=out_dir,
                                 input_name="conversations", file_name=CONVERSATIONS_FILE,
                                 batch_size=config.generate.batch_size)
    return earlier or None


def copyable_conversations(config: Eagle3Config, ctx: StageContext, unit: str) -> int:
    """Conversations of a unit not generated yet that a run would copy from earlier outputs.

    For `stage=plan`; raises MissingInput while prep has not run (as `locate` does).
    """
    where, manifest = GENERATE.locate(config, ctx, unit)
    earlier = None if manifest else _earlier_outputs(config, ctx, unit, where, _unit_config(config, unit))
    if earlier is None:
        return 0
    prep = _unit_inputs(config, ctx, unit)["conversations"]
    return earlier.copyable(prep.directory / CONVERSATIONS_FILE, config.generate.batch_size)


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    prep = _unit_inputs(config, ctx, unit)["conversations"]
    earlier = _earlier_outputs(config, ctx, unit, out.dir, out.config)
    if earlier:
        log.info("[generate] %s: batches that %d earlier output(s) ran under this config are reused: %s",
                 unit, len(earlier.dirs), ", ".join(str(d) for d in earlier.dirs))
    return generate_file(config, unit, prep.directory / CONVERSATIONS_FILE, out, CONVERSATIONS_FILE,
                         total=prep.counts.get("out"), earlier=earlier)


@dataclass(frozen=True)
class GenerateStage(UnitStage):
    """`generate`, launching `generate.server` itself when no `generate.server.urls` are given.

    With `generate.backend=vllm|sglang` and no URLs, the target is served (on 127.0.0.1, log in
    the run directory) once for all units of the stage, only when some unit still has work, and
    stopped afterwards -- also on error or Ctrl-C. It serves the target alone unless
    `generate.server.speculative.draft_path` names a draft (speculation does not change what is
    sampled, only how fast). The launcher reads `server`, so it gets a copy of the config whose
    `server` is `generate.server` (`eagle3.serving.commands.launch_config`, as extract's server);
    the units then run with a config whose `generate.server.urls` are the launched server's.
    """

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        if not ctx.force:
            for unit in self.units(config):
                self._reopen_holes(config, ctx, unit)
        server = config.generate.server
        if config.generate.backend not in ENGINES or server.urls or not self._has_work(config, ctx):
            return super().__call__(config, ctx)
        from eagle3.serving.commands import launch_config
        from eagle3.serving.process import server_endpoints

        launch = launch_config(config, "generate.server", speculative=server.speculative.draft_path is not None)
        log.info("generate: launching %s for %s (log in %s)", server.backend, config.model.path, ctx.run_dir)
        with server_endpoints(launch, ctx.run_dir) as urls:
            connected = copy.deepcopy(config)  # the urls are not keyed: the units stay where they are
            connected.generate.server.urls = list(urls)
            return super().__call__(connected, ctx)

    def _reopen_holes(self, config: Eagle3Config, ctx: StageContext, unit: str) -> None:
        """Take a complete unit an earlier version finished with `request_failed` rejects back to running.

        Those versions counted a conversation whose requests failed during an outage as done, so
        the unit lacks it; reopened, this run retries exactly those conversations (the pipeline
        takes their rejects back) and finalizes the unit as an uninterrupted run would have.
        """
        where, manifest = self.locate(config, ctx, unit)
        if manifest is None:
            return
        holes = sum(n for reason, n in (manifest.counts.get("rejected") or {}).items()
                    if reason in RETRYABLE_REJECT_REASONS)
        if not holes:
            return
        lock = exclusive_lock(unit_lock_path(ctx.root, self.name, where.name),
                              waiting=f"{where} is in use by another run; waiting for it to finish")
        try:
            current = Manifest.load(where)  # as another job may have left it meanwhile
            if current.status == STATUS_COMPLETE:
                current.status, current.completed_at = STATUS_RUNNING, None
                current.write(where)
                log.warning("[generate] %s: %s holds %d conversation(s) an earlier version rejected as %s during an "
                            "outage; reopened to retry them", unit, where, holes,
                            "/".join(sorted(RETRYABLE_REJECT_REASONS)))
        finally:
            lock.release()

    def _has_work(self, config: Eagle3Config, ctx: StageContext) -> bool:
        """Whether some unit needs the model: not complete, and not all copied from earlier outputs."""
        for unit in self.units(config):
            where, manifest = self.locate(config, ctx, unit)
            if manifest is not None and not ctx.force:
                continue
            earlier = _earlier_outputs(config, ctx, unit, where, self.unit_config(config, unit))
            prep = self.unit_inputs(config, ctx, unit)["conversations"]
            if earlier is None or not earlier.covers(prep.directory / CONVERSATIONS_FILE,
                                                     config.generate.batch_size):
                return True
        return False


GENERATE = GenerateStage(
    name=GENERATE_NAME,
    help="regenerate prompt-only conversations through the target (every assistant turn)",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("conversations", "source", "Fix the prompts or the generate options (generate.*, the server)"),
)
