"""A tiktoken BPE tokenizer loaded as remote code, the kind Kimi-K2.5 ships (`tokenization_kimi.py`).

This file is copied verbatim beside the Kimi-shaped demo target (`eagle3/assets/demo_kimi_target/`)
and named in its `tokenizer_config.json` `auto_map`, so `AutoTokenizer.from_pretrained(...,
trust_remote_code=True)` loads it the way transformers, vLLM and SGLang load Kimi's own. It is why
the demo_kimi chain runs the code paths a Kimi user's run takes: a slow (Python) tokenizer with no
`backend_tokenizer`, whose plain-text encoding is tiktoken's `encode_ordinary` on `.model`, and
whose added tokens live above the BPE ranks. It imports nothing from eagle3 (it must load alone).

Token strings are the ranks' bytes written with GPT-2's byte-to-character table, so
`convert_tokens_to_string` (which servers use to detokenize incrementally) can give the bytes back.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from typing import Any, Optional

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import AddedToken, PreTrainedTokenizer

#: GPT-2's pre-tokenizer pattern: the one the ranks were trained under (a different split would
#: meet merges the training never saw).
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
VOCAB_FILE = "tiktoken.model"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


class TikTokenTokenizer(PreTrainedTokenizer):
    """A tiktoken `Encoding` over `tiktoken.model` ranks, with the added tokens of `tokenizer_config.json`."""

    vocab_files_names = {"vocab_file": VOCAB_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, added_tokens_decoder: Optional[dict[int, AddedToken]] = None,
                 **kwargs: Any) -> None:
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        added = {int(i): str(getattr(tok, "content", tok)) for i, tok in (added_tokens_decoder or {}).items()}
        self.model = tiktoken.Encoding(name=os.path.basename(os.path.dirname(os.path.abspath(vocab_file))),
                                       pat_str=PAT_STR, mergeable_ranks=ranks,
                                       special_tokens={text: i for i, text in added.items()})
        byte_chars = bytes_to_unicode()
        self._id_to_token = {rank: "".join(byte_chars[b] for b in piece) for piece, rank in ranks.items()}
        self._token_to_id = {token: rank for rank, token in self._id_to_token.items()}
        self._char_to_byte = {char: byte for byte, char in byte_chars.items()}
        self._base_size = len(ranks)
        super().__init__(added_tokens_decoder=added_tokens_decoder or {}, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self._base_size

    def get_vocab(self) -> dict[str, int]:
        vocab = dict(self._token_to_id)
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._id_to_token[i] for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._token_to_id[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_token[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self.added_tokens_encoder:
                data += token.encode("utf-8")
            else:
                data += bytes(self._char_to_byte[char] for char in token)
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None) -> tuple[str, ...]:
        target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILE)
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)
