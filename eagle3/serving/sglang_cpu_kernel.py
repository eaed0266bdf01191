"""A pure-Python ``sgl_kernel`` for SGLang's CPU engine only.

SGLang's CPU path (``--device cpu`` with ``SGLANG_USE_CPU_ENGINE=1``) imports ops from
``sgl_kernel`` on every server (``sglang/kernels/ops/kvcache/cache_move.py``,
``sglang/srt/mem_cache/allocation.py``, the speculative modules), and the ``sgl-kernel`` /
``sglang-kernel`` wheels on PyPI hold CUDA libraries only. ``scripts/setup_sglang_cpu.sh`` copies
this file into the CPU server's own venv (``.sglang-venv``) as the package ``sgl_kernel``; nothing
else imports it. A GPU install uses the real sgl-kernel and never gets this file; the setup script
refuses to put it where a real sgl-kernel is installed.

What plain (non-speculative) serving calls, written from SGLang's call sites and its Triton
kernels for GPUs:

* ``copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc)``: the KV pool keeps one
  contiguous buffer per layer for keys and one for values (plus scale buffers when quantised),
  each indexed by token slot in its first dimension; ``data_ptrs`` (uint64) holds each buffer's
  address and ``strides`` its bytes per slot. For every buffer, slot ``tgt_loc[j]`` receives the
  bytes of slot ``src_loc[j]``. The pool calls it to move cached tokens (``_move_kv_cache_impl``)
  and once at start as a warm-up (slot 0 onto itself). As in the GPU kernel, every source slot is
  read before any target slot is written, so overlapping sets are safe; a target named twice gets
  one of its sources, which one unspecified (the GPU kernel leaves it open too).
* ``assign_req_to_token_pool_cpu``: after slots are allocated for a batch, each request's row of
  the request-to-token table gets its new slots.

The speculative-decoding ops SGLang imports on the same path (``fill_bonus_tokens_cpu``,
``verify_tree_greedy_cpu``, ...) exist by name only and raise when called: EAGLE-3 speculative
decoding cannot be served from this venv.

No ``torch.ops.sgl_kernel`` op is registered, so SGLang's Intel AMX backend check
(``_is_intel_amx_backend_available``: ``torch.ops.sgl_kernel.convert_weight_packed``) stays
false and the server takes its plain-torch paths.
"""

from __future__ import annotations

import ctypes

import torch

# SGLang's speculative-decoding modules import these names on every CPU server (spec_tree.py,
# cache_locs.py, eagle.py, multi_layer_eagle.py under sglang/kernels/ops/speculative/); only a
# speculative server calls them. They raise: EAGLE-3 cannot be served from this venv.
_SPECULATIVE_OPS = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
)

__all__ = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu", *_SPECULATIVE_OPS]

# Marks this stand-in; setup_sglang_cpu.sh and checks read it.
EAGLE3_CPU_STAND_IN = True

_U64 = (1 << 64) - 1


def _slot_rows(address: int, slot_bytes: int, num_slots: int) -> torch.Tensor:
    """The first ``num_slots`` slots of the buffer at ``address`` as a uint8 [slots, bytes] view."""
    raw = (ctypes.c_uint8 * (slot_bytes * num_slots)).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(num_slots, slot_bytes)


def _locations(loc: torch.Tensor, name: str) -> torch.Tensor:
    loc = loc.reshape(-1).to(device="cpu", dtype=torch.int64)
    if loc.numel() and int(loc.min()) < 0:
        raise ValueError(f"copy_all_layer_kv_cache_cpu: negative slot in {name}")
    return loc


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For each buffer i (address ``data_ptrs[i]``, ``strides[i]`` bytes per slot), copy slot
    ``src_loc[j]`` onto slot ``tgt_loc[j]`` for every j, reading all sources before writing."""
    tgt = _locations(tgt_loc, "tgt_loc")
    src = _locations(src_loc, "src_loc")
    if tgt.numel() != src.numel():
        raise ValueError(
            f"copy_all_layer_kv_cache_cpu: {tgt.numel()} target slots for {src.numel()} sources"
        )
    if data_ptrs.numel() != strides.numel():
        raise ValueError(
            f"copy_all_layer_kv_cache_cpu: {data_ptrs.numel()} buffers, {strides.numel()} strides"
        )
    if tgt.numel() == 0:
        return
    # Only the slots up to the highest one named are viewed: the pool's buffers are longer.
    num_slots = int(torch.maximum(tgt.max(), src.max())) + 1
    addresses = data_ptrs.reshape(-1).cpu().view(torch.int64).tolist()
    for address, slot_bytes in zip(addresses, strides.reshape(-1).cpu().tolist(), strict=True):
        if slot_bytes <= 0:
            continue
        rows = _slot_rows(int(address) & _U64, int(slot_bytes), num_slots)
        rows[tgt] = rows[src]  # the right side is a gathered copy: reads finish before writes


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Request b (row ``req_pool_indices[b]`` of ``req_to_token``, ``pool_len`` columns) gets
    positions ``start_offset[b]:end_offset[b]``; their slots are the next ``end - start`` entries
    of ``out_cache_loc``, which lists the batch's requests one after another in batch order.
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError(
            f"assign_req_to_token_pool_cpu: pool_len {pool_len}, table width {req_to_token.shape[1]}"
        )
    rows = req_pool_indices.reshape(-1).tolist()
    starts = start_offset.reshape(-1).tolist()
    ends = end_offset.reshape(-1).tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        count = int(end) - int(start)
        if count <= 0:
            continue
        req_to_token[int(row), int(start) : int(end)] = out_cache_loc[taken : taken + count].to(
            req_to_token.dtype
        )
        taken += count


def _not_provided(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: not provided by eagle3's CPU stand-in (speculative decoding on "
            "SGLang's CPU engine needs it)"
        )

    op.__name__ = op.__qualname__ = name
    return op


for _name in _SPECULATIVE_OPS:
    globals()[_name] = _not_provided(_name)
del _name
