"""Export an EAGLE-3 draft as a directory SGLang or vLLM serves, and read one back.

An export is `config.json` + `model.safetensors` (never pickle). The two engines read the same
tensor names but the capture ids in different places and with different numbering, and a
wrong or missing id is silent: the engine falls back to its default capture layers, or
captures a neighbouring layer, and acceptance collapses. So an export is written for one
engine, says so in an `eagle3` metadata block, and is validated both when written and when
read. Ids are converted only through `eagle3.layer_ids`.

What the engines read (sources read for this file):

* SGLang, `python/sglang/srt/model_executor/model_runner.py`: the aux ids from
  `eagle_config["eagle_aux_hidden_state_layer_ids"]` only (+1 applied internally; missing ->
  default capture) and `eagle_config["use_aux_hidden_state"]`.
  `python/sglang/srt/models/llama_eagle3.py`: `architectures`, `num_hidden_layers`,
  `hidden_size`, heads/`head_dim`, `intermediate_size`, `hidden_act`, `rms_norm_eps`, rope
  fields, `vocab_size` (embedding rows), `draft_vocab_size` (None -> lm_head borrowed from the
  target), `tie_word_embeddings` (true -> lm_head = embedding), `target_hidden_size` (fc is
  `Linear(3 * target_hidden_size, hidden_size)`); `d2t` -> hot token ids, `t2d` skipped.
  `python/sglang/srt/speculative/eagle_worker.py` + `models/llama.py`: the target's embedding
  replaces the draft's unless `target_hidden_size != hidden_size`.
* vLLM, `vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`: the aux ids from the TOP
  LEVEL `eagle_aux_hidden_state_layer_ids` of the draft config, used as written (some versions'
  `vllm/v1/worker/gpu_model_runner.py` fall back to `eagle_config`; the top level is the key
  every version reads). `vllm/transformers_utils/configs/eagle.py`: every top-level key of the
  draft config is kept. `vllm/model_executor/models/llama_eagle3.py`: the Llama fields above,
  `target_hidden_size` (fc is `3 * target_hidden_size` wide), `eagle_config.use_aux_hidden_state`,
  `norm_before_residual`, `attention_bias`/`mlp_bias`, `draft_vocab_size`; `midlayer.` is
  renamed to `layers.0.`, `d2t` becomes `draft_id_to_target_id`, `t2d` is skipped and
  `embed_tokens` is optional (the target's is shared when absent).

The vLLM export deliberately does not repeat its ids inside `eagle_config`: SGLang reads
only that place and would add 1 to them, whereas without them it falls back to its default
capture, which is the usual `[2, L//2, L-3]`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.artifacts import atomic_path, atomic_write_json, file_sha256
from eagle3.artifacts.atomic import TMP_MARKER, fsync_dir, temp_path_for
from eagle3.draft.geometry import DraftGeometry
from eagle3.draft.model import Eagle3Draft
from eagle3.layer_ids import ENGINES, capture_layers_from_engine_ids, engine_aux_layer_ids

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

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
METADATA_KEY = "eagle3"
FORMAT_VERSION = 1
#: Both engines build fc as Linear(3 * target_hidden_size, hidden_size): exactly 3 captures.
ENGINE_NUM_CAPTURES = 3
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
EMBED_KEY = "embed_tokens.weight"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# safetensors' dtype spelling, used for both in-memory and on-disk checks.
_ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
             torch.int64: "I64", torch.bool: "BOOL"}
INDEX_DTYPES = {"d2t": "I64", "t2d": "BOOL"}

StateDict = Mapping[str, torch.Tensor]


class ExportError(ValueError):
    """A draft export that an engine would refuse or, worse, serve wrongly; one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split("\n")))


@dataclass(frozen=True)
class ExportInfo:
    """What `validate_export` established about an export directory."""

    path: Path
    engine: str
    geometry: DraftGeometry
    dtype: str
    include_embedding: bool
    config: dict


# --------------------------------------------------------------------------------------------
# What an export must contain


def expected_shapes(g: DraftGeometry) -> dict[str, tuple[int, ...]]:
    """Every tensor an export may hold and its shape; `embed_tokens.weight` is optional.

    Written out rather than read off `Eagle3Draft(g)`, so a Kimi-sized geometry is checked
    without allocating its 163840 x 7168 embedding, and so the model's names are pinned.
    """
    h = g.hidden_size
    q = g.num_attention_heads * g.head_dim
    kv = g.num_key_value_heads * g.head_dim
    return {
        EMBED_KEY: (g.vocab_size, h),
        "fc.weight": (h, g.fc_in_features),  # [H, C * H_target]
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),  # reads cat(embed, hidden) [.., 2H]
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (g.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (g.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, g.intermediate_size),
        "norm.weight": (h,),
        "lm_head.weight": (g.draft_vocab_size, h),
        "d2t": (g.draft_vocab_size,),  # offsets: target id = i + d2t[i]
        "t2d": (g.vocab_size,),  # bool: target id in the draft vocab
    }


