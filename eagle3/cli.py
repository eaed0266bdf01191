"""The job behind `scripts/run.py`: validate the composed config, then run the chosen stages."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from eagle3.config import validate_config
from eagle3.errors import Eagle3Error
from eagle3.stages import StageContext, stage_names, stages_to_run
from eagle3.tracking import finish_job

log = logging.getLogger("eagle3")

EXIT_CONFIG_ERROR = 2
EXIT_STAGE_ERROR = 3  # a missing input or an unavailable backend


def report_config_errors(errors: list[str]) -> None:
    """One line per error on stderr, no traceback: the user fixes the config, not the code."""
    noun = "error" if len(errors) == 1 else "errors"
    print(f"eagle3: config has {len(errors)} {noun}:", file=sys.stderr)
    for line in errors:
        print(f"  {line}", file=sys.stderr)


def run_job(cfg: DictConfig) -> int:
    """Run one Hydra job; returns the process exit code."""
    errors = validate_config(cfg, stage_names())
    if errors:
        report_config_errors(errors)
        return EXIT_CONFIG_ERROR

    root = Path(cfg.paths.root).expanduser().resolve()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    ctx = StageContext(root=root, run_dir=run_dir, force=bool(cfg.force))
    started = time.perf_counter()
    outputs: list[Path] = []
    try:
        for stage in stages_to_run(cfg.stage):
            log.info("stage %s: %s", stage.name, stage.help)
            try:
                manifests = stage(cfg, ctx)
            except Eagle3Error as exc:
                print(f"eagle3: {exc}", file=sys.stderr)
                return EXIT_STAGE_ERROR
            outputs.extend(Path(m.dir) for m in manifests)
    finally:
        finish_job()  # one W&B run per job: closed here, also when a stage failed
    log.info("done in %.1f s; artifacts under %s", time.perf_counter() - started, root)
    for out in outputs:
        log.info("  %s", out)
    log.info("run log and config: %s", run_dir)
    return 0
