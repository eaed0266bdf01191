"""The config rules of the data: `dataset.*` (its sources and their files), `prep.*`, `tokenize.*`, `data.*`.

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`,
after each field's own choices and range (`eagle3.config.fields`): these are the rules across fields
and the ones that read the data files.
"""

from __future__ import annotations

from pathlib import Path

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import DatasetConfig, Eagle3Config
from eagle3.data.adapters import ADAPTERS
from eagle3.data.loading import SUPPORTED_SUFFIXES, file_kind


def check_dataset(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`dataset.*`: at least one source, each with one origin, a known track, schema and column keys."""
    _check_dataset(cfg.dataset, err)


def _check_dataset(dataset: DatasetConfig, err: ConfigErrors) -> None:
    # Files still listed are ones `with_file_sources` (run before the rules) could not make sources:
    # it put each mistake in `err` already.
    if not dataset.sources and dataset.files == []:
        err.add("dataset.files", [], "names no file", "dataset.files=[a.jsonl,b.parquet] (local "
                + ", ".join(SUPPORTED_SUFFIXES) + " files)")
    elif not dataset.sources and dataset.files is None:
        err.add("dataset.sources", {}, "a dataset needs at least one source",
                "e.g. dataset=demo or dataset=kimi_native")
    for name, src in dataset.sources.items():
        key = f"dataset.sources.{name}"
        origins = [k for k in ("hub_id", "data_files", "generator") if getattr(src, k)]
        if len(origins) != 1:
            err.add(key, origins, "needs exactly one origin",
                    "one of hub_id, data_files, generator")
        for path in src.data_files or []:
            if not Path(path).exists():
                err.add(f"{key}.data_files", path, "file not found", "local json/jsonl/parquet files")
            elif file_kind(path) is None:
                err.add(f"{key}.data_files", path, "unsupported file type", ", ".join(SUPPORTED_SUFFIXES))
        if src.schema in ADAPTERS:
            # Each adapter declares the column keys it reads; a misspelt key would otherwise
            # be ignored and every record would miss its column.
            valid_keys = ADAPTERS[src.schema].keys
            for col_key in src.columns or {}:
                if col_key not in valid_keys:
                    err.add(f"{key}.columns.{col_key}", src.columns[col_key],
                            f"not a column key of schema {src.schema}", ", ".join(valid_keys))
        if src.generator and src.num_samples is None:  # a generator has no end
            err.add(f"{key}.num_samples", None, "a generated source needs a sample count", "> 0")


def check_prep(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`prep.*`: the turn and length bounds of a kept conversation."""
    prep = cfg.prep
    if prep.max_user_turns < prep.min_user_turns:
        err.add("prep.max_user_turns", prep.max_user_turns, "below prep.min_user_turns",
                f">= {prep.min_user_turns}")
