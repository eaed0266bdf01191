"""The serving engines by name, and the draft layers each serves: plain constants, no eagle3 imports.

A leaf, below `eagle3.config` (its resolvers default a draft's layer by the engine that will serve
it) and `eagle3.layer_ids` (ids are converted per engine). What a launcher or client needs beyond
the names (profiles, algorithms, health paths, sm120 facts) lives in `eagle3.serving.engines`,
which re-exports these; the layer variants' meaning is `eagle3.draft.options`'s.
"""

from __future__ import annotations

#: The in-process transformers target (no server process): `generate.backend=hf`; as `server.backend`, no engine.
IN_PROCESS = "hf"
SGLANG, VLLM = "sglang", "vllm"
#: Backends that run as an HTTP server process this project launches (or connects to).
ENGINES = (SGLANG, VLLM)
#: Every valid `generate.backend` and `server.backend` (and a server node's `backend`).
SERVER_BACKENDS = (IN_PROCESS, *ENGINES)

#: `model.draft` layer variants (booleans; all false = the EAGLE-3 layer of the paper and SGLang):
#: norm_before_residual: the residual is the hidden state after hidden_norm, not before;
#: norm_before_fc: one RMSNorm over the concatenated captured states before fc;
#: fc_norm: one RMSNorm per captured state before fc (excludes norm_before_fc);
#: norm_output: the next step reads the final-normed state, not the pre-norm one.
LAYER_VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
#: The engines that serve each variant as trained. vLLM 0.32 (model_executor/models/llama_eagle3.py)
#: reads all four config keys. SGLang's llama_eagle3.py reads none of them: it would load such a
#: draft without an error (unknown tensors are skipped) and run the plain layer, so it is refused.
VARIANT_ENGINES = {variant: (VLLM,) for variant in LAYER_VARIANTS}
#: The layer a draft gets unless `model.draft.<variant>` is set, by the engine that will serve it
#: (`server.backend`; `hf` = no engine yet, the draft is exported for those that serve it). The
#: variants an engine serves that won the ablation on two targets x two seeds (BENCHMARKS.md
#: "Defaults that carry"); SGLang serves none, so its drafts keep the plain layer.
SERVING_LAYER = {VLLM: ("norm_before_residual",), IN_PROCESS: ("norm_before_residual",), SGLANG: ()}


def serving_layer_default(variant: str, backend: str) -> bool:
    """Whether `variant` is on by default for a draft served by `backend` (see SERVING_LAYER)."""
    if variant not in LAYER_VARIANTS:
        raise ValueError(f"unknown draft layer variant {variant!r}; valid: {', '.join(LAYER_VARIANTS)}")
    return variant in SERVING_LAYER.get(backend, ())
