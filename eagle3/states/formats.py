"""Storage formats of the hidden-state store: how one sample's tensors become bytes and back.

A sample is `aux [seq, C*H]` (C captured layers side by side), the teacher `final [seq, H]` and
`input_ids [seq]`. The formats trade disk for precision, which at Kimi scale is the whole
question (~56 KiB per token in bf16, ~9 TB for the 100K plan):

- `fp32`: exact copy of an fp32 forward pass (tests, small targets; 2x bf16).
- `bf16`: the default; exact for a bf16 target, <= 2^-9 relative per element otherwise.
- `fp8`:  float8_e4m3fn with one float32 scale per token and per H-wide block (each captured
  layer and the final state get their own scale, because residual-stream norms grow by orders
  of magnitude with depth). Half of bf16; relative error per token ~2-3%, bounded by 2^-4
  (3 mantissa bits) plus a subnormal term. The error is measured on every sample written and
  kept in the index, so a store always says how lossy it actually was.
- `compact`: what training reads, and no more. The captured states as int8 with one bf16 scale
  per `COMPACT_GROUP` values (absmax: ~0.5% relative error per token, 5x below fp8, because a
  group of 64 rarely spans the residual stream's outlier channels); the teacher not as the final
  state `[H]` but as what the loss reads from it, the target's `COMPACT_TOPK` most likely next
  tokens (int32 ids, fp16 log-probabilities over the full vocab). At Kimi geometry 22.0 KiB per
  token against 28.0 (fp8) and 56.0 (bf16). What it loses is recorded like fp8's error: per
  token, the aux error and the teacher probability mass outside the top k.

The byte arithmetic and the names live here, torch-free (config validation, `stage=plan` and the
extract preflight read them); the encoding itself is `eagle3.states.codec`.
"""

from __future__ import annotations

from eagle3.config.choices import STORAGE_FORMATS

#: `extract.storage_format` (its valid values: the schema's `eagle3.config.choices`).
FORMATS = STORAGE_FORMATS
IDS_BYTES = 4  # int32 ids: vocabularies stay far below 2^31 (Kimi: 163840)
SCALE_BYTES = 4  # one float32 scale per token and H-wide block (fp8)
# Per-sample overhead of a shard header entry (~5 tensor names and offsets) and an index line.
SAMPLE_OVERHEAD_BYTES = 1024
#: Bytes per stored value of the unquantized formats (fp8: 1, plus its scales).
VALUE_BYTES = {"fp32": 4, "bf16": 2}
#: `compact`: captured values per int8 scale, the scale's bytes (bf16), and the teacher's top k.
COMPACT_GROUP = 64
COMPACT_SCALE_BYTES = 2
COMPACT_TOPK = 64
COMPACT_TEACHER_BYTES = 4 + 2  # int32 id + fp16 log-probability per kept token


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown storage format {fmt!r}; valid: {', '.join(FORMATS)}")
    return fmt


def bytes_per_token(fmt: str, hidden: int, n_capture: int) -> int:
    """Stored bytes per token: C aux blocks + 1 final block of H values, ids, fp8 scales.

    `compact`: C*H int8 values, their group scales, the teacher's top k and the id.
    """
    check_format(fmt)
    if fmt == "compact":
        values = n_capture * hidden
        groups = -(-values // COMPACT_GROUP)
        return values + groups * COMPACT_SCALE_BYTES + COMPACT_TOPK * COMPACT_TEACHER_BYTES + IDS_BYTES
    blocks = n_capture + 1
    if fmt == "fp8":
        return blocks * hidden + blocks * SCALE_BYTES + IDS_BYTES
    return blocks * hidden * VALUE_BYTES[fmt] + IDS_BYTES


def format_params(fmt: str) -> dict[str, int]:
    """The constants a stored value of `fmt` depends on (part of the store's identity)."""
    if check_format(fmt) == "compact":
        return {"group": COMPACT_GROUP, "topk": COMPACT_TOPK}
    return {}


def needs_teacher_head(fmt: str) -> bool:
    """Whether writing `fmt` needs the target's lm_head (the teacher is stored as its top k)."""
    return check_format(fmt) == "compact"


def tensor_names(fmt: str) -> tuple[str, ...]:
    """Suffixes one sample has in a shard (`<key>/<suffix>`)."""
    check_format(fmt)
    if fmt == "fp8":
        return ("aux", "aux_scale", "final", "final_scale", "ids")
    if fmt == "compact":
        return ("aux", "aux_scale", "teacher_ids", "teacher_logprob", "ids")
    return ("aux", "final", "ids")
