"""What an EAGLE-3 draft export is: the config the engines read, its tensors, and the checks.

An export is `config.json` + `model.safetensors` (never pickle). The two engines read the same
tensor names but the capture ids in different places and with different numbering, and a
wrong or missing id is silent: the engine falls back to its default capture layers, or
captures a neighbouring layer, and acceptance collapses. So an export is written for one
engine, says so in an `eagle3` metadata block, and is validated both when written and when
read (`eagle3.draft.export` writes and reads; the rules live here). Ids are converted only
through `eagle3.layer_ids`.

What the engines read (sources read for this file):

* SGLang, `python/sglang/srt/model_executor/model_runner.py`: the aux ids from
  `eagle_config["eagle_aux_hidden_state_layer_ids"]` only (+1 applied internally; missing ->
  default capture) and `eagle_config["use_aux_hidden_state"]`.
  `python/sglang/srt/models/llama_eagle3.py`: `architectures`, `num_hidden_layers` (1, else it raises),
  `hidden_size`, heads/`head_dim`, `intermediate_size`, `hidden_act`, `rms_norm_eps`, rope
  fields, `vocab_size` (embedding rows), `draft_vocab_size` (None -> lm_head borrowed from the
  target), `tie_word_embeddings` (true -> lm_head = embedding), `target_hidden_size` (fc is
  `Linear(3 * target_hidden_size, hidden_size)`: exactly 3 captures, whatever the config says);
  `d2t` -> hot token ids, `t2d` skipped.
  `python/sglang/srt/speculative/eagle_worker.py` + `models/llama.py`: the target's embedding
  replaces the draft's unless `target_hidden_size != hidden_size`.
* vLLM, `vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`: the aux ids from the TOP
  LEVEL `eagle_aux_hidden_state_layer_ids` of the draft config, used as written (some versions'
  `vllm/v1/worker/gpu_model_runner.py` fall back to `eagle_config`; the top level is the key
  every version reads). `vllm/transformers_utils/configs/eagle.py`: every top-level key of the
  draft config is kept. `vllm/model_executor/models/llama_eagle3.py`: the Llama fields above,
  `target_hidden_size` and `num_aux_hidden_states` (fc is `num_aux_hidden_states * target_hidden_size`
  wide; absent, the number of `eagle_config` ids, else 3), `eagle_config.use_aux_hidden_state`,
  the layer variants `norm_before_residual`, `norm_before_fc` (+ `input_norm.weight`), `fc_norm`
  (+ `fc_norm.<i>.weight`) and `norm_output`, `attention_bias`/`mlp_bias`, `draft_vocab_size`,
  `num_hidden_layers` (layer 0 reads 2H, layers >= 1 are plain Llama layers named `layers.<i>.*`
  without `hidden_norm`); `midlayer.` is renamed to `layers.0.`, `d2t` becomes
  `draft_id_to_target_id`, `t2d` is skipped and `embed_tokens` is optional (the target's is
  shared when absent).

* The MLA draft (`model.draft.attention=mla`), vLLM `vllm/model_executor/models/deepseek_eagle3.py`
  and SGLang `python/sglang/srt/models/kimi_k25_eagle3.py`, both `Eagle3DeepseekV2ForCausalLM`: the
  same top-level names and ids, `model_type` deepseek_v2 (vLLM maps deepseek_v3 to its MTP draft and
  refuses), the MLA fields `q_lora_rank` (required by both: null fails), `kv_lora_rank`,
  `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`, and attention tensors
  `self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
  o_proj}` (q_a and kv_a read 2H in the first layer; both engines fuse them on load). Rope is
  pairwise (`is_neox_style=False`) over `qk_rope_head_dim`; vLLM also reads `norm_before_residual`,
  `fc_norm` and `norm_output`, neither engine `norm_before_fc`.

The vLLM export deliberately does not repeat its ids inside `eagle_config`: SGLang reads
only that place and would add 1 to them, whereas without them it falls back to its default
capture, which is the usual `[2, L//2, L-3]`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from eagle3.draft.geometry import MLA_FIELDS, DraftGeometry, geometry_refusals
from eagle3.draft.options import LAYER_VARIANTS, MLA_ARCHITECTURE, MLA_MODEL_TYPE
from eagle3.draft.shapes import EMBED_KEY, expected_shapes
from eagle3.draft.shapes import target_hidden as _target_hidden
from eagle3.dtypes import DTYPES, torch_dtype
from eagle3.errors import Eagle3Error
from eagle3.layer_ids import ENGINES, engine_aux_layer_ids

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
METADATA_KEY = "eagle3"
FORMAT_VERSION = 1
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
#: vLLM sizes fc from this top-level key (it does not count the top-level ids); absent, it reads 3.
NUM_AUX_KEY, VLLM_DEFAULT_NUM_AUX = "num_aux_hidden_states", 3
# safetensors' dtype spelling, used for both in-memory and on-disk checks.
SAFETENSORS_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
                     torch.int64: "I64", torch.bool: "BOOL"}
INDEX_DTYPES = {"d2t": "I64", "t2d": "BOOL"}

StateDict = Mapping[str, torch.Tensor]


class ExportError(Eagle3Error, ValueError):
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


def required_keys(g: DraftGeometry, include_embedding: bool) -> list[str]:
    return [k for k in expected_shapes(g) if k != EMBED_KEY or include_embedding]


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
        "architectures": [MLA_ARCHITECTURE if g.is_mla else ARCHITECTURE],
        "model_type": MLA_MODEL_TYPE if g.is_mla else "llama",
        "num_hidden_layers": g.num_layers,  # SGLang: 1 only (geometry_refusals)
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
        # The layer variants (vLLM reads these four, SGLang 0.5.23 all but norm_before_residual).
        **g.variants(),
        "torch_dtype": dtype,
        "dtype": dtype,
        "eagle_config": eagle_config,
    }
    if g.is_mla:  # the engines' MLA draft layer reads these; head_dim is theirs to derive
        del cfg["head_dim"]
        cfg.update({name: getattr(g, name) for name in MLA_FIELDS})
    if engine == "sglang":
        eagle_config[IDS_KEY] = ids  # model_runner.py reads only eagle_config[...] and adds 1
    else:
        cfg[IDS_KEY] = ids  # eagle3_utils.py reads the top level, as written
        cfg[NUM_AUX_KEY] = len(ids)  # llama_eagle3.py: fc = Linear(num_aux_hidden_states * target_hidden_size, H)
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


def check_choice(key: str, value: Any, choices, where: str) -> None:
    if value not in choices:
        raise ExportError(f"{where}: {key}: found {value!r}, expected one of {', '.join(choices)}")


def check_engine_and_dtype(engine: Any, dtype: Any, where: str) -> None:
    check_choice("engine", engine, ENGINES, where)
    check_choice("dtype", dtype, DTYPES, where)  # eagle3.dtypes: the names configs use


def check_geometry(g: DraftGeometry, engine: str, include_embedding: bool, where: str) -> None:
    """Geometries the engines cannot serve as trained, refused before anything is written.

    The rules are `eagle3.draft.geometry.geometry_refusals`, which config validation runs too.
    """
    refused = geometry_refusals(g, engine, include_embedding)
    if refused:
        raise ExportError(f"{where}: {METADATA_KEY}.geometry.{refused[0].field}: {refused[0].message()}")


def check_tensor_specs(specs: Mapping[str, tuple[tuple[int, ...], str]], g: DraftGeometry, dtype: str,
                        include_embedding: bool, where: str) -> None:
    """Key set, shapes and dtypes of the tensors, from `{name: (shape, safetensors dtype)}`."""
    shapes = expected_shapes(g)
    required = required_keys(g, include_embedding)
    for key in required:
        if key not in specs:
            raise ExportError(f"{where}: {key}: missing, expected shape {list(shapes[key])}")
    for key in sorted(specs):
        if key not in required:
            why = "include_embedding is false" if key == EMBED_KEY else "not a tensor of an EAGLE-3 draft"
            raise ExportError(f"{where}: {key}: unexpected tensor ({why})")
    weight_dtype = SAFETENSORS_DTYPE[torch_dtype(dtype)]
    for key in required:
        shape, found_dtype = specs[key]
        if tuple(shape) != shapes[key]:
            raise ExportError(f"{where}: {key}: found shape {list(shape)}, expected {list(shapes[key])}")
        want = INDEX_DTYPES.get(key, weight_dtype)
        if found_dtype != want:
            raise ExportError(f"{where}: {key}: found dtype {found_dtype}, expected {want}")


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, g: DraftGeometry, where: str) -> None:
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
# What vLLM reads for a key an export of an earlier version did not write (variants: false;
# the aux count: 3), so such exports still validate when that is what they hold.
_ABSENT_MEANS = {**{name: False for name in LAYER_VARIANTS}, NUM_AUX_KEY: VLLM_DEFAULT_NUM_AUX}


def check_config(cfg: Mapping[str, Any], info: ExportInfo, where: str) -> None:
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
        got = found.get(key, _ABSENT_MEANS.get(key, _MISSING))
        if got != value:
            shown = "missing" if got is _MISSING else json.dumps(got)
            hint = ""
            if key.endswith(IDS_KEY):
                rule = "capture - 1" if info.engine == "sglang" else "capture as written"
                hint = f" ({info.engine} reads {rule}; capture_layers {list(info.geometry.capture_layers)})"
            raise ExportError(f"{where}: {key}: found {shown}, expected {json.dumps(value)}{hint}")
