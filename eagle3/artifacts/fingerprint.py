"""Content fingerprints of plain configuration data.

Output directories are named after a fingerprint of everything that affects them, so the
fingerprint must be a pure function of the *content*: dict key order, tuple-vs-list and
Path-vs-str must not matter, and nothing that differs between runs (object ids, memory
addresses in a repr) may leak in. That is why only plain Python data is accepted and
anything else is refused loudly with the key path where it was found, instead of being
hashed through ``str()`` (an OmegaConf node's repr, for instance, is not a stable
description of its content).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from pathlib import PurePath
from typing import Any

__all__ = ["canonical_json", "fingerprint", "to_plain"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _where(path: str) -> str:
    return path or "<root>"


def _unsupported(obj: Any, path: str) -> TypeError:
    cls = type(obj)
    qualname = f"{cls.__module__}.{cls.__qualname__}"
    msg = (
        f"cannot fingerprint a value of type {qualname} at {_where(path)}: only plain Python data "
        "(dict, list, tuple, set, str, int, float, bool, None, Path, Enum, dataclass) is supported"
    )
    if cls.__module__.startswith("omegaconf"):
        msg += "; convert the config first with OmegaConf.to_container(cfg, resolve=True)"
    elif cls.__module__.startswith(("numpy", "torch")):
        msg += "; convert it first with .item() or .tolist()"
    return TypeError(msg)


def to_plain(obj: Any, _path: str = "", _active: frozenset[int] = frozenset()) -> Any:
    """Normalise plain Python data into JSON-ready values with one canonical shape.

    Tuples become lists, ``Path`` becomes ``str``, dataclasses become dicts of their fields,
    enums become their values, sets become sorted lists, and integer dict keys become
    strings (as JSON would make them). Manifests store this form, so what is recorded is
    exactly what was fingerprinted.

    Args:
        obj: The data to normalise.

    Returns:
        A structure of dict/list/str/int/float/bool/None only.

    Raises:
        TypeError: For any other type, naming the key path (``train.optim.betas[1]``), or
            for dict keys that are not str/int or collide once stringified.
        ValueError: For a container that contains itself.
    """
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value, _path, _active)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, PurePath):
        return str(obj)

    is_dataclass_instance = dataclasses.is_dataclass(obj) and not isinstance(obj, type)
    if not isinstance(obj, (dict, list, tuple, set, frozenset)) and not is_dataclass_instance:
        raise _unsupported(obj, _path)

    if id(obj) in _active:
        raise ValueError(f"cannot fingerprint a container that contains itself (at {_where(_path)})")
    active = _active | {id(obj)}

    if is_dataclass_instance:
        return {f.name: to_plain(getattr(obj, f.name), _child(_path, f.name), active) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(
                    f"cannot fingerprint a dict key of type {type(key).__qualname__} ({key!r}) at {_where(_path)}: "
                    "keys must be str or int"
                )
            skey = str(key)
            if skey in out:
                raise TypeError(f"dict keys {key!r} and {skey!r} collide at {_where(_path)} once converted to JSON")
            out[skey] = to_plain(value, _child(_path, key), active)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_plain(value, _child(_path, i), active) for i, value in enumerate(obj)]
    # set / frozenset: order is arbitrary, so sort by each element's canonical encoding.
    items = [to_plain(value, f"{_where(_path)}{{...}}", active) for value in obj]
    return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")))


def canonical_json(obj: Any) -> str:
    """Serialise plain data to one canonical string (sorted keys, no whitespace).

    Floats are written by ``repr`` (shortest round-trip form), so ``0.1`` is always
    ``0.1`` and ``1.0`` stays distinct from ``1``.
    """
    return json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def fingerprint(obj: Any, length: int = 12) -> str:
    """Short hex sha256 of the canonical JSON of ``obj``.

    Twelve hex digits (48 bits) keep directory names readable while making an accidental
    collision between configs of one project vanishingly unlikely.

    Args:
        obj: Plain Python data (see :func:`to_plain`).
        length: Number of hex digits to keep (1..64).

    Returns:
        The lowercase hex prefix of the digest.
    """
    if not 1 <= length <= 64:
        raise ValueError(f"fingerprint length must be between 1 and 64, got {length}")
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:length]
