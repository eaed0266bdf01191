"""The Hydra callback that refuses secrets before Hydra writes a file (registered in conf/config.yaml).

Hydra copies the composed config and the overrides into `<run dir>/.hydra/` (and a sweep names job
directories after the overrides) before the task function -- and before `on_job_start` -- runs, so
config validation in `eagle3.cli` comes too late for secrets. `on_run_start` and
`on_multirun_start` run before the run or sweep directory exists: this callback checks there the
composed config, every override (a sweep's values one by one, `hydra.sweeper.params` too) and
`hydra.job.env_set` (copied into hydra.yaml), and exits 2 with eagle3's one-line errors.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from eagle3.config.secrets import Finding, find_secrets, find_secrets_in_overrides


def secret_findings(config: DictConfig) -> list[Finding]:
    """Every secret in a composed config (with its `hydra` node) that Hydra would write to disk."""
    task = {k: v for k, v in config.items() if k != "hydra"} if "hydra" in config else config
    try:
        plain = OmegaConf.to_container(OmegaConf.create(task), resolve=True)
    except Exception:  # ${hydra:...} cannot resolve before the job starts: check what is written
        plain = OmegaConf.to_container(OmegaConf.create(task), resolve=False)
    found = find_secrets(plain)
    hydra = config.get("hydra")
    if hydra is None:
        return found
    overrides = [*(OmegaConf.select(hydra, "overrides.task") or []),
                 *(OmegaConf.select(hydra, "overrides.hydra") or [])]
    params = OmegaConf.select(hydra, "sweeper.params")
    if params:
        overrides += [f"{k}={v}" for k, v in OmegaConf.to_container(params, resolve=False).items()]
    found += [f for f in find_secrets_in_overrides([str(o) for o in overrides]) if f.key not in {x.key for x in found}]
    env_set = OmegaConf.select(hydra, "job.env_set")
    if env_set:
        found += find_secrets(OmegaConf.to_container(env_set, resolve=False), "hydra.job.env_set")
    return found


def refuse_secrets(findings: list[Finding]) -> None:
    """Print eagle3's config-error lines for `findings` and exit 2 (nothing when there are none)."""
    if not findings:
        return
    from eagle3.cli import EXIT_CONFIG_ERROR, report_config_errors
    from eagle3.config.checks import ConfigErrors

    err = ConfigErrors()
    for f in findings:
        err.add(f.key, f.shown, f.why, f.valid)
    report_config_errors(err.lines)
    sys.exit(EXIT_CONFIG_ERROR)


class RefuseSecrets(Callback):
    """Exit 2 before the run (or sweep) directory exists when the config or an override holds a secret."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config)


def _check(config: DictConfig) -> None:
    # Hydra turns a callback's exception into a warning and goes on writing: fail closed instead.
    try:
        findings = secret_findings(config)
    except Exception as exc:
        # The message is not shown: it could quote the secret.
        findings = [Finding("config", "<unchecked>", f"could not be checked for secrets ({type(exc).__name__}), "
                            "so nothing was written",
                            "the config without the override that breaks the check (and report the bug)")]
    refuse_secrets(findings)
