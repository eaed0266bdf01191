"""Special-token text inside dataset content is text, never a control token.

A tokenizer matches its added tokens (``<|im_end|>``, ``<think>``, ``<|tool_call_begin|>``) anywhere
in the string it encodes, before any BPE. Rendering a conversation with the chat template and
encoding the result therefore turns a code sample or a template tutorial that *quotes*
``<|im_end|>`` into the real end-of-turn id, inside the loss mask: the draft would learn to end turns
where the target never does (a target that writes that text emits its ordinary pieces, ``<|``,
``im``, ``_end`` ...). Only the template's own scaffolding may yield those ids.

Answers eagle3's generate stage regenerated are the exception (`keep`): decoded from the ids the
target emitted, their added-token text is the target's token (a small target's stray `</think>`), and
re-encoding gives those ids back.

So, before rendering, every occurrence of an added token's text in the conversation's strings is
replaced by a one-character sentinel from Unicode's Supplementary Private Use Area-A (one per
added token, so the escape is reversible and the render sees text of nearly the same shape);
after rendering, every added-token text left in the render is the template's. Encoding then splits
at those (as the tokenizer itself would), and a piece holding sentinels is restored to the
original text and encoded as text (`encode_as_text`: the tokenizer without its added vocabulary).
Conversations without such text (nearly all) take the tokenizer's ordinary path, unchanged.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["LiteralSpecials", "SpecialTextError", "encode_as_text", "literal_specials"]

_SENTINEL_BASE = 0xF0000  # Supplementary Private Use Area-A: 65,534 code points no tokenizer assigns
_SENTINEL_RE = re.compile("[\U000f0000-\U000ffffd]")


class SpecialTextError(ValueError):
    """A conversation whose special-token text cannot be kept as text (the reason says why)."""


@dataclass(frozen=True)
class LiteralSpecials:
    """A tokenizer's added tokens, and how to escape their text in content and encode it back as text.

    Attributes:
        ids: Token id of each added token's text.
        pattern: Matches any added token's text, longest first (as the tokenizer matches them).
    """

    ids: dict[str, int]
    pattern: Optional[re.Pattern]

    def _sentinel(self, text: str) -> str:
        return chr(_SENTINEL_BASE + self._index[text])

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {text: i for i, text in enumerate(sorted(self.ids))}

    @functools.cached_property
    def _texts(self) -> list[str]:
        return sorted(self.ids)

    def escape(self, data: Any, keep: Callable[[Any], bool] = lambda node: False) -> tuple[Any, int]:
        """`data` (a conversation: dicts, lists, strings) with every added-token text in its strings
        replaced by its sentinel, and how many were replaced (0: `data` itself is returned).

        Args:
            data: The conversation (or any part of it).
            keep: Nodes left as they are (their added-token text is what the target emitted).

        Raises:
            SpecialTextError: A string holds a sentinel character already (the escape would be ambiguous).
        """
        if self.pattern is None or not self._needs_escape(data, keep):
            return data, 0  # nearly every conversation: one scan, no copy
        pattern, count = self.pattern, 0

        def walk(node: Any) -> Any:
            nonlocal count
            if keep(node):
                return node
            if isinstance(node, str):
                escaped, found = pattern.subn(lambda m: self._sentinel(m.group(0)), node)
                count += found
                return escaped
            if isinstance(node, dict):
                return {k: walk(v) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v) for v in node]
            return node

        escaped = walk(data)
        return (escaped, count) if count else (data, 0)

    @functools.cached_property
    def _probe(self) -> re.Pattern:
        """An added token's text or a sentinel character: what makes a string need `escape`'s attention."""
        assert self.pattern is not None
        return re.compile(f"{self.pattern.pattern}|{_SENTINEL_RE.pattern}")

    def _needs_escape(self, data: Any, keep: Callable[[Any], bool]) -> bool:
        """Whether a string of `data` outside the kept nodes holds an added token's text.

        Raises:
            SpecialTextError: Any string of `data`, kept or not, holds a sentinel character: encode
                would read it back as an added token's text.
        """
        probe, stack, found = self._probe.search, [(data, False)], False
        while stack:
            node, kept = stack.pop()
            kept = kept or keep(node)
            if isinstance(node, str):
                match = probe(node)
                if match and _SENTINEL_RE.search(node):
                    raise SpecialTextError("content holds characters of Unicode's Supplementary Private Use "
                                           "Area-A (U+F0000-U+FFFFD), which eagle3 uses to keep special-token text")
                found = found or (match is not None and not kept)
            elif isinstance(node, dict):
                stack.extend((value, kept) for value in node.values())
            elif isinstance(node, list):
                stack.extend((value, kept) for value in node)
        return found

    def unescape(self, text: str) -> str:
        """The original text of an escaped string."""
        return _SENTINEL_RE.sub(lambda m: self._texts[ord(m.group(0)) - _SENTINEL_BASE], text)

    def encode(self, tokenizer: Any, texts: list[str]) -> list[list[int]]:
        """Token ids of rendered texts: added-token text left in them is the template's (one id each),
        escaped content is encoded as the text it was.

        Raises:
            SpecialTextError: The tokenizer still turned content text into an added token's id (it
                ignores `split_special_tokens`); training on it would teach a control token.
        """
        escaped = {i for i, text in enumerate(texts) if _SENTINEL_RE.search(text)}
        plain = [i for i in range(len(texts)) if i not in escaped]
        out: list[list[int]] = [[] for _ in texts]
        if plain:  # one batched call, as the tokenizer is always called
            encoded = tokenizer([texts[i] for i in plain], add_special_tokens=False)["input_ids"]
            for i, ids in zip(plain, encoded, strict=True):
                out[i] = list(ids)
        for i in escaped:
            out[i] = self._encode_escaped(tokenizer, texts[i])
        return out

    def _encode_escaped(self, tokenizer: Any, text: str) -> list[int]:
        assert self.pattern is not None  # a sentinel exists only where escape() replaced something
        ids: list[int] = []
        special_ids = set(self.ids.values())
        # Split at the template's added tokens first, as the tokenizer does; each part between is text.
        for k, part in enumerate(self.pattern.split(text)):
            if not part:
                continue
            if k % 2:  # a captured separator: one of the template's own added tokens
                ids.append(self.ids[part])
            elif _SENTINEL_RE.search(part):
                literal = self.unescape(part)
                part_ids = encode_as_text(tokenizer, literal)
                if special_ids.intersection(part_ids):
                    raise SpecialTextError(f"the tokenizer cannot encode the text {literal[:60]!r} without "
                                           "added-token ids (a tokenizer of a kind eagle3 does not know)")
                ids += part_ids
            else:
                ids += list(tokenizer(part, add_special_tokens=False)["input_ids"])
        return ids


def encode_as_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` as plain text: its added-token texts (special or not) go through the vocabulary like any text.

    `split_special_tokens=True` is not enough: it leaves the *non*-special added tokens (Kimi's
    `<think>`, `<|tool_call_begin|>`) matched. A fast tokenizer is run without its added vocabulary
    (normalizer, pre-tokenizer and model, which is what it does between added tokens); a tiktoken one
    (Kimi's) with `encode_ordinary`; any other with `split_special_tokens=True`, checked by the caller.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "model") and hasattr(backend, "pre_tokenizer"):
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        pieces = backend.pre_tokenizer.pre_tokenize_str(normalized) if backend.pre_tokenizer is not None \
            else [(normalized, None)]
        return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]
    ordinary = getattr(getattr(tokenizer, "model", None), "encode_ordinary", None)
    if callable(ordinary):
        return list(ordinary(text))
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


@functools.lru_cache(maxsize=8)
def literal_specials(tokenizer: Any) -> LiteralSpecials:
    """The added tokens of `tokenizer` (special or not: it matches both before BPE), once per tokenizer."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {str(getattr(tok, "content", tok)): int(i) for i, tok in decoder.items()}
    ids = {text: i for text, i in ids.items() if text}
    if not ids:
        return LiteralSpecials(ids={}, pattern=None)
    alternation = "|".join(re.escape(t) for t in sorted(ids, key=lambda t: (-len(t), t)))
    return LiteralSpecials(ids=ids, pattern=re.compile(f"({alternation})"))
