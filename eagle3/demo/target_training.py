"""Train the demo targets: small chat models in Kimi-K2.5's format, from scratch on CPU.

Two architectures (`TrainConfig.architecture`): `llama` (the demo target) and `deepseek_v3` (the
Kimi-shaped demo_kimi target: Kimi-K2.5's own architecture, MLA attention and MoE layers, at a
size two CPU cores train in under half an hour). demo_kimi's MLA keeps Kimi's `kv_lora_rank` 512
and `qk_rope_head_dim` 64 because vLLM's CPU MLA kernel serves head size 576 only, and its
tokenizer is a tiktoken BPE loaded as remote code, as Kimi's is (`tokenizer_kind`).

Why a Llama: vLLM's CPU build serves ``LlamaForCausalLM`` without remote code, so the demo target
exercises the same serving and EAGLE-3 paths as a real target. Why >= 8 layers: the default
EAGLE-3 capture layers ``[2, L//2, L-3]`` must be distinct and must not be the last layer.

Training uses *all* tokens of each rendered conversation (prompts, tool results and answers):
with a budget of a few million tokens, the extra signal from user turns and code is worth more
than the SFT convention of masking prompts. Evaluation reports both all-token and
assistant-token loss.

Conversations are packed whole into fixed-length rows and ``position_ids`` restart at 0 for each
conversation; with no 2-D attention mask, transformers then builds a block-diagonal causal mask,
so every conversation is trained exactly as it is served (from position 0, seeing nothing else).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from tokenizers import Tokenizer, models
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from eagle3.chat_formats import kimi as kf
from eagle3.demo import conversations as convs
from eagle3.demo import tokenizer as demo_tok


@dataclass
class TrainConfig:
    """Everything that determines the trained weights (recorded in the training report)."""

    seed: int = 0
    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    intermediate_size: int = 704
    # Tool conversations reach ~720 tokens, so rows are 1024 (not 512) to keep them whole.
    seq_len: int = 1024
    batch_size: int = 4
    steps: int = 700
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    threads: int = 2
    # bf16 matmuls (fp32 master weights): 1.46x tokens/s on a CPU with AMX/AVX512-BF16.
    bf16_autocast: bool = True
    tokenizer_conversations: int = 8000
    #: "llama" or "deepseek_v3" (`ARCHITECTURES`); the fields below apply to deepseek_v3 only.
    architecture: str = "llama"
    #: "fast" (a tokenizers BPE) or "tiktoken" (the same BPE as tiktoken ranks, loaded as remote code).
    tokenizer_kind: str = "fast"
    q_lora_rank: int = 128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    first_k_dense_replace: int = 1
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    moe_intermediate_size: int = 160
    eval_conversations: int = 400
    log_every: int = 20


def training_text(tokenizer, conv: dict) -> str:
    """Render a conversation so that its final answer *keeps* its reasoning.

    The published template renders the final answer as history (``<think></think>``); a target
    trained on that would never learn to think. Rendering the prompt with the generation prompt
    and appending :func:`eagle3.chat_formats.kimi.assistant_tail` gives exactly the text a served model sees
    and then writes.
    """
    prompt = tokenizer.apply_chat_template(conv["messages"][:-1], tools=conv.get("tools"),
                                           add_generation_prompt=True, tokenize=False)
    return prompt + kf.assistant_tail(conv["messages"][-1])


def render_only_tokenizer() -> PreTrainedTokenizerFast:
    """A vocabulary-less tokenizer that can only render the template (to produce BPE training text)."""
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()),
                                   chat_template=demo_tok.chat_template())


def build_tokenizer(cfg: TrainConfig) -> PreTrainedTokenizerFast:
    """BPE trained on rendered *training-split* conversations only (held-out text stays unseen)."""
    renderer = render_only_tokenizer()
    texts = (training_text(renderer, convs.kimi_conversation(p))
             for p in convs.training_plans(cfg.tokenizer_conversations, cfg.seed + 1))
    return demo_tok.train_tokenizer(texts)


ARCHITECTURES = ("llama", "deepseek_v3")


def build_model(cfg: TrainConfig, tokenizer) -> LlamaForCausalLM | DeepseekV3ForCausalLM:
    """A fresh, seeded model sized for 20-25 minutes of training on two CPU cores."""
    if cfg.architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {cfg.architecture!r} is not one of {ARCHITECTURES}")
    if cfg.architecture == "deepseek_v3":
        return build_deepseek_v3(cfg, tokenizer)
    # rope_theta: a field in transformers 4; transformers 5's config dataclass takes it but does not declare it.
    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=4096,
        rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


def build_deepseek_v3(cfg: TrainConfig, tokenizer) -> DeepseekV3ForCausalLM:
    """Kimi-K2.5's text architecture in miniature: a dense first layer, then MoE layers with a shared
    expert and sigmoid top-k routing (`noaux_tc`, one group), MLA with q/kv LoRA ranks.

    `topk_method` and `scoring_func` are written although transformers' DeepseekV3 always routes
    this way: vLLM reads them from config.json. `num_nextn_predict_layers` 0: no MTP layer ships.
    """
    config = DeepseekV3Config(  # type: ignore[call-arg]  # topk_method, scoring_func: kept as extra keys
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        n_shared_experts=cfg.n_shared_experts, n_routed_experts=cfg.n_routed_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, routed_scaling_factor=1.0, n_group=1, topk_group=1,
        first_k_dense_replace=cfg.first_k_dense_replace, norm_topk_prob=True,
        q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim, num_nextn_predict_layers=0,
        topk_method="noaux_tc", scoring_func="sigmoid", max_position_embeddings=4096, rope_theta=10000.0,
        tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(cfg.seed)
    return DeepseekV3ForCausalLM(config)


def untie_output_embedding(model) -> None:
    """Give the model an lm_head of its own, equal to the input embedding, and say so in its config.

    vLLM's DeepSeek-V2/V3 class ignores `tie_word_embeddings` and loads `lm_head.weight` from the
    checkpoint, which a tied model does not save: every logit is 0 and greedy decoding writes token 0
    forever (the prefill's hidden states stay right). Kimi-K2.5 and DeepSeek-V3 never tie. The trained
    weights are unchanged, so transformers decodes exactly as before.
    """
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    if hasattr(model, "_tied_weights_keys"):
        model._tied_weights_keys = {} if isinstance(model._tied_weights_keys, dict) else []


def generation_config(tokenizer) -> GenerationConfig:
    """Stop on ``<|im_end|>``, as Kimi's own generation config does."""
    return GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, do_sample=False)


