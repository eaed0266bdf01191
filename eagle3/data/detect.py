"""`dataset.files`: local files as a dataset in one line, each file's schema told by its first records.

A file fits a schema when its first records have the columns that schema's adapter cannot do
without (`Adapter.required`, plus one of its `marks` where two schemas share columns), so the
rules are the adapters' own declarations and a new adapter is detected with no change here. A
column named after the adapter's key instead of its default (`prompt`/`response` for
opencodeinstruct's `input`/`output`) fits too, as a column remap. When one schema's columns
contain another's (DeepSWE trajectories are OpenAI `messages` with a SWE task id) the more
specific wins; two schemas that fit side by side, or none, is an error naming the file and its
keys: guessing would map every record wrong, and the fix (`dataset.schema=...`) is one word.
A record that fits no schema at all (`"messages": null`, a missing column) is a broken record,
not evidence about the file: it is left out of the decision (unless no record fits anything), and
prep rejects it, just as it rejects the same record further down the file.

`files_sources` is what the list stands for: ordinary sources (one per file, named after it).
`with_file_sources` puts them in the typed config when it is validated (`eagle3.cli.job_config`),
before the rules read it, so every rule and stage sees plain sources, fingerprinted as listed ones.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, cast

from eagle3.config.checks import ConfigErrors
from eagle3.config.choices import TRACKS
from eagle3.config.schema import DatasetConfig, DatasetSourceConfig, Eagle3Config
from eagle3.data.adapters import ADAPTERS, Adapter
from eagle3.data.loading import SUPPORTED_SUFFIXES, UnreadableDataFile, file_kind, head_records
from eagle3.errors import Eagle3Error

log = logging.getLogger("eagle3")

#: Records read from the start of a file to tell its schema (never the whole file).
DETECT_RECORDS = 8
_KEYS_SHOWN = 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_NAME_MAX = 100


class SchemaError(Eagle3Error, ValueError):
    """A file's schema cannot be told, or it lacks the columns of the schema it was given.

    Attributes:
        path: The file.
        why: What is wrong (the keys its first records have included).
        valid: What to do instead.
    """

    def __init__(self, path: str, why: str, valid: str) -> None:
        super().__init__(f"{path}: {why}; valid: {valid}")
        self.path, self.why, self.valid = path, why, valid


@dataclass(frozen=True)
class Detection:
    """A file's schema, the column remap it needs (adapter key -> column), and the keys seen."""

    schema: str
    columns: dict[str, str] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


def _rule(adapter: Adapter) -> str:
    """What detection looks for, as the error shows it (`messages+instance_id`)."""
    need = "+".join(adapter.columns[k] for k in adapter.required)
    alias = "+".join(adapter.required)
    text = need if alias == need else f"{need} (or {alias})"
    return text + (f"+{'|'.join(adapter.marks)}" if adapter.marks else "")


def _fit(adapter: Adapter, record: dict, columns: Optional[dict]) -> Optional[tuple[dict, frozenset]]:
    """`(column remap, columns matched)` when `record` has what `adapter` needs, else None.

    With explicit `columns` only those names count; otherwise a required key is found under its
    default column or, failing that, under the key's own name (a remap).
    """
    present = {k for k, v in record.items() if v is not None}  # parquet writes absent columns as null
    remap, matched = {}, set()
    for key in adapter.required:
        name = (columns or {}).get(key, adapter.columns[key])
        if name not in present and columns is None and key in present:
            remap[key] = name = key
        if name not in present:
            return None
        matched.add(name)
    if adapter.marks and columns is None:
        marks = present & set(adapter.marks)
        if not marks:
            return None
        matched |= marks
    return remap, frozenset(matched)


def _head(path: str, n: int) -> tuple[list[dict], tuple[str, ...]]:
    """The readable records among the first `n` of `path`, and the keys they have (sorted)."""
    try:
        items = head_records(path, n)
    except UnreadableDataFile as exc:  # a gzip that is not, or cut short before its first record
        raise SchemaError(path, exc.why, exc.todo) from None
    except (OSError, ValueError) as exc:  # a parquet that is not, bad UTF-8 in a JSON array
        raise SchemaError(path, f"cannot be read ({str(exc).splitlines()[0]})",
                          "a .jsonl, .json or .parquet file of records") from None
    if not items:
        raise SchemaError(path, "the file has no records", "a file with at least one record")
    rows = [item.record for item in items if item.record is not None]
    if not rows:
        raise SchemaError(path, f"none of its first records is readable ({items[0].error})",
                          "JSON objects, one a line (or a JSON array of them, or parquet rows)")
    keys = sorted({str(k) for row in rows for k in row})
    return rows, tuple(keys)


