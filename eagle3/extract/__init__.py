"""Hidden-state extraction (stage `extract`; docs/design.md, 'Capture layer ids'). The store it
fills is `eagle3.states`; the target it runs is loaded by `eagle3.target.decoder`.

Modules, in the order data flows through them:
- `capture`: pre-hooks that capture the residual stream entering the capture layers, padded
  token-budget batches, and the batch plan;
- `sources`: where states come from (`hf` in process; servers through `server_states`: vLLM's with
  `vllm_client` and the KV connector the server loads, `vllm_connector`; SGLang's with
  `sglang_client` and the capture plugin the server loads, `sglang_plugin`);
- `preflight`: disk estimate and refusal before the model loads, and the dry-run plan;
- `runner`: the per-unit loop (reuse, preflight, capture, reject, store); `summary`: its manifest.

Importing this package is cheap; most submodules import torch (and transformers, lazily).
"""

from eagle3.config.choices import EXTRACT_BACKENDS

#: `extract.backend`: where hidden states come from (`eagle3.extract.sources`).
BACKENDS = EXTRACT_BACKENDS
