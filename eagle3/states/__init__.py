"""The hidden-state store: what extraction writes and training reads (docs/design.md, 'Data formats').

It sits below both `eagle3.extract` (which fills it) and `eagle3.draft` (which trains on it), so
neither imports the other for it.

- `formats`: the storage formats (bf16 / fp8 / fp32 / compact) by name and their bytes per token (torch-free);
- `codec`: their encodings (fp8 with per-token scales, compact's int8 groups and top-k teacher) and the measured error;
- `store`, `writer`: content-keyed safetensors shards + per-job index files (reader, writer);
- `dataset`: the map-style Datasets the trainer reads (stored, or computed online by a source it is handed);
- `hybrid`: the dataset that computes a sample once, stores it, and reads it afterwards.

Importing this package is cheap; most submodules import torch.
"""