def _shown(keys: tuple[str, ...]) -> str:
    more = len(keys) - _KEYS_SHOWN
    return ", ".join(keys[:_KEYS_SHOWN]) + (f", ... ({more} more)" if more > 0 else "")


def _fit_all(adapter: Adapter, rows: list[dict], columns: Optional[dict]) -> Optional[tuple[dict, frozenset]]:
    """The fit shared by every row (the same remap in each), else None."""
    fits = [_fit(adapter, row, columns) for row in rows]
    found = [f for f in fits if f is not None]
    if len(found) < len(fits) or len({tuple(sorted(f[0].items())) for f in found}) != 1:
        return None
    return found[0][0], frozenset().union(*(f[1] for f in found))


def _fitting(rows: list[dict]) -> list[dict]:
    """The rows some schema fits; all of `rows` when none fits any (the error then names their keys)."""
    fitting = [row for row in rows if any(_fit(a, row, None) is not None for a in ADAPTERS.values())]
    return fitting or rows


def detect_schema(path: str | os.PathLike[str], n: int = DETECT_RECORDS) -> Detection:
    """The schema of a local data file, from its first `n` records (unreadable ones skipped).

    Records no schema fits (a null or absent required column) are skipped too: they will be
    prep rejects whatever the schema, so they cannot tell it.

    Raises:
        SchemaError: The file is empty or unreadable, no schema fits it, or two fit and neither
            is more specific (the message names the file, its keys and the valid schemas).
    """
    path = str(path)
    rows, keys = _head(path, n)
    rows = _fitting(rows)
    fits = {name: fit for name, a in ADAPTERS.items() if (fit := _fit_all(a, rows, None)) is not None}
    # A schema whose matched columns strictly contain another's is the more specific reading.
    best = [s for s, (_, cols) in fits.items() if not any(cols < other for _, other in fits.values())]
    choices = ", ".join(ADAPTERS)
    if not best:
        rules = "; ".join(f"{s}: {_rule(a)}" for s, a in ADAPTERS.items())
        raise SchemaError(path, f"no schema's columns are all in its first records (keys: {_shown(keys)}); "
                          f"detection looks for {rules}",
                          f"dataset.schema=<one of {choices}> (with +dataset.columns.<key>=<column> for renamed "
                          "columns)")
    if len(best) > 1:
        found = " and ".join(f"{s} ({_rule(ADAPTERS[s])})" for s in best)
        raise SchemaError(path, f"ambiguous: its first records fit {found} (keys: {_shown(keys)})",
                          " or ".join(f"dataset.schema={s}" for s in best))
    return Detection(best[0], fits[best[0]][0], keys)


def check_schema(path: str | os.PathLike[str], schema: str, columns: Optional[dict],
                 n: int = DETECT_RECORDS) -> Detection:
    """`schema` (given, not detected) checked against the first records of `path`.

    One fitting record is enough: the others (a null column in a broken record) are prep
    rejects, as they would be further down the file. None fitting means the columns are wrong.

    Raises:
        SchemaError: The file is empty or unreadable, or none of its records has every column `schema` needs.
    """
    path = str(path)
    rows, keys = _head(path, n)
    adapter = ADAPTERS[schema]
    if not any(_fit(adapter, row, dict(columns or {})) is not None for row in rows):
        cols = {**adapter.columns, **(columns or {})}
        lacking = {cols[k]: sum(row.get(cols[k]) is None for row in rows) for k in adapter.required}
        missing = max(lacking, key=lambda name: lacking[name])
        where = "each of its first records" if lacking[missing] == len(rows) else \
            f"{lacking[missing]} of its first {len(rows)} records, and none has all of {', '.join(lacking)}"
        raise SchemaError(path, f"schema {schema} needs column {missing!r} but it is absent or null in {where} "
                          f"(keys: {_shown(keys)})", f"+dataset.columns.<key>=<column> (keys of {schema}: "
                          f"{', '.join(adapter.required)}) or another dataset.schema")
    return Detection(schema, dict(columns or {}), keys)