def _required_keys(g: DraftGeometry, include_embedding: bool) -> list[str]:
    return [k for k in expected_shapes(g) if k != EMBED_KEY or include_embedding]


def _target_hidden(g: DraftGeometry) -> int:
    return g.fc_in_features // max(len(g.capture_layers), 1)


def engine_config(g: DraftGeometry, engine: str, *, dtype: str = "bfloat16",
                  include_embedding: bool = False, extra_metadata: Optional[Mapping] = None,
                  weights_sha256: Optional[str] = None) -> dict[str, Any]:
    """The `config.json` of an export for `engine` (see the module docstring for sources).

    Args:
        g: The draft geometry; the source of every field.
        engine: "sglang" or "vllm"; decides where the aux ids go and how they are numbered.
        dtype: Weight dtype name written as `torch_dtype`/`dtype`.
        include_embedding: Recorded so a reader knows whether `embed_tokens` must be present.
        extra_metadata: Free-form JSON recorded under `eagle3.extra`.
        weights_sha256: Checksum of `model.safetensors`, recorded so a reader can detect a
            weights file swapped or truncated after export.
    """
    ids = engine_aux_layer_ids(g.capture_layers, engine)
    eagle_config: dict[str, Any] = {"use_aux_hidden_state": True}
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": g.hidden_size,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_key_value_heads,
        "head_dim": g.head_dim,
        "intermediate_size": g.intermediate_size,
        "hidden_act": g.hidden_act,
        "rms_norm_eps": g.rms_norm_eps,
        "rope_theta": g.rope_theta,
        "rope_scaling": g.rope_scaling,
        # transformers >= 5 spelling of the same rope; 4.x keeps it as an inert attribute.
        "rope_parameters": {"rope_type": "default", "rope_theta": g.rope_theta},
        "max_position_embeddings": g.max_position_embeddings,
        "vocab_size": g.vocab_size,  # the TARGET vocab: embedding rows, t2d length
        "draft_vocab_size": g.draft_vocab_size,
        "target_hidden_size": _target_hidden(g),  # both engines: fc = 3 * target_hidden_size
        "tie_word_embeddings": False,  # SGLang would make lm_head the embedding
        "attention_bias": False,
        "mlp_bias": False,
        "norm_before_residual": False,  # vLLM: residual = hidden before hidden_norm (our model)
        "torch_dtype": dtype,
        "dtype": dtype,
        "eagle_config": eagle_config,
    }
    if engine == "sglang":
        eagle_config[IDS_KEY] = ids  # model_runner.py reads only eagle_config[...] and adds 1
    else:
        cfg[IDS_KEY] = ids  # eagle3_utils.py reads the top level, as written
    cfg[METADATA_KEY] = {
        "format_version": FORMAT_VERSION,
        "engine": engine,
        "capture_layers": list(g.capture_layers),
        "dtype": dtype,
        "include_embedding": bool(include_embedding),
        "geometry": g.to_dict(),
        "weights": {"file": WEIGHTS_NAME, "sha256": weights_sha256},
        "extra": dict(extra_metadata or {}),
    }
    return cfg


# --------------------------------------------------------------------------------------------
# Checks shared by write and read


def _check_choice(key: str, value: Any, choices, where: str) -> None:
    if value not in choices:
        raise ExportError(f"{where}: {key}: found {value!r}, expected one of {', '.join(choices)}")


def _check_engine_and_dtype(engine: Any, dtype: Any, where: str) -> None:
    _check_choice("engine", engine, ENGINES, where)
    _check_choice("dtype", dtype, DTYPES, where)


