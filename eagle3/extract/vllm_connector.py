"""The KV connector a vLLM server loads to hand eagle3 the hidden states of each prompt.

vLLM's `extract_hidden_states` speculative method (vLLM PR #33736, 0.32) caches the captured
layers of every prompt token in a cache-only attention layer; a KV connector then writes them out
and returns the file's path in the response's `kv_transfer_params["hidden_states_path"]`. vLLM's
reference connector (`ExampleHiddenStatesConnector`) copies through CUDA streams into pinned
memory, which fails on vLLM's CPU build ("pin_memory=True requires a CUDA or other accelerator
backend"). This one gathers the request's cache slots synchronously (on the CPU, or from the GPU
with one blocking copy), then writes the safetensors file in a writer thread to a temporary name
and renames it into place: a client sees the file whole or not at all, and needs no file lock
(`use_synchronization_lock` is set false by the launcher).

The launcher copies this file into the job's run directory as `eagle3_vllm_connector.py`, puts
that directory on the server's PYTHONPATH and names it in `--kv-transfer-config`
(`kv_connector_module_path`), so the server's environment needs vLLM and torch but not eagle3.
Importing this module needs no vLLM: the class is built on first access (`CONNECTOR_NAME`), so
the package stays importable in an environment without it.
"""

from __future__ import annotations

import os
import uuid
from functools import partial
from typing import Any

__all__ = ["CONNECTOR_NAME", "HIDDEN_STATES_KEY", "MODULE", "TOKEN_IDS_KEY"]

CONNECTOR_NAME = "Eagle3HiddenStatesConnector"
MODULE = __name__
#: Tensors of a written file: `[num_tokens, num_layers, hidden]` states and the `[num_tokens]` prompt ids.
HIDDEN_STATES_KEY, TOKEN_IDS_KEY = "hidden_states", "token_ids"
_built: dict[str, type] = {}


class _Done:
    """The "copy finished" marker vLLM's connector polls: ours completes before it is stored."""

    @staticmethod
    def query() -> bool:
        return True


def _write_atomically(tensors: dict[str, Any], filename: str) -> None:
    from safetensors.torch import save_file

    tmp = f"{filename}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        save_file(tensors, tmp)
        os.replace(tmp, filename)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _build() -> type:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        extract_from_kv_cache,
    )

    class Eagle3HiddenStatesConnector(ExampleHiddenStatesConnector):
        """`ExampleHiddenStatesConnector` with a synchronous gather and an atomic file (see the module)."""

        def _submit_async_write(self, pending: Any) -> None:
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(self._block_size, dtype=torch.long)
            slots = (offsets.reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
            num_tokens = int(pending.token_ids.shape[0])
            states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), num_tokens)
            tensors = {HIDDEN_STATES_KEY: states.to("cpu").contiguous().clone(),
                       TOKEN_IDS_KEY: pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            future = self._executor.submit(_write_atomically, tensors, pending.filename)
            self._req_copy_events[pending.req_id] = _Done()
            self._req_futures[pending.req_id] = future
            future.add_done_callback(partial(self._on_write_done, pending.req_id))

    return Eagle3HiddenStatesConnector


def __getattr__(name: str) -> Any:
    """The connector class, built (importing vLLM) when vLLM's connector factory asks for it."""
    if name != CONNECTOR_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = _build()
    return _built[name]
