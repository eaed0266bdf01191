"""The record every job leaves in its run directory (`job.json`), and reading its overrides back.

`eagle3.cli` writes it when a job starts and after each stage; `stage=report` and the sweep
callback find a sweep's jobs from these files, not from a tracking service.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import atomic_write_json
from eagle3.config.secrets import redact, redact_overrides

__all__ = ["JOB_FILE", "JOB_FORMAT", "parse_overrides", "read_job_record", "write_job_record"]

JOB_FILE = "job.json"
JOB_FORMAT = 1
DELETED = "(deleted)"  # the value shown for a `~key` override


def write_job_record(run_dir: Path, record: dict[str, Any]) -> None:
    """`run_dir/job.json`, atomically (a killed job leaves the previous state, never half a file).

    Anything secret-shaped is redacted (`eagle3.config.secrets.redact`): the entrypoint refuses secrets
    before a job starts, but a failure message can still quote a URL or a server's command line.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(record.get("overrides"), list):  # keep them readable by `parse_overrides`
        record = {**record, "overrides": redact_overrides(record["overrides"])}
    atomic_write_json(run_dir / JOB_FILE, redact(record))


def read_job_record(job_dir: Path) -> Optional[dict[str, Any]]:
    """The job's record, or None when it has none (or an unreadable one)."""
    try:
        data = json.loads((Path(job_dir) / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def parse_overrides(overrides: Iterable[str]) -> dict[str, str]:
    """A job's command-line overrides as `key -> value`, parsed by Hydra's own override grammar.

    `+key=v` and `++key=v` give `key`; `~key` gives `key -> "(deleted)"`; a group override with a
    package (`db@backup=mysql`) gives `db@backup`; quoted values lose their quotes. An override the
    grammar cannot read (none should reach a job record) is kept whole as a key with no value.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed: dict[str, str] = {}
    for item in overrides or []:
        try:
            (override,) = parser.parse_overrides([str(item)])
        except OverrideParseException:
            parsed[str(item)] = ""
            continue
        key = override.key_or_group + (f"@{override.package}" if override.package else "")
        if override.is_delete():
            parsed[key] = DELETED
        else:
            value = override.value()
            parsed[key] = value if isinstance(value, str) else override.get_value_element_as_str()
    return parsed