def _check_geometry(g: DraftGeometry, engine: str, include_embedding: bool, where: str) -> None:
    """Geometries the engines cannot serve as trained, refused before anything is written."""
    capture = list(g.capture_layers)
    key = f"{METADATA_KEY}.geometry"
    if len(capture) != ENGINE_NUM_CAPTURES:
        raise ExportError(f"{where}: {key}.capture_layers: found {len(capture)} layers {capture}, expected "
                          f"{ENGINE_NUM_CAPTURES} (SGLang and vLLM build fc as "
                          "Linear(3 * target_hidden_size, H))")
    if g.fc_in_features != len(capture) * _target_hidden(g):
        raise ExportError(f"{where}: {key}.fc_in_features: found {g.fc_in_features}, expected a multiple of "
                          f"len(capture_layers)={len(capture)} (one target hidden state per captured layer)")
    ids = engine_aux_layer_ids(capture, engine)
    if capture != sorted(set(capture)) or min(ids) < 0 or max(capture) >= g.target_num_layers:
        raise ExportError(f"{where}: {key}.capture_layers: found {capture} ({engine} ids {ids}), expected "
                          f"strictly increasing captures < target_num_layers={g.target_num_layers} "
                          f"with {engine} ids >= 0")
    if g.hidden_act != "silu":
        raise ExportError(f"{where}: {key}.hidden_act: found {g.hidden_act!r}, expected 'silu' "
                          "(the draft MLP is SiLU-gated; the engine would apply the written activation)")
    if g.rope_scaling is not None:
        raise ExportError(f"{where}: {key}.rope_scaling: found {json.dumps(g.rope_scaling)}, expected null "
                          "(the draft trains with plain rope; the engine would apply the scaling)")
    if g.draft_vocab_size > g.vocab_size:
        raise ExportError(f"{where}: {key}.draft_vocab_size: found {g.draft_vocab_size}, expected "
                          f"<= vocab_size={g.vocab_size}")
    if not include_embedding and g.hidden_size != _target_hidden(g):
        raise ExportError(f"{where}: {EMBED_KEY}: not included, expected it because hidden_size="
                          f"{g.hidden_size} != target hidden {_target_hidden(g)} (engines share the "
                          "target's embedding only at equal width); export with include_embedding=True")


def _check_tensor_specs(specs: Mapping[str, tuple[tuple[int, ...], str]], g: DraftGeometry, dtype: str,
                        include_embedding: bool, where: str) -> None:
    """Key set, shapes and dtypes of the tensors, from `{name: (shape, safetensors dtype)}`."""
    shapes = expected_shapes(g)
    required = _required_keys(g, include_embedding)
    for key in required:
        if key not in specs:
            raise ExportError(f"{where}: {key}: missing, expected shape {list(shapes[key])}")
    for key in sorted(specs):
        if key not in required:
            why = "include_embedding is false" if key == EMBED_KEY else "not a tensor of an EAGLE-3 draft"
            raise ExportError(f"{where}: {key}: unexpected tensor ({why})")
    weight_dtype = _ST_DTYPE[DTYPES[dtype]]
    for key in required:
        shape, found_dtype = specs[key]
        if tuple(shape) != shapes[key]:
            raise ExportError(f"{where}: {key}: found shape {list(shape)}, expected {list(shapes[key])}")
        want = INDEX_DTYPES.get(key, weight_dtype)
        if found_dtype != want:
            raise ExportError(f"{where}: {key}: found dtype {found_dtype}, expected {want}")


def _check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, g: DraftGeometry, where: str) -> None:
    """The ids `i + d2t[i]` must be distinct, in range, and exactly the True entries of t2d.

    Engines use d2t alone to place draft logits into the target vocab; t2d is what training
    masked with. If they disagree the draft is served a different vocabulary than it learned.
    """
    ids = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)  # [draft_vocab]
    outside = ((ids < 0) | (ids >= g.vocab_size)).nonzero()
    if outside.numel():
        i = int(outside[0])
        raise ExportError(f"{where}: d2t: draft id {i} maps to target id {int(ids[i])}, expected an id in "
                          f"[0, {g.vocab_size})")
    if torch.unique(ids).numel() != ids.numel():
        repeats = ids.numel() - torch.unique(ids).numel()
        raise ExportError(f"{where}: d2t: found {repeats} repeated target ids, "
                          "expected each draft id to map to its own target id")
    unmarked = (~t2d[ids]).nonzero()
    if unmarked.numel():
        i = int(unmarked[0])
        raise ExportError(f"{where}: d2t/t2d: draft id {i} maps to target id {int(ids[i])}, which t2d marks "
                          "False; expected t2d True exactly at the targets of d2t")
    marked = int(t2d.sum())
    if marked != ids.numel():
        raise ExportError(f"{where}: t2d: found {marked} target ids marked True, expected {ids.numel()} "
                          "(exactly the targets of d2t)")


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_MISSING = object()