def token_stream(cfg: TrainConfig, tokenizer, chunk: int = 512) -> Iterator[list[int]]:
    """Token ids of training conversations, in a fixed order, without end."""
    start = 0
    while True:
        plans = convs.training_plans(start + chunk, cfg.seed, start=start)
        texts = [training_text(tokenizer, convs.kimi_conversation(p)) for p in plans]
        yield from tokenizer(texts, add_special_tokens=False)["input_ids"]
        start += chunk


def packed_rows(cfg: TrainConfig, tokenizer, num_rows: int, open_rows: int = 8):
    """First-fit pack whole conversations into rows; returns ids, position ids and labels.

    Up to ``open_rows`` rows stay open so that short conversations fill the gaps long tool
    conversations leave (next-fit wastes ~14% of each row, this ~3%). Padding sits at the end of
    a row with its own restarting positions (a fake document) and label -100, so it neither
    attends to nor is predicted from real text. Deterministic: conversations arrive in a fixed
    order and rows are emitted oldest first.
    """
    ids = torch.full((num_rows, cfg.seq_len), tokenizer.pad_token_id, dtype=torch.long)
    pos = torch.zeros((num_rows, cfg.seq_len), dtype=torch.long)
    labels = torch.full((num_rows, cfg.seq_len), -100, dtype=torch.long)
    pending: list[list[list[int]]] = []  # open rows, oldest first, as lists of conversations
    done = 0

    def emit(row_seqs: list[list[int]]) -> None:
        col = 0
        for seq in row_seqs:
            n = len(seq)
            ids[done, col:col + n] = torch.tensor(seq)
            labels[done, col + 1:col + n] = torch.tensor(seq[1:])  # a conversation's first token has no context
            pos[done, col:col + n] = torch.arange(n)
            col += n
        pos[done, col:] = torch.arange(cfg.seq_len - col)

    for seq in token_stream(cfg, tokenizer):
        seq = seq[: cfg.seq_len]
        row = next((r for r in pending if sum(map(len, r)) + len(seq) <= cfg.seq_len), None)
        if row is not None:
            row.append(seq)
            continue
        pending.append([seq])
        if len(pending) > open_rows:
            emit(pending.pop(0))
            done += 1
            if done == num_rows:
                break
    return ids, pos, labels


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(cfg: TrainConfig, model: LlamaForCausalLM | DeepseekV3ForCausalLM, rows, log=print) -> dict:
    """Plain AdamW loop over the packed rows in order (one pass, no shuffling: order is fixed)."""
    ids, pos, labels = rows
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    model.train()
    curve, tokens_seen, t0 = [], 0, time.time()
    for step in range(cfg.steps):
        sl = slice(step * cfg.batch_size, (step + 1) * cfg.batch_size)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            out = model(input_ids=ids[sl], position_ids=pos[sl], labels=labels[sl])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += int((labels[sl] != -100).sum())
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            elapsed = time.time() - t0
            curve.append({"step": step, "loss": round(out.loss.item(), 4), "elapsed_s": round(elapsed, 1)})
            log(f"step {step:4d}/{cfg.steps} loss {out.loss.item():.4f} lr {lr_at(cfg, step):.2e} "
                f"tok/s {tokens_seen / max(elapsed, 1e-9):.0f} elapsed {elapsed:.0f}s")
    model.eval()
    return {"train_wall_s": round(time.time() - t0, 1), "tokens_seen": tokens_seen,
            "loss_curve": curve, "config": asdict(cfg)}
