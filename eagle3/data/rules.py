"""The config rules of the data: `dataset.*` (its sources and their files), `prep.*`, `tokenize.*`, `data.*`.

Run for every config, in the order `eagle3.stages` lists them, by `eagle3.config.validate.validate_config`;
each choice is checked against the list of the module that acts on it.
"""

from __future__ import annotations

from pathlib import Path

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import DatasetConfig, Eagle3Config
from eagle3.data.adapters import ADAPTERS
from eagle3.data.conversation import TRACKS
from eagle3.data.loading import SUPPORTED_SUFFIXES, file_kind
from eagle3.data.render import ANSWER_IDS, OVERLENGTH_POLICIES


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
        err.choice(f"{key}.track", src.track, TRACKS)
        err.choice(f"{key}.schema", src.schema, ADAPTERS)
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
        err.positive(f"{key}.num_samples", src.num_samples, allow_none=not src.generator)  # a generator has no end
        err.not_negative(f"{key}.weight", src.weight)


def check_prep(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`prep.*`: the turn and length bounds of a kept conversation."""
    prep = cfg.prep
    err.positive("prep.min_user_turns", prep.min_user_turns)
    if prep.max_user_turns < prep.min_user_turns:
        err.add("prep.max_user_turns", prep.max_user_turns, "below prep.min_user_turns",
                f">= {prep.min_user_turns}")
    err.positive("prep.max_chars", prep.max_chars)


def check_tokenize(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`tokenize.*`: the overlength policy, which ids answers train on, and the workers' settings."""
    tok = cfg.tokenize
    err.choice("tokenize.overlength", tok.overlength, OVERLENGTH_POLICIES)
    err.choice("tokenize.answer_ids", tok.answer_ids, ANSWER_IDS)
    err.not_negative("tokenize.num_workers", tok.num_workers, ">= 0 (0 = all cores)")
    err.positive("tokenize.chunk_size", tok.chunk_size)


def check_data(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """`data.*`: the mixture's scale, length, reject warning and eval split."""
    data = cfg.data
    err.positive("data.scale", data.scale, allow_none=True)
    err.positive("data.max_len", data.max_len)
    if not 0 <= data.warn_reject_fraction <= 1:
        err.add("data.warn_reject_fraction", data.warn_reject_fraction, "a share of a source's records",
                "[0, 1] (0 = warn on any loss, 1 = never)")
    if data.eval_size < 1:
        # Validation during training, vocab coverage_eval, eval's simulated and real acceptance all read the
        # eval split: over 0 samples they would report 1.0 made of nothing.
        err.add("data.eval_size", data.eval_size, "the eval split feeds every accept-length and coverage figure; "
                "with no samples they would be numbers made of nothing", ">= 1 (e.g. 16)")
