"""Hidden states from SGLang servers: the client of `extract.backend=sglang` (and online training with it).

The server runs the target with eagle3's capture plugin (`eagle3.extract.sglang_plugin`) and
`--enable-return-hidden-states`. Each prompt is one native `/generate` request (its token ids, one
greedy token, `return_hidden_states`); the answer's `meta_info.hidden_states[0]` holds one row per
prompt token: the C capture layers side by side, then the final-normed state -- transformers'
`hidden_states[i]` for each capture i, and the teacher as it is (no norm to apply here, unlike
vLLM's residual). The rows are checked (one per prompt token, `(C + 1) * H` values, finite) and
split into `aux [T, C*H]` and `final [T, H]`.

The states travel as JSON numbers: exact for fp32 and bf16 targets (Python floats hold both), and
~20 bytes per value on the wire, which at Kimi-K2.5's `(3 + 1) * 7168` values per token is ~0.6 MB
per token; vLLM's route writes files instead (BENCHMARKS.md compares the two on the demo).
Concurrency, retries and the stop when the server looks down are `eagle3.extract.server_states`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from eagle3.extract.server_states import ServerDown, ServerStates, States, post_json

if TYPE_CHECKING:
    from eagle3.config.client_schema import ExtractHTTPConfig
    from eagle3.serving.http import Client

__all__ = ["SGLangStates"]


class SGLangStates(ServerStates):
    """Hidden states of token sequences from SGLang servers running eagle3's plugin (module docstring).

    Args:
        urls, settings, n_capture: As `ServerStates`.
        hidden_size: H, the target's width (the rows are `(C + 1) * H` wide).
    """

    name = "sglang"

    def __init__(self, urls: Sequence[str], settings: ExtractHTTPConfig, n_capture: int, hidden_size: int) -> None:
        super().__init__(urls, settings, n_capture)
        self.hidden_size = int(hidden_size)

    async def _fetch(self, client: Client, url: str, ids: list[int]) -> tuple[Any, str]:
        body = {"input_ids": ids, "return_hidden_states": True,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        answer = await post_json(client, url, "/generate", body, self.settings.request_timeout_s, f"{len(ids)} tokens")
        meta = answer.get("meta_info") or {}
        hidden = meta.get("hidden_states")
        if not hidden:
            raise ServerDown(f"extract.server: {url} answers /generate without meta_info.hidden_states: it does not "
                             "run with --enable-return-hidden-states and eagle3's capture plugin; leave "
                             "extract.server.urls empty (the job launches it), or start it with "
                             "`python scripts/run.py stage=serve serve.hidden_states=true extract.backend=sglang`")
        return (hidden[0], meta.get("prompt_tokens")), f"{url}/generate"

    def _convert(self, ids: list[int], data: Any, where: str) -> States:
        table, prompt_tokens = data
        if prompt_tokens is not None and int(prompt_tokens) != len(ids):
            return "hidden_states_mismatch", (f"{where}: the server read {prompt_tokens} prompt tokens, "
                                              f"not the {len(ids)} sent")
        width = (self.n_capture + 1) * self.hidden_size
        try:
            rows = torch.tensor(table, dtype=torch.float32)  # [T, (C + 1) * H]
        except (TypeError, ValueError) as exc:
            return "bad_hidden_states", f"{where}: hidden_states[0] is not a table of numbers ({exc})"
        if rows.dim() == 1 and len(ids) == 1:
            rows = rows[None]
        if tuple(rows.shape) != (len(ids), width):
            if rows.dim() == 2 and rows.shape[1] == width:
                return "hidden_states_mismatch", (f"{where}: {rows.shape[0]} rows of states for {len(ids)} prompt "
                                                  "tokens (a cached prefix is not recomputed: run the server "
                                                  "with --disable-radix-cache, as the launcher does)")
            return "bad_hidden_states", (f"{where}: states of shape {list(rows.shape)}, expected "
                                         f"[{len(ids)}, {width}] ({self.n_capture} capture layers + the final "
                                         f"state, {self.hidden_size} wide)")
        if not torch.isfinite(rows).all():
            return "bad_hidden_states", f"{where}: non-finite hidden states"
        split = self.n_capture * self.hidden_size
        return rows[:, :split].contiguous(), rows[:, split:].contiguous()  # aux [T, C*H], final [T, H]
