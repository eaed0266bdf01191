"""eagle3's SGLang plugin: the served target hands out its hidden states (`extract.backend=sglang`).

SGLang sets up aux hidden-state capture only when it serves a target for an EAGLE-3 draft. This
plugin does it for a target served alone, so `/generate` with `return_hidden_states` (the server
runs with `--enable-return-hidden-states`) answers each prompt token's captured states. SGLang
loads it itself, in every process it starts: the extraction launcher copies this file beside a
`.dist-info` naming it in the entry-point group `sglang.srt.plugins` and puts that directory on the
server's PYTHONPATH (`eagle3.extract.sglang_source`). Nothing of SGLang's source is patched; the
plugin registers an AFTER hook (SGLang's `HookRegistry`) on the model runner's attention setup,
which runs after the model is loaded and before any CUDA graph is captured, so a GPU server
captures the same way with its own kernels.

What the hook does to the target's model (not to a draft worker's):

* `set_eagle3_layers_to_capture(...)`, SGLang's own switch, so the model returns `(hidden, aux)`
  and the logits processor hands `cat(aux)` out as the hidden states;
* then the module that holds `layers_to_capture` gets exactly the capture layers in eagle3's
  numbering (capture i = the residual stream entering decoder layer i = transformers'
  `hidden_states[i]`): SGLang's classes convert the ids they are given differently (Llama-family
  ones add 1; its DeepSeek class adds 1 only when the first id is 1), and the capture here must
  not depend on the family;
* a forward hook on that module appends the model's output -- the final-normed state, the
  teacher -- after the captured layers, so one answer carries `[T, (C + 1) * H]`.

Self-contained (torch and SGLang only): it runs inside the server's own environment. The capture
layers come from the environment variable `CAPTURE_ENV` (comma-separated), which the launcher sets.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: Comma-separated capture layers in eagle3's numbering, set by the launcher.
CAPTURE_ENV = "EAGLE3_SGLANG_CAPTURE_LAYERS"
#: The dist-info name and entry point the launcher writes (`sglang.srt.plugins`: name = module:function).
DIST_NAME = "eagle3-sglang-capture"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT = "eagle3_capture"
HOOKED = "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"
#: Logged once per process by the hook; the client and tests look for it in the server log.
READY_MARK = "eagle3 capture plugin:"


def capture_layers_from_env() -> list[int]:
    raw = os.environ.get(CAPTURE_ENV, "").strip()
    return [int(x) for x in raw.split(",") if x.strip()]


def register() -> None:
    """SGLang's entry point: hook the runner's attention setup (no-op without `CAPTURE_ENV`)."""
    layers = capture_layers_from_env()
    if not layers:
        logger.warning("%s %s is not set: hidden states are not captured", READY_MARK, CAPTURE_ENV)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def after_attention_setup(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(runner, "is_draft_worker", False):
            return None
        enable_capture(runner.model, layers)
        return None

    HookRegistry.register(HOOKED, after_attention_setup, HookType.AFTER)


def _capturing_module(model: Any) -> Any:
    """The decoder stack SGLang's capture switch configured: the module holding `layers_to_capture`."""
    found = [m for m in model.modules() if getattr(m, "layers_to_capture", None)]
    if len(found) != 1:
        raise RuntimeError(f"{READY_MARK} expected one module with layers_to_capture in {type(model).__name__}, "
                           f"found {len(found)}")
    return found[0]


def enable_capture(model: Any, layers: list[int]) -> None:
    """Make `model` return the states entering `layers` and its final-normed state (module docstring)."""
    import torch

    model.set_eagle3_layers_to_capture([i - 1 for i in layers])  # SGLang's switch; ids fixed below
    stack = _capturing_module(model)
    stack.layers_to_capture = list(layers)
    num_layers = len(getattr(stack, "layers", ()))
    if num_layers and not all(0 <= i < num_layers for i in layers):
        raise RuntimeError(f"{READY_MARK} capture layers {layers} out of range for {num_layers} layers")

    def append_final(module: Any, inputs: Any, output: Any) -> Any:
        if not (isinstance(output, tuple) and len(output) == 2):
            return None  # a pipeline stage's hand-off, or nothing captured
        hidden, aux = output
        if isinstance(aux, torch.Tensor):  # SGLang's packed [T, C * H]
            return hidden, torch.cat([aux, hidden], dim=-1)
        aux.append(hidden.clone())
        return hidden, aux

    stack.register_forward_hook(append_final)
    logger.warning("%s pid %d, %s captures layers %s and the final-normed state", READY_MARK, os.getpid(),
                   type(model).__name__, list(layers))
