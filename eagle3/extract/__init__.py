"""Hidden-state extraction (stage `extract`) and the hidden-state store (DESIGN.md §3, §4).

Modules, in the order data flows through them:
- `target`: load the target (transformers) and find its decoder layers and final norm;
- `capture`: pre-hooks that capture the residual stream entering the capture layers, padded
  token-budget batches, and the batch plan;
- `formats`: bf16 / fp8 (per-token scales) / fp32 encodings, bytes per token, measured error;
- `store`: content-keyed safetensors shards + per-job index files (writer and reader);
- `preflight`: disk estimate and refusal before the model loads, and the dry-run plan;
- `runner`: the per-unit loop (reuse, preflight, capture, reject, store);
- `dataset`: the map-style Dataset the trainer reads.

Importing this package is cheap; the submodules import torch (and transformers, lazily).
"""

#: `extract.backend`: where hidden states come from (the in-process transformers forward).
BACKENDS = ("hf",)
