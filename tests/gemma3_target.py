"""A tiny random Gemma 3 target with the demo target's tokenizer and chat template, for the chain.

Gemma 3's traits the engines must get right are all here: the `(1 + weight)` RMSNorms (weights far
from 0 so a wrong convention shows), the embedding scaled by sqrt(hidden), sliding-window layers
beside a full one (the default 5:1 pattern over 8 layers), GELU. The demo tokenizer makes the
chain's data stages run on it unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagle3.paths import asset_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def build_tiny_gemma3(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    demo = asset_path("demo_target")
    ids = {k: v for k, v in json.loads((demo / "config.json").read_text()).items()
           if k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    config = Gemma3TextConfig(**ids, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=8,
                              max_position_embeddings=4096)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.normal_(0.0, 0.5)
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copyfile(demo / name, path / name)
    return path
