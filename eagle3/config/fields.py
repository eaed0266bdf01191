"""What the schema says of a field besides its type and default: which outputs it keys, and what is valid.

Two kinds of metadata, set by the same constructors so a field is declared in one line:

- its **slice mark** (`speed_field`, `run_field`, `use_field`; unmarked = `setting`): which stage
  outputs the field keys (`eagle3.config.slices.fingerprinted` reads it);
- its **constraint**: `choices` (a `Literal` of `eagle3.config.choices`, or a tuple) or a range
  (`gt`, `ge`, `lt`, `le`), with the `why` and `valid` an error line shows when the defaults would
  say too little. `check_fields` derives every single-field check from these, over the whole typed
  config, so a `rules` module keeps only the rules that read two fields or the world (files, servers).

OmegaConf types a field by its annotation and cannot take a `Literal`, so a choice field is a `str`
whose constraint carries its choices; a value outside them is reported with every other mistake
at validation (Hydra would stop at the first).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Optional

from eagle3.config.checks import ConfigErrors

__all__ = ["Constraint", "check_fields", "run_field", "setting", "speed_field", "use_field"]

#: The metadata keys: the slice mark ("speed" | "run" | "use") and the constraint.
SLICE_MARK, CONSTRAINT = "fingerprint", "constraint"
SPEED, RUN, USE = "speed", "run", "use"


@dataclass(frozen=True)
class Constraint:
    """The valid values of one field: a choice among `choices`, or a number within the bounds.

    `None` passes when the field's annotation is Optional (the schema's `null = ...` meaning).
    """

    choices: tuple[Any, ...] = ()
    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    why: Optional[str] = None  # the error's reason; None = derived from the bounds
    valid: Optional[str] = None  # what the error calls valid; None = derived (`> 0`, `(0, 1]`)

    def holds(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def reason(self) -> str:
        if self.why:
            return self.why
        if self.choices:
            return "not a known choice"
        if self.gt == 0 and self.ge is self.lt is self.le is None:
            return "must be a positive number"
        if self.ge == 0 and self.gt is self.lt is self.le is None:
            return "cannot be negative"
        return "out of range"

    def valid_text(self, optional: bool) -> str:
        if self.valid:
            return self.valid
        if self.choices:
            return ", ".join(str(c) for c in self.choices) + (", null" if optional else "")
        low = ("(", self.gt) if self.gt is not None else ("[", self.ge) if self.ge is not None else None
        high = (")", self.lt) if self.lt is not None else ("]", self.le) if self.le is not None else None
        if low and high:  # an interval: (0, 1]
            return f"{low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
        if low:
            return (">" if low[0] == "(" else ">=") + f" {_number(low[1])}"
        return ("<" if high and high[0] == ")" else "<=") + f" {_number(high[1] if high else None)}"


def _number(value: Optional[float]) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


def _constraint(choices: Any, gt: Optional[float], ge: Optional[float], lt: Optional[float], le: Optional[float],
                why: Optional[str], valid: Optional[str]) -> Optional[Constraint]:
    if choices is not None:
        names = typing.get_args(choices) if typing.get_origin(choices) is typing.Literal else tuple(choices)
        return Constraint(choices=names, why=why, valid=valid)
    if gt is ge is lt is le is None:
        return None
    return Constraint(gt=gt, ge=ge, lt=lt, le=le, why=why, valid=valid)


def _field(mark: Optional[str], default: Any, default_factory: Any, choices: Any = None, *,
           gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
           le: Optional[float] = None, why: Optional[str] = None, valid: Optional[str] = None) -> Any:
    metadata: dict[str, Any] = {}
    if mark is not None:
        metadata[SLICE_MARK] = mark
    constraint = _constraint(choices, gt, ge, lt, le, why, valid)
    if constraint is not None:
        metadata[CONSTRAINT] = constraint
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def setting(default: Any = dataclasses.MISSING, choices: Any = None, *,
            default_factory: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """A field that shapes what its node produces (it keys the outputs), with its valid values."""
    return _field(None, default, default_factory, choices, **bounds)


def speed_field(default: Any = dataclasses.MISSING, choices: Any = None, *,
                default_factory: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """A field that changes how fast a node works, not what it produces."""
    return _field(SPEED, default, default_factory, choices, **bounds)


def run_field(default: Any = dataclasses.MISSING, choices: Any = None, *,
              default_factory: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """A field that says where a job runs or how it is watched: no output is keyed by it."""
    return _field(RUN, default, default_factory, choices, **bounds)


def use_field(default: Any = dataclasses.MISSING, choices: Any = None, *,
              default_factory: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """A source's field that another stage acts on (and keys its own output by)."""
    return _field(USE, default, default_factory, choices, **bounds)


def _is_optional(f: dataclasses.Field) -> bool:
    """Whether the schema lets the field be null (annotations are strings here: `from __future__`)."""
    annotation = str(f.type)
    return annotation.startswith("Optional[") or "None" in (part.strip() for part in annotation.split("|"))


def check_fields(node: Any, err: ConfigErrors, key: str = "", derived: Collection[str] = ()) -> None:
    """One error line per field of the typed config (dicts and lists of nodes included) outside its constraint.

    Args:
        derived: Keys whose value the YAML interpolates from another key (`generate.server.backend`
            follows `generate.backend`): a bad value is reported once, under the key it came from.
    """
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            where = f"{key}.{f.name}" if key else f.name
            constraint: Optional[Constraint] = f.metadata.get(CONSTRAINT)
            optional = _is_optional(f)
            if constraint is not None and where not in derived and not (value is None and optional) \
                    and not constraint.holds(value):
                err.add(where, value, constraint.reason(), constraint.valid_text(optional))
            check_fields(value, err, where, derived)
    elif isinstance(node, dict):
        for name, child in node.items():
            check_fields(child, err, f"{key}.{name}", derived)
    elif isinstance(node, list):
        for i, child in enumerate(node):
            check_fields(child, err, f"{key}[{i}]", derived)
