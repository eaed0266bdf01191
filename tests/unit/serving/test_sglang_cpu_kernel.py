"""The pure-Python `sgl_kernel` ops SGLang's CPU engine calls (eagle3/serving/sglang_cpu_kernel.py),
against naive references: the KV-slot copy over every layer buffer and the request-table fill."""

from __future__ import annotations

import pytest
import torch

from eagle3.serving import sglang_cpu_kernel as kernel


def test_kv_copy_moves_every_buffer_reading_all_sources_before_writing():
    torch.manual_seed(0)
    buffers = [torch.randn(12, 3, 4), torch.randn(12, 2, 8).to(torch.bfloat16), torch.randn(12, 5), torch.randn(12, 1)]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    src, tgt = torch.tensor([2, 3, 4, 9]), torch.tensor([3, 4, 5, 0])  # overlapping: 3 and 4 are read and written
    kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for buf, old in zip(buffers, before, strict=True):
        expected = old.clone()
        for t, s in zip(tgt.tolist(), src.tolist(), strict=True):
            expected[t] = old[s]  # every source as it was before the call
        assert torch.equal(buf, expected)
    kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([], dtype=torch.int64),
                                       torch.tensor([], dtype=torch.int64))  # the warm-up's empty call
    with pytest.raises(ValueError, match="2 target slots for 1 sources"):
        kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0, 1]), torch.tensor([1]))


def test_request_table_gets_each_requests_new_slots_in_batch_order():
    table = torch.full((4, 10), -1, dtype=torch.int32)
    slots = torch.arange(100, 107)
    kernel.assign_req_to_token_pool_cpu(torch.tensor([2, 0, 3]), table, torch.tensor([0, 4, 7]),
                                        torch.tensor([3, 7, 8]), slots, 10)
    assert table[2, :3].tolist() == [100, 101, 102] and table[0, 4:7].tolist() == [103, 104, 105]
    assert table[3, 7].item() == 106 and int((table >= 0).sum()) == 7
    with pytest.raises(ValueError, match="pool_len 9"):
        kernel.assign_req_to_token_pool_cpu(torch.tensor([0]), table, torch.tensor([0]), torch.tensor([1]), slots, 9)


def test_speculative_ops_exist_by_name_and_refuse_in_one_line():
    assert kernel.EAGLE3_CPU_STAND_IN is True
    with pytest.raises(NotImplementedError, match="verify_tree_greedy_cpu: not provided by eagle3's CPU stand-in"):
        kernel.verify_tree_greedy_cpu()
