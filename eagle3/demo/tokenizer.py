"""The demo target's tokenizer: a small byte-level BPE that speaks Kimi-K2.5's chat format.

The point of the demo target is that every piece of the pipeline (rendering, loss masks,
hidden-state capture, response regeneration, reasoning/tool parsing in servers) meets the same
token-level structure as Kimi-K2.5, at a size a CPU can train. So the tokenizer carries Kimi's
control tokens *by string*, each as one atomic token, and ships Kimi's published chat template
verbatim.

Two classes of control token, on purpose:

* Turn framing, media, BOS/EOS/PAD (``<|im_end|>``, ``<|im_assistant|>`` ...) are *special*:
  ``decode(..., skip_special_tokens=True)`` removes them, as an OpenAI-compatible server does when
  it returns message text.
* ``<think>``, ``</think>`` and the tool-call section tokens are added tokens with
  ``special=False``. vLLM's and SGLang's Kimi reasoning and tool-call parsers work on the
  *decoded text* and look for these strings; if they were special, the server would strip them
  before the parser ran and reasoning/tool calls would leak into ``content``. (Kimi's own
  tokenizer behaves the same way for these tokens.)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eagle3.chat_formats import kimi as kf

VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 4096
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "assets" / "chat_templates" / "kimi_k25.jinja"


def chat_template() -> str:
    """The published Kimi-K2.5 template, byte for byte (tests compare against the tokenizer's copy)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def _strip_control(texts: Iterable[str]) -> Iterable[str]:
    """Remove control-token strings so BPE does not spend merges on pieces of them."""
    for text in texts:
        for tok in kf.ALL_KIMI_TOKENS:
            text = text.replace(tok, "\n")
        yield text


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the BPE on rendered conversations and wrap it with Kimi's tokens and template.

    Control tokens get the last ids (as in Kimi, where they sit above the BPE range), and the
    total vocabulary is exactly ``vocab_size``.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(kf.ALL_KIMI_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(_strip_control(texts), trainer=trainer)
    # Added in Kimi's id order: turn tokens, then tool-call tokens, then media, think, PAD.
    order = [kf.BOS, kf.EOS, kf.IM_END, kf.IM_USER, kf.IM_ASSISTANT, kf.IM_SYSTEM,
             kf.TOOL_CALLS_BEGIN, kf.TOOL_CALLS_END, kf.TOOL_CALL_BEGIN, kf.TOOL_CALL_ARG,
             kf.TOOL_CALL_END, kf.IM_MIDDLE, *kf.MEDIA_TOKENS, kf.THINK_OPEN, kf.THINK_CLOSE, kf.PAD]
    for content in order:
        special = content in kf.SPECIAL_TOKENS
        added = AddedToken(content, special=special, normalized=False, single_word=False,
                           lstrip=False, rstrip=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"vocab is {tok.get_vocab_size()}, wanted {vocab_size}: corpus too small for the BPE")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=kf.BOS, eos_token=kf.IM_END, pad_token=kf.PAD,
        chat_template=chat_template(), model_max_length=MODEL_MAX_LENGTH, padding_side="left",
        clean_up_tokenization_spaces=False)


def save_as_tiktoken(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> Any:
    """Write `tokenizer` (a byte-level BPE from :func:`train_tokenizer`) as a tiktoken remote-code tokenizer.

    The BPE's tokens become tiktoken ranks (their ids: the trainer numbers tokens in merge order,
    which is the priority tiktoken merges by), its added tokens keep their ids and `special`
    flags, and `tokenizer_config.json` names `eagle3/demo/tokenization_tiktoken.py` in `auto_map`
    (copied beside it), as Kimi-K2.5's names `tokenization_kimi.py`. Returns the saved tokenizer
    reloaded through that remote code.
    """
    import base64

    from transformers import AutoTokenizer

    from eagle3.demo.tokenization_tiktoken import VOCAB_FILE, TikTokenTokenizer, bytes_to_unicode

    char_to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = sorted((rank, base64.b64encode(bytes(char_to_byte[c] for c in token)).decode())
                   for token, rank in ranks.items())
    if [rank for rank, _ in lines] != list(range(len(lines))):
        raise RuntimeError("the BPE's ranks are not 0..n-1: not a tokenizer train_tokenizer made")
    vocab_path = out_dir / VOCAB_FILE
    vocab_path.write_text("".join(f"{piece} {rank}\n" for rank, piece in lines), encoding="utf-8")
    added = {i: AddedToken(tok.content, special=tok.special, normalized=False, single_word=False,
                           lstrip=False, rstrip=False) for i, tok in tokenizer.added_tokens_decoder.items()}
    TikTokenTokenizer.register_for_auto_class("AutoTokenizer")
    tiktoken_tokenizer = TikTokenTokenizer(
        str(vocab_path), added_tokens_decoder=added, bos_token=kf.BOS, eos_token=kf.IM_END, pad_token=kf.PAD,
        chat_template=chat_template(), model_max_length=MODEL_MAX_LENGTH, padding_side="left",
        clean_up_tokenization_spaces=False)
    tiktoken_tokenizer.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir, trust_remote_code=True)