# ----------------------------------------------------------------------------- files -> sources
def origin_cwd() -> str:
    """The directory the user ran the job from (Hydra's runtime.cwd; the process's outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.cwd)
    return os.getcwd()


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in SUPPORTED_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def source_name(path: str, taken: set[str]) -> str:
    """A unit name for the file at `path`: its stem made safe (a config key and a directory name), unique."""
    base = _UNSAFE.sub("_", _stem(path)).strip("_-")[:_NAME_MAX] or "file"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def files_sources(dataset: DatasetConfig, err: ConfigErrors,
                  cwd: Optional[str] = None) -> tuple[dict[str, DatasetSourceConfig], list[str]]:
    """The sources `dataset.files` stands for, and one log line per file; mistakes go to `err`.

    Each source takes `dataset.track`, `dataset.schema` (or the one detected) and the per-file
    settings (`num_samples`, `thinking`) that are not None; names avoid the sources already there.

    Relative paths are taken from `cwd` (default: where the user ran from) and stored absolute,
    so what a job reads never depends on a later working directory.
    """
    files = list(dataset.files or [])
    track, schema = dataset.track, dataset.schema
    columns = dict(dataset.columns or {})
    if track not in TRACKS:
        err.add("dataset.track", track, "dataset.files needs the track of its files" if track is None
                else "not a known choice", ", ".join(TRACKS))
    if schema is not None and schema not in ADAPTERS:
        err.add("dataset.schema", schema, "not a known choice", ", ".join(ADAPTERS) + ", null (detected per file)")
    if columns and schema is None:
        err.add("dataset.columns", columns, "renames the columns of one schema: give dataset.schema too",
                "dataset.schema=<one of " + ", ".join(ADAPTERS) + ">")
    cwd = cwd or origin_cwd()
    taken, seen = set(dataset.sources or {}), set()
    sources: dict[str, DatasetSourceConfig] = {}
    notes: list[str] = []
    for given in files:
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(str(given))))
        if path in seen:
            err.add("dataset.files", given, "listed twice", "each file once")
            continue
        seen.add(path)
        if not os.path.isfile(path):
            why = "not a file" if os.path.exists(path) else "file not found"
            err.add("dataset.files", given, why, f"local {', '.join(SUPPORTED_SUFFIXES)} files")
            continue
        if file_kind(path) is None:
            err.add("dataset.files", given, "unsupported file type", ", ".join(SUPPORTED_SUFFIXES))
            continue
        try:
            if schema is None:
                found = detect_schema(path)
            elif schema in ADAPTERS:
                found = check_schema(path, schema, columns)
            else:
                continue
        except SchemaError as exc:
            err.add("dataset.files", given, exc.why, exc.valid)
            continue
        name = source_name(path, taken)
        taken.add(name)
        how = "given by dataset.schema" if schema is not None else f"keys: {_shown(found.keys)}"
        remap = f", columns {found.columns}" if found.columns and schema is None else ""
        notes.append(f"dataset=files: {given} -> source {name}, schema {found.schema}{remap} ({how})")
        settings: dict[str, Any] = {k: getattr(dataset, k) for k in ("num_samples", "thinking")
                                    if getattr(dataset, k) is not None}
        # A track of None has put its line in `err`, and a caller uses no source then.
        sources[name] = DatasetSourceConfig(track=cast(str, track), schema=found.schema, data_files=[path],
                                            columns=dict(found.columns), description=f"dataset.files: {given}",
                                            **settings)
    return sources, notes



def with_file_sources(config: Eagle3Config, err: ConfigErrors) -> Eagle3Config:
    """`config` with `dataset.files` turned into sources (one per file) and emptied; each file's schema logged.

    When any file or option is wrong, its line goes to `err` and the config comes back unchanged
    (the rules then skip the files: their mistakes are reported here, once each).
    """
    dataset = config.dataset
    if not dataset.files:
        return config
    before = len(err.lines)
    sources, notes = files_sources(dataset, err)
    if len(err.lines) > before:
        return config
    for note in notes:
        log.info("%s", note)
    return replace(config, dataset=replace(dataset, sources={**dataset.sources, **sources}, files=None))
