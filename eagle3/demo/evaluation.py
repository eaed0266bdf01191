"""Held-out evaluation of the demo target: loss against a unigram floor, and format checks.

A small model trained on templated text could look good just by learning the template. The
held-out set therefore uses only *held-out modules* (functions, files and docstrings the model
never saw), and the unigram baseline (train-split token frequencies, add-one smoothed) shows how
much of the loss reduction is real context use rather than token frequency.
"""

from __future__ import annotations

import time

import torch

from eagle3.chat_formats import kimi as kf
from eagle3.demo import conversations as convs
from eagle3.demo.target_training import training_text

EVAL_SEED_OFFSET = 2  # held-out plans use seed + 2 (training uses seed, the BPE seed + 1)


def assistant_positions(ids: list[int], tokenizer) -> list[bool]:
    """Per token: does it belong to an assistant turn body (after the header, through <|im_end|>)?"""
    vocab = tokenizer.get_vocab()
    im_asst, im_mid, im_end = vocab[kf.IM_ASSISTANT], vocab[kf.IM_MIDDLE], vocab[kf.IM_END]
    mask, state = [], "out"  # out -> header -> body
    for tok in ids:
        if state == "body":
            mask.append(True)
            if tok == im_end:
                state = "out"
            continue
        mask.append(False)
        if tok == im_asst:
            state = "header"
        elif state == "header" and tok == im_mid:
            state = "body"
    return mask


def heldout_sequences(tokenizer, num: int, seed: int) -> list[list[int]]:
    """Held-out conversations, rendered as in training (final answer keeps its reasoning)."""
    plans = convs.training_plans(num, seed + EVAL_SEED_OFFSET, split="held_out")
    texts = [training_text(tokenizer, convs.kimi_conversation(p)) for p in plans]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def unigram_logprobs(train_ids: torch.Tensor, vocab_size: int, pad_id: int) -> torch.Tensor:
    """Add-one smoothed log-frequencies of the training tokens (padding excluded)."""
    counts = torch.bincount(train_ids[train_ids != pad_id].flatten(), minlength=vocab_size).double()
    return torch.log((counts + 1) / (counts.sum() + vocab_size))


@torch.no_grad()
def evaluate(model, tokenizer, sequences: list[list[int]], unigram: torch.Tensor,
             batch_size: int = 16) -> dict:
    """Mean next-token cross-entropy (nats) of model and unigram on the same held-out targets."""
    model.eval()
    sums = {"model_all": 0.0, "unigram_all": 0.0, "model_assistant": 0.0, "unigram_assistant": 0.0}
    n_all = n_asst = 0
    for b in range(0, len(sequences), batch_size):
        batch = sequences[b:b + batch_size]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        asst = torch.zeros_like(ids, dtype=torch.bool)
        for i, seq in enumerate(batch):
            ids[i, :len(seq)] = torch.tensor(seq)
            attn[i, :len(seq)] = 1
            asst[i, :len(seq)] = torch.tensor(assistant_positions(seq, tokenizer))
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        target = ids[:, 1:]
        valid = attn[:, 1:].bool()
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        uni = -unigram[target].float()
        a = valid & asst[:, 1:]
        sums["model_all"] += nll[valid].sum().item()
        sums["unigram_all"] += uni[valid].sum().item()
        sums["model_assistant"] += nll[a].sum().item()
        sums["unigram_assistant"] += uni[a].sum().item()
        n_all += int(valid.sum())
        n_asst += int(a.sum())
    out = {k: round(v / (n_all if k.endswith("_all") else n_asst), 4) for k, v in sums.items()}
    out.update({"ratio_all": round(out["model_all"] / out["unigram_all"], 4),
                "ratio_assistant": round(out["model_assistant"] / out["unigram_assistant"], 4),
                "heldout_conversations": len(sequences), "heldout_tokens": n_all,
                "heldout_assistant_tokens": n_asst})
    return out


def heldout_prompt(kind: str, seed: int = 0) -> dict:
    """The first held-out plan of ``kind`` as a prompt conversation (answers stripped)."""
    for plan in convs.training_plans(10_000, seed + EVAL_SEED_OFFSET, split="held_out"):
        if plan.kind == kind:
            conv = convs.kimi_conversation(plan)
            first_answer = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant")
            return {"messages": conv["messages"][:first_answer], "tools": conv.get("tools")}
    raise LookupError(kind)


@torch.no_grad()
def greedy_sample(model, tokenizer, prompt: dict, max_new_tokens: int = 200) -> dict:
    """Greedy continuation of a prompt with its format checks and decode speed."""
    ids = tokenizer.apply_chat_template(prompt["messages"], tools=prompt.get("tools"),
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False, return_tensors="pt")
    t0 = time.time()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False)
    dt = time.time() - t0
    new = out[0, ids.shape[1]:]
    text = tokenizer.decode(new, skip_special_tokens=False)
    parsed = kf.parse_kimi_assistant(text)
    return {"prompt": prompt["messages"][-1]["content"], "text": text,
            "new_tokens": int(new.numel()), "tokens_per_s": round(new.numel() / dt, 1),
            "has_think_close": kf.THINK_CLOSE in text, "ends_with_im_end": text.endswith(kf.IM_END),
            "has_tool_call": bool(parsed.get("tool_calls")),
            "tool_calls": parsed.get("tool_calls", [])}
