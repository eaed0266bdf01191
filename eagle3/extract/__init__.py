"""Hidden-state extraction (stage `extract`) and the hidden-state store (docs/design.md, 'Data
formats', 'Capture layer ids').

Modules, in the order data flows through them:
- `target`: load the target (transformers) and find its decoder layers and final norm;
- `capture`: pre-hooks that capture the residual stream entering the capture layers, padded
  token-budget batches, and the batch plan;
- `sources`: where states come from (`hf` in process; servers through `server_states`: vLLM's with
  `vllm_client` and the KV connector the server loads, `vllm_connector`; SGLang's with
  `sglang_client` and the capture plugin the server loads, `sglang_plugin`);
- `formats`: the storage formats (bf16 / fp8 / fp32) by name and their bytes per token (torch-free);
- `codec`: their encodings (fp8 with per-token scales) and the measured error;
- `store`, `writer`: content-keyed safetensors shards + per-job index files (reader, writer);
- `preflight`: disk estimate and refusal before the model loads, and the dry-run plan;
- `runner`: the per-unit loop (reuse, preflight, capture, reject, store); `summary`: its manifest;
- `dataset`: the map-style Dataset the trainer reads.

Importing this package is cheap; most submodules import torch (and transformers, lazily).
"""

from eagle3.engines import IN_PROCESS, SGLANG, VLLM

#: `extract.backend`: where hidden states come from (`eagle3.extract.sources`).
BACKENDS = (IN_PROCESS, VLLM, SGLANG)
