"""Hidden states from vLLM servers: the client of `extract.backend=vllm` (and online training with it).

Each prompt is one `/v1/completions` request (its token ids, one generated token) to a server
running vLLM's `extract_hidden_states` method with eagle3's connector
(`eagle3.extract.vllm_connector`); the answer's `kv_transfer_params["hidden_states_path"]` names
the file the server writes right after. The file is waited for, read, checked (its token ids are
the prompt's, its shape is `[T, C + 1, H]`, its values are finite) and removed. The `C` capture
states become `aux [T, C*H]`; the last one, vLLM's residual after the last layer, becomes the
teacher `final [T, H]` through the target's own final norm (transformers returns it normed).

Concurrency, retries and the stop when the server looks down are `eagle3.extract.server_states`'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagle3.extract.server_states import RetryRequest, ServerDown, ServerStates, States, post_json

if TYPE_CHECKING:
    from eagle3.config.client_schema import ExtractHTTPConfig
    from eagle3.serving.http import Client

__all__ = ["VLLMStates"]

log = logging.getLogger("eagle3")
_POLL_S = 0.02


class VLLMStates(ServerStates):
    """Hidden states of token sequences from vLLM servers (see the module docstring).

    Args:
        urls, settings, n_capture: As `ServerStates`; C excludes the final residual.
        final_norm: The target's final norm `(weight [H], eps)`.
    """

    name = "vllm"

    def __init__(self, urls: Sequence[str], settings: ExtractHTTPConfig, n_capture: int,
                 final_norm: tuple[torch.Tensor, float]) -> None:
        super().__init__(urls, settings, n_capture)
        self.norm_weight, self.norm_eps = final_norm

    async def _fetch(self, client: Client, url: str, ids: list[int]) -> tuple[dict[str, torch.Tensor], str]:
        path = await self._request(client, url, ids)
        return await self._read(Path(path)), path

    async def _request(self, client: Client, url: str, ids: list[int]) -> str:
        """One completion request; the path of the states file it names."""
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        answer = await post_json(client, url, "/v1/completions", body, self.settings.request_timeout_s,
                                 f"{len(ids)} tokens")
        path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise ServerDown(f"extract.server: {url} answers without kv_transfer_params.hidden_states_path: it does "
                             "not run vLLM's extract_hidden_states method with eagle3's connector; leave "
                             "extract.server.urls empty (the job launches it), or start it with "
                             "`python scripts/run.py stage=serve serve.hidden_states=true extract.backend=vllm`")
        return str(path)

    async def _read(self, path: Path) -> dict[str, torch.Tensor]:
        """Wait for the server's file (written whole, then renamed), load it, remove it."""
        from safetensors.torch import load_file

        deadline = time.monotonic() + self.settings.file_wait_s
        while not path.is_file():
            if time.monotonic() >= deadline:
                raise RetryRequest(f"{path}: not written within {self.settings.file_wait_s:g} s "
                                   "(extract.http.file_wait_s; with extract.server.urls, extract.http.exchange_dir "
                                   "must be shared with the server)")
            await asyncio.sleep(_POLL_S)
        try:
            return load_file(str(path))
        finally:
            path.unlink(missing_ok=True)

    def _convert(self, ids: list[int], data: dict[str, torch.Tensor], path: str) -> States:
        from eagle3.extract.vllm_connector import HIDDEN_STATES_KEY, TOKEN_IDS_KEY
        from eagle3.target.weights import rms_norm

        states, token_ids = data.get(HIDDEN_STATES_KEY), data.get(TOKEN_IDS_KEY)
        if states is None or token_ids is None:
            return "bad_hidden_states", f"{path} lacks {HIDDEN_STATES_KEY}/{TOKEN_IDS_KEY}: {sorted(data)}"
        if token_ids.tolist() != ids:
            return "hidden_states_mismatch", f"{path} holds the states of other token ids ({len(token_ids)} ids)"
        hidden = self.norm_weight.shape[0]
        want = (len(ids), self.n_capture + 1, hidden)
        if tuple(states.shape) != want:
            return "bad_hidden_states", f"{path} has shape {list(states.shape)}, expected {list(want)}"
        aux = states[:, : self.n_capture].reshape(len(ids), self.n_capture * hidden)  # [T, C*H]
        final = rms_norm(states[:, self.n_capture], self.norm_weight, self.norm_eps)  # [T, H]
        return aux, final
