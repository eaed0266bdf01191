"""EAGLE-3 for target architectures whose vLLM class lacks it (Gemma 3 in vLLM 0.32), as a vLLM plugin.

vLLM serves an EAGLE-3 draft, and hands out hidden states (`extract_hidden_states`), only for a
target class implementing `SupportsEagle3`: its decoder must return, beside the last hidden state,
the residual stream entering each layer the draft reads. vLLM 0.32's `Gemma3ForCausalLM` does not,
so a Gemma 3 target dies with "Model does not support EAGLE3 interface" although nothing about
Gemma prevents it. This module registers, under the same architecture name, a subclass whose
decoder collects those states exactly as vLLM's Llama does (`EagleModelMixin`: the input of layer
i is `hidden + residual` after layer i - 1; layer 0's is the scaled embedding), so the draft reads
what transformers' `hidden_states[i]` holds, the states eagle3 trains on.

vLLM loads it in every process through the `vllm.general_plugins` entry point that the
`.dist-info` beside this file declares; eagle3 puts this directory on the PYTHONPATH of the vLLM
servers it launches. It imports vLLM and torch only, registers nothing for an architecture whose
vLLM class already implements `SupportsEagle3`, and leaves vLLM as it was if the classes it
extends are not where it expects them (another vLLM version): the server then says what it says
without the plugin.
"""

from __future__ import annotations

import logging
from itertools import islice

log = logging.getLogger("eagle3_vllm_models")

#: Architectures given EAGLE-3 here: the vLLM module that defines them, and the decoder class inside.
SHIMS = {"Gemma3ForCausalLM": ("vllm.model_executor.models.gemma3", "Gemma3Model")}


def register() -> None:
    """vLLM's plugin hook (every process, possibly several times): register the EAGLE-3 classes."""
    import importlib

    from vllm import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    for arch, (module_name, decoder_name) in SHIMS.items():
        try:
            module = importlib.import_module(module_name)
            causal_lm, decoder = getattr(module, arch), getattr(module, decoder_name)
        except (ImportError, AttributeError) as err:  # another vLLM: leave it as it is
            log.warning("eagle3: not adding EAGLE-3 to %s (%s)", arch, err)
            continue
        if supports_eagle3(causal_lm):
            continue
        ModelRegistry.register_model(arch, with_eagle3(module, causal_lm, decoder))


def with_eagle3(module, causal_lm: type, decoder: type) -> type:
    """A subclass of `causal_lm` implementing `SupportsEagle3`, whose decoder collects aux states."""
    from vllm.distributed import get_pp_group
    from vllm.model_executor.models.interfaces import EagleModelMixin, SupportsEagle3

    class DecoderWithAux(EagleModelMixin, decoder):
        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
            if not self.aux_hidden_state_layers:
                return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            if get_pp_group().world_size > 1:
                raise NotImplementedError(f"eagle3's EAGLE-3 {decoder.__name__} runs without pipeline parallelism")
            hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)  # [T, H]
            residual = None
            aux: list = []
            self._maybe_add_hidden_state(aux, self.start_layer, hidden, residual)
            for index, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer),
                                          start=self.start_layer):
                hidden, residual = layer(positions, hidden, residual, **kwargs)
                self._maybe_add_hidden_state(aux, index + 1, hidden, residual)  # the input of layer index + 1
            hidden, _ = self.norm(hidden, residual)
            return hidden, aux

    DecoderWithAux.__name__ = DecoderWithAux.__qualname__ = f"{decoder.__name__}WithAux"

    class CausalLMWithEagle3(causal_lm, SupportsEagle3):
        def __init__(self, *, vllm_config, prefix: str = ""):  # vLLM passes these by name (it reads the signature)
            # The parent builds its decoder by the module's name for it: that name is ours while it does.
            setattr(module, decoder.__name__, DecoderWithAux)
            try:
                super().__init__(vllm_config=vllm_config, prefix=prefix)
            finally:
                setattr(module, decoder.__name__, decoder)

    CausalLMWithEagle3.__name__ = CausalLMWithEagle3.__qualname__ = f"{causal_lm.__name__}WithEagle3"
    return CausalLMWithEagle3
