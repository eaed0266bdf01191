"""A user's own target and data for tests: a random local Llama with its own chat template, and its chats.

Issue 16's new user does not bring the demo target: they bring a local Llama checkpoint whose
tokenizer has its own chat template (not Kimi's) and a jsonl of OpenAI-style conversations. The
helpers here build both in a few seconds on a CPU, so tests can run the pipeline on a target the
package has never seen:

* `build_tiny_llama`: a seeded, random-weight `LlamaForCausalLM` (float32, safetensors) with the
  demo tokenizer's BPE plus Llama-3-style special tokens and a Llama-3-style template. The
  template keeps every turn as written (stage tokenize derives loss masks from render
  boundaries, `eagle3.data.render`), ends the generation prompt with a special token and a
  single newline (so no BPE merge straddles a mask boundary), and renders `tools` when given.
* `write_conversations`: deterministic multi-turn `{"id", "messages"}` records, some with a
  system message.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Optional

from eagle3.paths import PROJECT_ROOT

DEMO_TOKENIZER = PROJECT_ROOT / "eagle3" / "assets" / "demo_target"
# Only the BPE and its config are taken from the demo: its chat_template.jinja is Kimi's.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

BOS, EOS = "<|begin_of_text|>", "<|eot_id|>"
HEADER_OPEN, HEADER_CLOSE = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = (BOS, HEADER_OPEN, HEADER_CLOSE, EOS)

# Llama-3-shaped, with one newline after the header: Llama 3's "\n\n" would merge into one BPE
# token across the mask boundary with this byte-level pre-tokenizer (a `boundary_merge` reject).
# Nothing follows <|eot_id|>: text after the end-of-turn token would fall inside the assistant's
# generated span (render boundaries end at the next turn) and be trained as target output.
LLAMA_STYLE_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|start_header_id|>tools<|end_header_id|>\\n' + (tools | tojson) + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{%- if message.get('tool_calls') %}{{- message['tool_calls'] | tojson }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n' }}{%- endif %}"
)


def build_tiny_llama(directory: Path, *, layers: int = 8, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                     chat_template: str = LLAMA_STYLE_TEMPLATE, seed: int = 0) -> Path:
    """Write a random LlamaForCausalLM checkpoint with its own tokenizer and template into `directory`.

    The vocabulary is the demo BPE plus `SPECIAL_TOKENS`, and the model's vocab is exactly the
    tokenizer's length (so a model YAML states it as `len(tokenizer)`, see `vocab_size_of`).

    Returns:
        `directory`, which then holds config.json, model.safetensors, generation_config.json and
        the tokenizer files (the chat template included).
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    staging = directory.with_name(directory.name + ".tokenizer")
    staging.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(DEMO_TOKENIZER / name, staging / name)
    tokenizer = AutoTokenizer.from_pretrained(str(staging))
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.bos_token, tokenizer.eos_token = BOS, EOS
    tokenizer.chat_template = chat_template
    shutil.rmtree(staging)

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def vocab_size_of(directory: Path) -> int:
    """The checkpoint's vocab_size as its config.json states it (what a model YAML must repeat)."""
    return int(json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))["vocab_size"])


_TOPICS = ("lists", "dictionaries", "file paths", "regular expressions", "dates", "sorting", "sets", "strings")
_ASKS = ("How do I use {t} in Python?", "Show a short example with {t}.", "What is a common mistake with {t}?",
         "Explain {t} in two sentences.")
_FOLLOW_UPS = ("And how would I test that?", "Can you make it shorter?", "Why does that work?")
_SYSTEMS = ("You are a concise Python tutor.", "Answer in plain English, briefly.")


def _answer(rng: random.Random, topic: str, turn: int) -> str:
    words = ["use", "the", "built-in", topic, "with", "care", "and", "check", "each", "step", "first"]
    rng.shuffle(words)
    return f"Step {turn + 1}: " + " ".join(words) + "."


def write_conversations(path: Path, n: int, *, seed: int = 0, max_turns: int = 3,
                        system_every: int = 3, id_prefix: Optional[str] = "chat") -> Path:
    """Write `n` OpenAI-style conversations (`{"id", "messages"}`) as jsonl, the same for the same seed.

    Conversations have 1..max_turns user/assistant exchanges; every `system_every`-th opens with a
    system message. Every prompt differs (prep dedupes by prompt).

    Returns:
        `path`.
    """
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            topic = _TOPICS[i % len(_TOPICS)]
            messages = []
            if system_every and i % system_every == 0:
                messages.append({"role": "system", "content": _SYSTEMS[i % len(_SYSTEMS)]})
            for turn in range(1 + i % max_turns):
                ask = _ASKS[(i + turn) % len(_ASKS)].format(t=topic) if turn == 0 else _FOLLOW_UPS[turn % 3]
                messages.append({"role": "user", "content": f"{ask} (#{i})" if turn == 0 else ask})
                messages.append({"role": "assistant", "content": _answer(rng, topic, turn)})
            fh.write(json.dumps({"id": f"{id_prefix}-{i:04d}", "messages": messages}) + "\n")
    return path
