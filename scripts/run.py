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
from eagle3.config.callbacks import refuse_secrets
from eagle3.config.secrets import find_secrets_in_overrides
from eagle3.paths import CONF_DIR


class JobFailed(RuntimeError):
    """A sweep job's failure: Hydra records it and runs the sweep's other jobs (sys.exit would not)."""


# An absolute config directory: the same whether this file runs as a script or is loaded as a module.
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    code = run_job(cfg)
    if code and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise JobFailed(f"exit code {code}; its error is above and in job.json of its run directory")
    if code:
        sys.exit(code)


def refuse_secret_overrides(argv: list[str]) -> None:
    """Exit 2 when a command-line override holds a secret, before Hydra (its logs, .hydra/, job dirs) sees it.

    The `RefuseSecrets` callback of conf/config.yaml checks the composed config too; this also holds
    when that callback is switched off.
    """
    overrides = [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    refuse_secrets(find_secrets_in_overrides(overrides))


if __name__ == "__main__":
    refuse_secret_overrides(sys.argv[1:])
    main()
