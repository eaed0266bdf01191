#!/usr/bin/env python
"""The one entrypoint: `python scripts/run.py stage=<name> [group=option] [key=value ...]`.

`stage=all` runs the chain; `-m` sweeps; `--cfg job` prints the composed config. The config
directory is found relative to this file, so the working directory does not matter.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import eagle3.config  # noqa: F401  (registers the schema and resolvers before composition)
from eagle3.cli import run_job


class JobFailed(RuntimeError):
    """A sweep job's failure: Hydra records it and runs the sweep's other jobs (sys.exit would not)."""


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    code = run_job(cfg)
    if code and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise JobFailed(f"exit code {code}; its error is above and in job.json of its run directory")
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
