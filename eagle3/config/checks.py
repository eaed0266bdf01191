"""The collector every config rule writes into: one line `key: value -- why; valid: ...` each.

A leaf (no eagle3 imports), so the rules can live beside what they check (a `rules` module in the
package that acts on them; each field's own choices and range in `eagle3.config.fields`;
`eagle3.config.validate` keeps the generic ones) and all report in the same shape, at once;
`report_config_errors` prints them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Optional

from omegaconf import OmegaConf


def _plain(value: Any) -> Any:
    """A schema dataclass (inside a list or dict too) as JSON would show it; anything else unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def format_value(value: Any) -> str:
    """A config value as the error line shows it (strings quoted, containers as JSON)."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=False)
    return json.dumps(value, default=_plain) if not isinstance(value, str) else repr(value)


def value_at(node: Any, dotted: str) -> Any:
    """The value under a dotted key (`draft.fc_norm`) of a schema dataclass, for naming it in an error."""
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def field_values(node: Any) -> dict[str, Any]:
    """A schema dataclass's fields by name, one level deep (`server.kernels` -> {name: value})."""
    return {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}


class ConfigErrors:
    """Accumulates rule violations; `lines` holds one line each, in the order found."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, key: str, value: Any, why: str, valid: Optional[str] = None) -> None:
        line = f"{key}: {format_value(value)} -- {why}"
        if valid:
            line += f"; valid: {valid}"
        self.lines.append(line)

    def positive(self, key: str, value: Any, allow_none: bool = False) -> None:
        if value is None and allow_none:
            return
        if value is None or value <= 0:
            self.add(key, value, "must be a positive number", "> 0")


def report_config_errors(errors: list[str]) -> None:
    """One line per error on stderr, no traceback: the user fixes the config, not the code."""
    noun = "error" if len(errors) == 1 else "errors"
    print(f"eagle3: config has {len(errors)} {noun}:", file=sys.stderr)
    for line in errors:
        print(f"  {line}", file=sys.stderr)
