"""Export an EAGLE-3 draft as a directory SGLang or vLLM serves, and read one back.

An export is `config.json` + `model.safetensors` (never pickle), written for one engine and
validated both when written and when read, against the rules of `eagle3.draft.export_format`
(what each engine reads, and where). A write goes to a temporary directory that replaces the
old export in one rename, so a killed export leaves the previous one whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.artifacts import atomic_path, atomic_write_json, file_sha256
from eagle3.artifacts.atomic import atomic_directory
from eagle3.draft.export_format import (
    ARCHITECTURE,
    CONFIG_NAME,
    EMBED_KEY,
    IDS_KEY,
    INDEX_DTYPES,
    METADATA_KEY,
    SAFETENSORS_DTYPE,
    WEIGHTS_NAME,
    ExportError,
    ExportInfo,
    StateDict,
    check_choice,
    check_config,
    check_engine_and_dtype,
    check_geometry,
    check_tensor_specs,
    check_vocab_maps,
    engine_config,
    expected_shapes,
    required_keys,
)
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.dtypes import torch_dtype
from eagle3.layer_ids import ENGINES, capture_layers_from_engine_ids

__all__ = [
    "ARCHITECTURE",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "ExportError",
    "ExportInfo",
    "capture_layers_of",
    "engine_config",
    "expected_shapes",
    "export_draft",
    "load_exported",
    "validate_export",
]


# --------------------------------------------------------------------------------------------
# Reading


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise ExportError(f"{path}: missing (not a draft export)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: unreadable JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ExportError(f"{path}: found {type(cfg).__name__}, expected a JSON object")
    return cfg


def _info_from_config(path: Path, cfg: dict, where: str) -> ExportInfo:
    meta = cfg.get(METADATA_KEY)
    if not isinstance(meta, dict):
        raise ExportError(f"{where}: {METADATA_KEY}: missing, expected the metadata block "
                          "export_draft writes (engine, capture_layers, geometry)")
    engine, dtype = meta.get("engine"), meta.get("dtype")
    check_engine_and_dtype(engine, dtype, f"{where}: {METADATA_KEY}")
    try:
        geometry = DraftGeometry.from_dict(meta["geometry"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"{where}: {METADATA_KEY}.geometry: unreadable ({exc!r})") from None
    if list(meta.get("capture_layers") or []) != list(geometry.capture_layers):
        raise ExportError(f"{where}: {METADATA_KEY}.capture_layers: found {meta.get('capture_layers')}, "
                          f"expected {list(geometry.capture_layers)} (the geometry's)")
    return ExportInfo(path=path, engine=str(engine), geometry=geometry, dtype=str(dtype),  # both checked above
                      include_embedding=bool(meta.get("include_embedding")), config=cfg)


def _file_specs(weights: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtypes from the safetensors header, without loading the tensors."""
    try:
        with safe_open(str(weights), framework="pt") as fh:
            return {k: (tuple(fh.get_slice(k).get_shape()), fh.get_slice(k).get_dtype()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error type for corrupt headers
        raise ExportError(f"{weights}: unreadable safetensors file ({str(exc).splitlines()[0]})") from None


def _read_vocab_maps(weights: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with safe_open(str(weights), framework="pt") as fh:
        return fh.get_tensor("d2t"), fh.get_tensor("t2d")


def validate_export(path: Union[str, Path], engine: Optional[str] = None, *,
                    verify_checksum: bool = True) -> ExportInfo:
    """Check an export directory as an engine would load it, and say what it is.

    Args:
        path: The export directory.
        engine: If given, the engine about to serve it; an export written for the other engine
            is refused, because its capture ids are numbered for that engine.
        verify_checksum: Hash `model.safetensors` against the recorded sha256 (seconds per GB).

    Returns:
        The recorded engine, geometry, dtype and config.

    Raises:
        ExportError: One line naming the file, the key, what was found and what was expected.
    """
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: not a directory, expected a draft export")
    config_file = path / CONFIG_NAME
    cfg = _read_config(config_file)
    info = _info_from_config(path, cfg, str(config_file))
    if engine is not None and engine != info.engine:
        raise ExportError(f"{config_file}: {METADATA_KEY}.engine: found {info.engine!r}, expected {engine!r} "
                          f"(aux ids are numbered per engine; export again for {engine})")
    check_geometry(info.geometry, info.engine, info.include_embedding, str(config_file))
    check_config(cfg, info, str(config_file))
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise ExportError(f"{weights}: missing, expected the draft weights")
    check_tensor_specs(_file_specs(weights), info.geometry, info.dtype, info.include_embedding, str(weights))
    check_vocab_maps(*_read_vocab_maps(weights), info.geometry, str(weights))
    if verify_checksum:
        recorded = (cfg[METADATA_KEY].get("weights") or {}).get("sha256")
        actual = file_sha256(weights)
        if recorded != actual:
            raise ExportError(f"{weights}: sha256: found {actual}, expected {recorded} (recorded at export)")
    return info


def load_exported(path: Union[str, Path]) -> tuple[DraftGeometry, str, Eagle3Draft]:
    """Rebuild the draft (float32) from a validated export.

    The embedding is the target's and is usually not exported; it is then left as zeros, so
    the returned model predicts garbage until the caller copies the target's embedding in
    (`Eagle3Draft.init_from_target` or `model.embed_tokens.weight.copy_(...)`).

    Returns:
        (geometry, engine the export was written for, model).
    """
    info = validate_export(path)
    model = Eagle3Draft(info.geometry)
    state = load_file(str(Path(path) / WEIGHTS_NAME))
    state = {k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}
    state.setdefault(EMBED_KEY, torch.zeros(info.geometry.vocab_size, info.geometry.hidden_size))
    model.load_state_dict(state, strict=True)
    return info.geometry, info.engine, model


def capture_layers_of(path: Union[str, Path], engine: str) -> list[int]:
    """The target layers `engine` would capture when serving the export at `path`.

    Reads the ids where that engine reads them (SGLang: `eagle_config`; vLLM: the top level,
    then `eagle_config` as some versions do), so serving an export on the wrong engine shows
    up as a capture that differs from `eagle3.capture_layers`.
    """
    config_file = Path(path) / CONFIG_NAME
    cfg = _read_config(config_file)
    check_choice("engine", engine, ENGINES, str(config_file))
    nested = cfg.get("eagle_config")
    nested = nested if isinstance(nested, dict) else {}
    ids = nested.get(IDS_KEY) if engine == "sglang" else (cfg.get(IDS_KEY) or nested.get(IDS_KEY))
    if not ids:
        where = f"eagle_config.{IDS_KEY}" if engine == "sglang" else IDS_KEY
        raise ExportError(f"{config_file}: {where}: missing; {engine} would capture its default layers")
    return capture_layers_from_engine_ids(ids, engine)


# --------------------------------------------------------------------------------------------
# Writing


def _source(draft: Union[Eagle3Draft, StateDict],
            geometry: Optional[DraftGeometry]) -> tuple[DraftGeometry, StateDict]:
    if isinstance(draft, Eagle3Draft):
        if geometry is not None and geometry != draft.geometry:
            raise ExportError("export_draft: geometry: differs from the model's own geometry")
        return draft.geometry, draft.state_dict()
    if isinstance(draft, Mapping):
        if geometry is None:
            raise ExportError("export_draft: geometry: missing, expected a DraftGeometry with a state dict")
        return geometry, draft
    raise ExportError(f"export_draft: draft: found {type(draft).__name__}, "
                      "expected Eagle3Draft or a state dict")


def _prepare_tensors(state: StateDict, g: DraftGeometry, dtype: str, include_embedding: bool,
                     where: str) -> dict[str, torch.Tensor]:
    """CPU, contiguous copies in the export dtypes: weights in `dtype`, d2t int64, t2d bool."""
    shapes = expected_shapes(g)
    for key in sorted(state):
        if key not in shapes:
            raise ExportError(f"{where}: {key}: unexpected tensor (not a tensor of an EAGLE-3 draft)")
    out: dict[str, torch.Tensor] = {}
    for key in required_keys(g, include_embedding):
        if key not in state:
            raise ExportError(f"{where}: {key}: missing, expected shape {list(shapes[key])}")
        t = state[key].detach()
        if key in INDEX_DTYPES:
            if t.is_floating_point():
                raise ExportError(f"{where}: {key}: found dtype {t.dtype}, expected an integer/bool map")
            t = t.to("cpu", torch.int64 if key == "d2t" else torch.bool)
        else:
            t = t.to("cpu", torch_dtype(dtype))
        out[key] = t.contiguous()
    return out


def _write_weights(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    with atomic_path(path) as tmp:
        save_file(dict(tensors), str(tmp), metadata={"format": "pt"})


def _refuse_foreign_dir(out_dir: Path) -> None:
    """Only an earlier export (or an empty directory) may be replaced: never a user's data."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory; refusing to replace it")
    if not any(out_dir.iterdir()):
        return
    try:
        is_export = isinstance(_read_config(out_dir / CONFIG_NAME).get(METADATA_KEY), dict)
    except ExportError:
        is_export = False
    if not is_export:
        raise ExportError(f"{out_dir}: not a draft export (no {CONFIG_NAME} with an {METADATA_KEY} block); "
                          "refusing to replace it")


def export_draft(draft: Union[Eagle3Draft, StateDict], out_dir: Union[str, Path], engine: str, *,
                 geometry: Optional[DraftGeometry] = None, dtype: str = "bfloat16",
                 include_embedding: bool = False, extra_metadata: Optional[Mapping[str, Any]] = None) -> Path:
    """Write `draft` as a directory `engine` loads (`config.json` + `model.safetensors`).

    Everything is checked in memory first, written into a temporary sibling directory,
    checked again as read back from disk, and only then renamed over `out_dir`; an existing
    export there survives any failure before that point.

    Args:
        draft: The model, or its state dict (then `geometry` is required).
        out_dir: Destination directory; an existing export (or empty directory) is replaced.
        engine: "sglang" or "vllm"; the capture ids are written for this engine only.
        geometry: The draft geometry when `draft` is a state dict.
        dtype: Weight dtype of the export ("bfloat16", "float16", "float32").
        include_embedding: Also write `embed_tokens.weight` (needed when the draft's hidden
            size differs from the target's; otherwise engines use the target's embedding).
        extra_metadata: JSON-serialisable provenance recorded under `eagle3.extra`.

    Returns:
        `out_dir` as a Path.

    Raises:
        ExportError: The draft or geometry is not servable as trained; nothing is replaced.
    """
    out_dir = Path(out_dir)
    where = str(out_dir / WEIGHTS_NAME)
    check_engine_and_dtype(engine, dtype, "export_draft")
    g, state = _source(draft, geometry)
    check_geometry(g, engine, include_embedding, str(out_dir / CONFIG_NAME))
    try:
        json.dumps(dict(extra_metadata or {}))
    except (TypeError, ValueError) as exc:
        raise ExportError(f"export_draft: extra_metadata: not JSON-serialisable ({exc})") from None
    tensors = _prepare_tensors(state, g, dtype, include_embedding, where)
    specs = {k: (tuple(t.shape), SAFETENSORS_DTYPE[t.dtype]) for k, t in tensors.items()}
    check_tensor_specs(specs, g, dtype, include_embedding, where)
    check_vocab_maps(tensors["d2t"], tensors["t2d"], g, where)
    if include_embedding and not bool(tensors[EMBED_KEY].any()):
        raise ExportError(f"{where}: {EMBED_KEY}: found all zeros, expected the target's embedding "
                          "(copy it in before exporting, or export without it)")
    _refuse_foreign_dir(out_dir)
    with atomic_directory(out_dir) as tmp:
        _write_weights(tensors, tmp / WEIGHTS_NAME)
        cfg = engine_config(g, engine, dtype=dtype, include_embedding=include_embedding,
                            extra_metadata=extra_metadata, weights_sha256=file_sha256(tmp / WEIGHTS_NAME))
        atomic_write_json(tmp / CONFIG_NAME, cfg)
        validate_export(tmp, engine, verify_checksum=False)  # what is on disk is what engines read
    return out_dir
