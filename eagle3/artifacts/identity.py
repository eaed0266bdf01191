"""What names a stage output: its directory components, its complete inputs and its fingerprint.

The fingerprint covers everything that affects an output -- stage, unit name, the plain config
slice, the fingerprints of its inputs and the on-disk format version -- so different configs
never overwrite each other and identical work is found and reused (docs/design.md, 'Stage contract').
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3.artifacts.fingerprint import fingerprint, to_plain
from eagle3.artifacts.manifest import STATUS_COMPLETE, Manifest

__all__ = ["output_identity"]

_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@,\-]*$")


def _check_component(kind: str, value: str) -> str:
    # These become directory names, and force=True deletes such a directory: refuse
    # anything that could escape the stage folder or hide as a dotfile.
    if not isinstance(value, str) or not _COMPONENT.match(value) or len(value) > 150:
        raise ValueError(
            f"{kind} {value!r} is not a safe directory name: use letters, digits and _.+=@,- "
            "(not starting with '.' or '-', at most 150 characters)"
        )
    return value


def _resolve_input(key: str, value: Manifest | str | os.PathLike[str]) -> dict[str, Any]:
    manifest = value if isinstance(value, Manifest) else Manifest.load(Path(value))
    if manifest.status != STATUS_COMPLETE:
        where = manifest.dir if manifest.dir is not None else f"{manifest.stage}/{manifest.name}"
        raise ValueError(
            f"input {key!r} ({where}) is not complete (status={manifest.status!r}); run its stage first"
        )
    return {"path": str(manifest.dir) if manifest.dir is not None else None, "fingerprint": manifest.fingerprint}


def output_identity(stage: str, name: str, config: Mapping[str, Any],
                    inputs: Mapping[str, Manifest | str | os.PathLike[str]] | None,
                    format_version: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str]:
    """`(plain config, inputs as {"path", "fingerprint"}, fingerprint)` of one output, without disk writes.

    Raises:
        TypeError: `config` is not a mapping of plain data (the message names the key path).
        ValueError: An unsafe stage or unit name, or an input that is not complete.
    """
    _check_component("stage", stage)
    _check_component("name", name)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping of plain data, got {type(config).__name__}")
    plain_config = to_plain(dict(config), "config")
    resolved = {str(k): _resolve_input(str(k), v) for k, v in sorted((inputs or {}).items())}
    fp = fingerprint({
        "stage": stage,
        "name": name,
        "config": plain_config,
        "inputs": {k: v["fingerprint"] for k, v in resolved.items()},
        "format_version": format_version,
    })
    return plain_config, resolved, fp
