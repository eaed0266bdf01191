"""What the command of a server that hands out hidden states adds (stage extract, `serve.hidden_states`).

`eagle3.serving.commands` builds the rest of the command line; the extraction sources
(`eagle3.extract.sources`) say what to capture and where the server finds eagle3's code:

* vLLM: its `extract_hidden_states` speculative method with eagle3's KV connector, which writes
  each prompt's states to a file (`HiddenStateExport`); no prefix caching.
* SGLang: eagle3's capture plugin, loaded by SGLang from the server's PYTHONPATH, and
  `--enable-return-hidden-states` (`SGLangCapture`); no radix cache and prefill chunks as long as
  the context, so every prompt's states come from one forward over all its tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["HiddenStateExport", "SGLangCapture", "capture_env", "capture_flags", "hidden_state_flags"]


@dataclass(frozen=True)
class HiddenStateExport:
    """A vLLM server that hands out hidden states instead of serving a draft (stage extract).

    Attributes:
        layer_ids: vLLM's `eagle_aux_hidden_state_layer_ids` to capture (HF hidden_states
            indices: the capture layers, then `num_layers` for the final residual).
        exchange_dir: Where the server writes each prompt's states file.
        plugin_dir: A directory holding the KV connector module, put on the server's PYTHONPATH.
        connector_module: That module's name.
        connector: The connector class's name.
        max_model_len: Context of the server: the longest prompt plus the token it generates.
    """

    layer_ids: tuple[int, ...]
    exchange_dir: str
    plugin_dir: str
    connector_module: str
    connector: str
    max_model_len: int


def hidden_state_flags(export: HiddenStateExport) -> list[str]:
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(export.layer_ids)}}}
    transfer = {"kv_connector": export.connector, "kv_connector_module_path": export.connector_module,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": export.exchange_dir,
                                              "use_synchronization_lock": False}}
    # Prefix caching would let a prompt reuse blocks another prompt filled: exactness first.
    return ["--speculative-config", json.dumps(spec, separators=(",", ":")),
            "--kv-transfer-config", json.dumps(transfer, separators=(",", ":")), "--no-enable-prefix-caching"]


@dataclass(frozen=True)
class SGLangCapture:
    """An SGLang server that hands out hidden states instead of serving a draft (stage extract).

    Attributes:
        plugin_dir: A directory holding eagle3's capture plugin and the `.dist-info` that names it as
            an SGLang plugin (`eagle3.extract.sglang_plugin`), put on the server's PYTHONPATH.
        plugin_env: What the plugin reads from the server's environment (the capture layers).
        context_length: Context of the server: the longest prompt plus the token it generates.
    """

    plugin_dir: str
    plugin_env: dict[str, str]
    context_length: int


def capture_flags(given: Collection[str], context_length: int) -> list[str]:
    """SGLang extracting: states returned, and each prompt computed whole in one forward (a cached prefix
    or an earlier chunk would not be in the answer): no radix cache, prefill chunks as long as the
    context (`--chunked-prefill-size -1` would do too, but SGLang 0.5.23's CPU memory profile then finds
    no room for the KV cache)."""
    flags = ["--enable-return-hidden-states"]
    if "--disable-radix-cache" not in given:
        flags.append("--disable-radix-cache")
    if "--chunked-prefill-size" not in given:
        flags += ["--chunked-prefill-size", str(int(context_length))]
    return flags


def capture_env(capture: SGLangCapture) -> dict[str, str]:
    path = os.pathsep.join(p for p in (capture.plugin_dir, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **capture.plugin_env}