def _check_config(cfg: Mapping[str, Any], info: ExportInfo, where: str) -> None:
    """Every field the engine reads must say what the recorded geometry says.

    The engine builds the draft from these top-level fields, our loader from the geometry;
    a hand edit to one of them would make the two disagree without any load error.
    """
    meta = cfg[METADATA_KEY]
    want = engine_config(info.geometry, info.engine, dtype=info.dtype,
                         include_embedding=info.include_embedding, extra_metadata=meta.get("extra"),
                         weights_sha256=(meta.get("weights") or {}).get("sha256"))
    want.pop(METADATA_KEY)
    found = _flatten({k: v for k, v in cfg.items() if k != METADATA_KEY})
    for key, value in _flatten(want).items():
        got = found.get(key, _MISSING)
        if got != value:
            shown = "missing" if got is _MISSING else json.dumps(got)
            hint = ""
            if key.endswith(IDS_KEY):
                rule = "capture - 1" if info.engine == "sglang" else "capture as written"
                hint = f" ({info.engine} reads {rule}; capture_layers {list(info.geometry.capture_layers)})"
            raise ExportError(f"{where}: {key}: found {shown}, expected {json.dumps(value)}{hint}")


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
    _check_engine_and_dtype(engine, dtype, f"{where}: {METADATA_KEY}")
    try:
        geometry = DraftGeometry.from_dict(meta["geometry"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"{where}: {METADATA_KEY}.geometry: unreadable ({exc!r})") from None
    if list(meta.get("capture_layers") or []) != list(geometry.capture_layers):
        raise ExportError(f"{where}: {METADATA_KEY}.capture_layers: found {meta.get('capture_layers')}, "
                          f"expected {list(geometry.capture_layers)} (the geometry's)")
    return ExportInfo(path=path, engine=engine, geometry=geometry, dtype=dtype,
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
    _check_geometry(info.geometry, info.engine, info.include_embedding, str(config_file))
    _check_config(cfg, info, str(config_file))
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise ExportError(f"{weights}: missing, expected the draft weights")
    _check_tensor_specs(_file_specs(weights), info.geometry, info.dtype, info.include_embedding, str(weights))
    _check_vocab_maps(*_read_vocab_maps(weights), info.geometry, str(weights))
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
    _check_choice("engine", engine, ENGINES, str(config_file))
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
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
    for key in _required_keys(g, include_embedding):
        if key not in state:
            raise ExportError(f"{where}: {key}: missing, expected shape {list(shapes[key])}")
        t = state[key].detach()
        if key in INDEX_DTYPES:
            if t.is_floating_point():
                raise ExportError(f"{where}: {key}: found dtype {t.dtype}, expected an integer/bool map")
            t = t.to("cpu", torch.int64 if key == "d2t" else torch.bool)
        else:
            t = t.to("cpu", DTYPES[dtype])
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


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the complete new export over `out_dir`, keeping the old one until then.

    A crash between the two renames leaves no `out_dir` and both exports under hidden
    temporary names; a half-written directory is never under the final name.
    """
    if out_dir.exists():
        old = temp_path_for(out_dir)
        os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except BaseException:
            os.replace(old, out_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
    fsync_dir(out_dir.parent)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_temps(out_dir: Path) -> None:
    """Remove temporary siblings of `out_dir` left by killed exports (they hold GBs)."""
    pattern = re.compile(re.escape(f".{out_dir.name}{TMP_MARKER}") + r"(\d+)-")
    for sibling in out_dir.parent.iterdir():
        match = pattern.match(sibling.name)
        if match and sibling.is_dir() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(sibling, ignore_errors=True)


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
    _check_engine_and_dtype(engine, dtype, "export_draft")
    g, state = _source(draft, geometry)
    _check_geometry(g, engine, include_embedding, str(out_dir / CONFIG_NAME))
    try:
        json.dumps(dict(extra_metadata or {}))
    except (TypeError, ValueError) as exc:
        raise ExportError(f"export_draft: extra_metadata: not JSON-serialisable ({exc})") from None
    tensors = _prepare_tensors(state, g, dtype, include_embedding, where)
    specs = {k: (tuple(t.shape), _ST_DTYPE[t.dtype]) for k, t in tensors.items()}
    _check_tensor_specs(specs, g, dtype, include_embedding, where)
    _check_vocab_maps(tensors["d2t"], tensors["t2d"], g, where)
    if include_embedding and not bool(tensors[EMBED_KEY].any()):
        raise ExportError(f"{where}: {EMBED_KEY}: found all zeros, expected the target's embedding "
                          "(copy it in before exporting, or export without it)")
    _refuse_foreign_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(out_dir)
    tmp.mkdir()
    try:
        _write_weights(tensors, tmp / WEIGHTS_NAME)
        cfg = engine_config(g, engine, dtype=dtype, include_embedding=include_embedding,
                            extra_metadata=extra_metadata, weights_sha256=file_sha256(tmp / WEIGHTS_NAME))
        atomic_write_json(tmp / CONFIG_NAME, cfg)
        validate_export(tmp, engine, verify_checksum=False)  # what is on disk is what engines read
        _swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sweep_stale_temps(out_dir)
    return out_dir
