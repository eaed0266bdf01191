"""The Hydra callbacks that refuse a job before Hydra writes a file (registered in conf/config.yaml).

`RefuseSecrets`: a secret in the config. `RefuseUnwritableRoot`: a `paths.root` that is a file, read
only, or on a full disk (Hydra would fail creating the run directory under it, with a traceback).

Hydra copies the composed config and the overrides into `<run dir>/.hydra/` (and a sweep names job
directories after the overrides) before the task function -- and before `on_job_start` -- runs, so
config validation in `eagle3.cli` comes too late for secrets. `on_run_start` and
`on_multirun_start` run before the run or sweep directory exists: this callback checks there the
composed config, every override (a sweep's values one by one, `hydra.sweeper.params` too) and
`hydra.job.env_set` (copied into hydra.yaml), and exits 2 with eagle3's one-line errors.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from eagle3.config.checks import ConfigErrors, report_config_errors
from eagle3.config.convert import config_dict
from eagle3.config.secrets import Finding, find_secrets, find_secrets_in_overrides
from eagle3.errors import EXIT_CONFIG_ERROR, EXIT_NO_SPACE


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
        overrides += [f"{k}={v}" for k, v in config_dict(params, resolve=False).items()]
    found += [f for f in find_secrets_in_overrides([str(o) for o in overrides]) if f.key not in {x.key for x in found}]
    env_set = OmegaConf.select(hydra, "job.env_set")
    if env_set:
        found += find_secrets(OmegaConf.to_container(env_set, resolve=False), "hydra.job.env_set")
    return found


def refuse_secrets(findings: list[Finding]) -> None:
    """Print eagle3's config-error lines for `findings` and exit 2 (nothing when there are none)."""
    if not findings:
        return
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


def root_problem(root: Path) -> tuple[int, str] | None:
    """Why artifacts cannot be written under `root`, as `(exit code, line)`, or None when they can.

    Tried, not inferred from permission bits: root may write a read-only directory, and no bit tells
    a read-only mount or a full disk. The directory is created (Hydra would create it anyway) and a
    temporary file written and removed in it.
    """
    key = "paths.root"
    if root.exists() and not root.is_dir():
        return EXIT_CONFIG_ERROR, f"{key}: '{root}' -- is a file, not a directory; valid: a writable directory " \
                                  "(created when missing)"
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".eagle3-write-check-", dir=root)
        try:
            os.write(fd, b"eagle3")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return EXIT_NO_SPACE, f"eagle3: no space left on device under paths.root={root}; free space and rerun"
        return EXIT_CONFIG_ERROR, f"{key}: '{root}' -- cannot be written ({exc.strerror}: {exc.filename or root}); " \
                                  "valid: a directory this user can write, on a writable filesystem"
    return None


class RefuseUnwritableRoot(Callback):
    """Exit in one line before Hydra creates the run (or sweep) directory under an unusable `paths.root`."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_root(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_root(config)


def _check_root(config: DictConfig) -> None:
    try:
        root = Path(str(OmegaConf.select(config, "paths.root"))).expanduser().resolve()
    except Exception:  # noqa: BLE001 - an unresolvable root is reported by validation, with its key
        return
    problem = root_problem(root)
    if problem is None:
        return
    code, line = problem
    if code == EXIT_CONFIG_ERROR:
        report_config_errors([line])
    else:
        print(line, file=sys.stderr)
    sys.exit(code)
