"""The in-process `hf` generation backend: transformers `generate` on the target, batched.

It behaves like a serving engine so that responses regenerated here match what serving would
produce: the prompt is the tokenizer's *own* chat template (with `tools` and the `thinking`
kwarg) rendered with the generation prompt and tokenized without extra special tokens, a turn
ends at Kimi's end-of-turn token `<|im_end|>`, and the completion is split by the Kimi reasoning
and tool-call format (`parse_kimi_assistant`) into the OpenAI fields a server's parsers return.

Batches are left-padded (a decoder-only model continues each row from its last real token) and
sampled under a forked, seeded torch RNG, so equal requests and seed give equal results without
disturbing the caller's random state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import torch

from eagle3.chat_formats.kimi import ASSISTANT_HEADER, IM_END, parse_kimi_assistant
from eagle3.dtypes import torch_dtype
from eagle3.generation.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

if TYPE_CHECKING:
    from eagle3.config.schema import Eagle3Config

log = logging.getLogger("eagle3")

# tokenizer.model_max_length is a huge sentinel when a tokenizer does not know its limit.
_NO_LIMIT = 10**9


def to_message(prompt_text: str, completion: str, thinking: bool) -> dict[str, Any]:
    """Canonical assistant message of a completion, parsed as a server's Kimi parsers would.

    The completion continues the generation prompt, whose tail says where the model starts:
    inside an open `<think>` (thinking on) or after an empty `<think></think>` (thinking off).
    Parsing that tail together with the completion keeps both cases right, instead of guessing
    from the completion alone whether text before any `</think>` is reasoning.

    Args:
        prompt_text: The rendered prompt (ends with the generation prompt).
        completion: Generated text with control tokens, up to and including `<|im_end|>` if any.
        thinking: Whether the request had thinking on; only then is `reasoning_content` set.
    """
    start = prompt_text.rfind(ASSISTANT_HEADER)
    head = prompt_text[start:] if start >= 0 else ""
    parsed = parse_kimi_assistant(head + completion)
    message: dict[str, Any] = {"role": "assistant", "content": parsed["content"]}
    if thinking:
        message["reasoning_content"] = parsed["reasoning_content"]
    elif parsed["reasoning_content"]:  # no think block was opened: it is all answer text
        message["content"] = parsed["reasoning_content"] + parsed["content"]
    if parsed.get("tool_calls"):
        message["tool_calls"] = parsed["tool_calls"]
    return message


class HFBackend:
    """Batched generation with a transformers causal LM in this process.

    The model is loaded on the first `generate` call, so a stage whose batches are all done
    already (a resumed run) never pays for it.
    """

    name = "hf"
    #: Batched sampling draws from one RNG stream over the padded batch: a request's answer
    #: depends on its batch-mates, so a rerun re-runs whole batches.
    independent_requests = False

    def __init__(self, path: str, revision: Optional[str] = None, dtype: str = "float32",
                 trust_remote_code: bool = False, device: Optional[str] = None) -> None:
        """Remember what to load.

        Args:
            path: Hub id or local directory of the target.
            revision: Hub revision (None = default branch / local files).
            dtype: `float32`, `bfloat16` or `float16`.
            trust_remote_code: Allow the checkpoint's own modelling/tokenizer code (Kimi needs it).
            device: Torch device; None = CUDA when available, else CPU.
        """
        torch_dtype(dtype)  # a ValueError naming the valid ones, before anything loads
        self.path, self.revision, self.dtype = path, revision, dtype
        self.trust_remote_code = trust_remote_code
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model: Any = None
        self.tokenizer: Any = None
        self.end_id: Optional[int] = None
        self.pad_id: Optional[int] = None
        self.context_length = _NO_LIMIT

    def describe(self) -> dict[str, Any]:
        """Backend, model and device, for the manifest."""
        return {"backend": self.name, "path": self.path, "revision": self.revision,
                "dtype": self.dtype, "device": self.device}

    @classmethod
    def from_config(cls, cfg: Eagle3Config, urls: Optional[Sequence[str]] = None) -> HFBackend:
        """The configured target (`model.*`), loaded in this process on first use; `urls` is unused."""
        model = cfg.model
        return cls(path=str(model.path), revision=model.revision, dtype=str(model.dtype),
                   trust_remote_code=bool(model.trust_remote_code))

    @classmethod
    def from_loaded(cls, model: Any, tokenizer: Any) -> HFBackend:
        """A backend around a model and tokenizer the caller already loaded (and caches)."""
        backend = cls(path=str(getattr(model, "name_or_path", "")), dtype=str(model.dtype).removeprefix("torch."),
                      device=str(model.device))
        backend._attach(model, tokenizer)
        return backend

    def load(self) -> None:
        """Load tokenizer and model (idempotent)."""
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        common = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        tokenizer = AutoTokenizer.from_pretrained(self.path, **common)
        model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch_dtype(self.dtype), **common)
        self._attach(model.to(self.device).eval(), tokenizer)  # type: ignore[arg-type]  # transformers' @wraps(nn.Module.to) types .to unbound
        log.info("hf backend: loaded %s (%s, %s), end token id %s, context %s",
                 self.path, self.dtype, self.device, self.end_id, self.context_length)

    def _attach(self, model: Any, tokenizer: Any) -> None:
        """Adopt a model and tokenizer: end-of-turn and pad ids, context limit, left padding."""
        tokenizer.padding_side = "left"
        end_id = tokenizer.convert_tokens_to_ids(IM_END)
        if end_id is None or end_id == tokenizer.unk_token_id:
            end_id = tokenizer.eos_token_id  # not a Kimi-format tokenizer: its own end token
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
        config = getattr(model.config, "text_config", None) or model.config
        limits = (getattr(config, "max_position_embeddings", None), tokenizer.model_max_length)
        self.context_length = min((int(x) for x in limits if isinstance(x, int) and 0 < x < _NO_LIMIT),
                                  default=_NO_LIMIT)
        self.model, self.tokenizer, self.end_id, self.pad_id = model, tokenizer, end_id, pad_id

    def render(self, request: GenerationRequest) -> str:
        """The prompt text a serving engine would build for `request` (stock chat template).

        The thinking mode goes in under both names templates use (Kimi `thinking`, Qwen-style
        `enable_thinking`), as the tokenize stage renders it; a template ignores the other.
        """
        self.load()
        return self.tokenizer.apply_chat_template(
            request.messages, tools=request.tools, add_generation_prompt=True, tokenize=False,
            thinking=request.thinking, enable_thinking=request.thinking)

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Answer all requests in one left-padded `generate` call.

        Requests whose prompt plus `max_new_tokens` exceed the model's context are not run and
        come back with `error="prompt_too_long"` (a server would refuse them the same way).
        """
        self.load()
        texts = [self.render(r) for r in requests]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        runnable = [i for i, row in enumerate(ids) if len(row) + params.max_new_tokens <= self.context_length]
        results: list[Optional[GenerationResult]] = [None] * len(requests)
        for i in set(range(len(requests))) - set(runnable):
            results[i] = GenerationResult(id=requests[i].id, prompt_tokens=len(ids[i]),
                                          finish_reason=FINISH_LENGTH, error="prompt_too_long")
        if runnable:
            completions = self._generate([ids[i] for i in runnable], params)
            for i, (tokens, n_tokens) in zip(runnable, completions, strict=True):
                results[i] = self._result(requests[i], texts[i], tokens, n_tokens, len(ids[i]))
        return [r for r in results if r is not None]

    @torch.no_grad()
    def _generate(self, rows: list[list[int]], params: SamplingParams) -> list[tuple[list[int], int]]:
        """Generated ids per row, cut after the end-of-turn token, and their count."""
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], device=self.device)
        attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        if params.temperature > 0:
            sampling = {"do_sample": True, "temperature": float(params.temperature),
                        "top_p": float(params.top_p), "top_k": 0}
        else:
            sampling = {"do_sample": False}
        devices = [torch.device(self.device)] if torch.device(self.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(params.seed)
            out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                      max_new_tokens=params.max_new_tokens, eos_token_id=self.end_id,
                                      pad_token_id=self.pad_id, **sampling)
        completions = []
        for row in out[:, width:].tolist():
            n = row.index(self.end_id) + 1 if self.end_id in row else len(row)
            completions.append((row[:n], n))
        return completions

    def _result(self, request: GenerationRequest, prompt_text: str, tokens: list[int], n_tokens: int,
                prompt_tokens: int) -> GenerationResult:
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        message = to_message(prompt_text, text, request.thinking)
        ended = bool(tokens) and tokens[-1] == self.end_id
        finish = FINISH_LENGTH if not ended else FINISH_TOOL_CALLS if message.get("tool_calls") else FINISH_STOP
        return GenerationResult(id=request.id, message=message, finish_reason=finish,
                                completion_tokens=n_tokens, prompt_tokens=prompt_tokens, text=text,
                                token_ids=tokens)

    def close(self) -> None:
        """Drop the model so its memory can be reclaimed."""
        self.model = self.tokenizer = None
