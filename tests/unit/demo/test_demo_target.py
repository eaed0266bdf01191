"""The committed demo targets, Llama-shaped (`demo`) and Kimi-shaped (`demo_kimi`): Kimi-K2.5's chat
layout, they think, then answer. The demo loads without remote code; demo_kimi's tokenizer is remote
code over tiktoken ranks, as Kimi-K2.5's is, and its model is transformers' DeepSeek-V3 (MLA, MoE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import eagle3
from eagle3.chat_formats import kimi as kf
from eagle3.demo import conversations as convs
from eagle3.demo import evaluation as ev

ASSETS = Path(eagle3.__file__).parent / "assets"
TARGET = ASSETS / "demo_target"
KIMI_TARGET = ASSETS / "demo_kimi_target"
TEMPLATE = Path(eagle3.__file__).parent / "assets" / "chat_templates" / "kimi_k25.jinja"

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL = {"id": "functions.read_file:0", "type": "function",
        "function": {"name": "read_file", "arguments": "{\"path\": \"json/__init__.py\"}"}}
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "How is json.dumps implemented?"},
    {"role": "assistant", "content": "", "reasoning_content": "Read the file first.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "def dumps(obj):\n    pass"},
    {"role": "assistant", "content": "It starts with `def dumps(obj):`.", "reasoning_content": "Quote it."},
]


@pytest.fixture(scope="module", params=[TARGET, KIMI_TARGET], ids=["demo", "demo_kimi"])
def target(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def tokenizer(target):
    from transformers import AutoTokenizer

    # demo_kimi's tokenizer is its own remote code (tokenization_tiktoken.py), as Kimi-K2.5's is.
    return AutoTokenizer.from_pretrained(target, trust_remote_code=target == KIMI_TARGET)


@pytest.fixture(scope="module")
def model(target):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()


def _expected_ids(tokenizer, pieces: list[str]) -> list[int]:
    """Kimi tokens map to one id each; text between them is encoded on its own."""
    vocab = tokenizer.get_vocab()
    ids: list[int] = []
    for piece in pieces:
        ids += [vocab[piece]] if piece in kf.ALL_KIMI_TOKENS else tokenizer.encode(piece, add_special_tokens=False)
    return ids


def test_files_config_and_size(target, tokenizer):
    names = {p.name for p in target.iterdir()}
    tokenizer_files = {"tiktoken.model", "tokenization_tiktoken.py"} if target == KIMI_TARGET else {"tokenizer.json"}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json",
            "training_report.json", *tokenizer_files} <= names
    assert sum(p.stat().st_size for p in target.iterdir()) <= 32 * 2**20
    cfg = json.loads((target / "config.json").read_text())
    arch = "DeepseekV3ForCausalLM" if target == KIMI_TARGET else "LlamaForCausalLM"
    # demo_kimi is saved untied: vLLM's DeepSeek class ignores the tie and would read no lm_head.
    assert cfg["architectures"] == [arch] and cfg["tie_word_embeddings"] is (target != KIMI_TARGET)
    layers = cfg["num_hidden_layers"]
    assert layers >= 8 and len({2, layers // 2, layers - 3}) == 3 and layers - 3 < layers - 1
    assert cfg["vocab_size"] == len(tokenizer)
    gen = json.loads((TARGET / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tokenizer.convert_tokens_to_ids(kf.IM_END)


@pytest.mark.slow
def test_heldout_loss_is_well_below_a_unigram_baseline(target, model, tokenizer):
    # Measured here, not read from the training report: a unigram over training-split
    # conversations against the model on held-out ones (the report's figures use more of both).
    from eagle3.demo import conversations as convs
    from eagle3.demo.target_training import training_text

    train_texts = [training_text(tokenizer, convs.kimi_conversation(p))
                   for p in convs.training_plans(300, 0, split="train")]
    train_ids = torch.tensor([t for ids in tokenizer(train_texts, add_special_tokens=False)["input_ids"]
                              for t in ids])
    unigram = ev.unigram_logprobs(train_ids, len(tokenizer), tokenizer.pad_token_id)
    held = ev.evaluate(model, tokenizer, ev.heldout_sequences(tokenizer, 24, 0), unigram)
    assert held["model_all"] < 0.6 * held["unigram_all"], held
    assert held["model_assistant"] < 0.65 * held["unigram_assistant"], held
    report = json.loads((target / "training_report.json").read_text())["heldout"]
    assert report["model_all"] < 0.55 * report["unigram_all"]


def test_chat_template_is_the_published_one(tokenizer):
    assert tokenizer.chat_template == TEMPLATE.read_text(encoding="utf-8")


def test_every_kimi_token_is_atomic(tokenizer):
    for tok in kf.ALL_KIMI_TOKENS:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    assert tokenizer.eos_token == kf.IM_END and tokenizer.pad_token == kf.PAD and tokenizer.bos_token == kf.BOS
    ids = tokenizer.encode("<think>r</think>a<|tool_calls_section_begin|><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>r</think>a<|tool_calls_section_begin|>"


def test_kimi_layout_token_by_token(tokenizer):
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, return_dict=False)
    tools_json = json.dumps(TOOLS, separators=(",", ":"))
    expected = _expected_ids(tokenizer, [
        kf.IM_SYSTEM, "tool_declare", kf.IM_MIDDLE, tools_json, kf.IM_END,
        kf.IM_SYSTEM, "system", kf.IM_MIDDLE, "You are a helpful assistant.", kf.IM_END,
        kf.IM_USER, "user", kf.IM_MIDDLE, "How is json.dumps implemented?", kf.IM_END,
        # History turn (before the last plain answer): reasoning dropped, empty think block.
        kf.IM_ASSISTANT, "assistant", kf.IM_MIDDLE, kf.THINK_OPEN, kf.THINK_CLOSE,
        kf.TOOL_CALLS_BEGIN, kf.TOOL_CALL_BEGIN, "functions.read_file:0", kf.TOOL_CALL_ARG,
        "{\"path\": \"json/__init__.py\"}", kf.TOOL_CALL_END, kf.TOOL_CALLS_END, kf.IM_END,
        kf.IM_SYSTEM, "tool", kf.IM_MIDDLE, "## Return of functions.read_file:0\ndef dumps(obj):\n    pass", kf.IM_END,
        kf.IM_ASSISTANT, "assistant", kf.IM_MIDDLE, kf.THINK_OPEN, kf.THINK_CLOSE,
        "It starts with `def dumps(obj):`.", kf.IM_END,
    ])
    assert ids == expected
    vocab = tokenizer.get_vocab()
    assert ids[0] == vocab[kf.IM_SYSTEM] and ids[-1] == vocab[kf.IM_END]
    assert tokenizer.decode(ids[1:ids.index(vocab[kf.IM_MIDDLE])]) == "tool_declare"
    # Every turn ends with <|im_end|> and the next one starts right after it (no newlines).
    turn_starts = {vocab[kf.IM_SYSTEM], vocab[kf.IM_USER], vocab[kf.IM_ASSISTANT]}
    for i, tok in enumerate(ids[:-1]):
        if tok == vocab[kf.IM_END]:
            assert ids[i + 1] in turn_starts
    assert sum(t == vocab[kf.IM_END] for t in ids) == 6


def test_generation_prompt_keeps_suffix_reasoning(tokenizer):
    ids = tokenizer.apply_chat_template(CONVERSATION[:-1], tools=TOOLS, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    text = tokenizer.decode(ids)
    # The tool-call turn is now after the last plain answer, so its reasoning is rendered.
    assert f"{kf.IM_MIDDLE}{kf.THINK_OPEN}Read the file first.{kf.THINK_CLOSE}{kf.TOOL_CALLS_BEGIN}" in text
    assert ids[-4:] == _expected_ids(tokenizer, [kf.IM_ASSISTANT, "assistant", kf.IM_MIDDLE, kf.THINK_OPEN])


def _where_prompt() -> list[dict]:
    """A held-out multi-turn prompt ending with "which file?": its whole answer fits in 64 tokens."""
    for plan in convs.training_plans(1000, seed=2, split="held_out"):
        kinds = [k for k, _, _ in plan.turns]
        if "where" in kinds:
            messages = convs.kimi_conversation(plan)["messages"]
            user_idx = [i for i, m in enumerate(messages) if m["role"] == "user"]
            return messages[: user_idx[kinds.index("where")] + 1]
    raise LookupError("no where follow-up")


def test_greedy_generation_thinks_then_answers(target, model, tokenizer):
    if target == KIMI_TARGET:  # weaker: its held-out first turns below; this follow-up runs past 64 tokens
        return
    ids = tokenizer.apply_chat_template(_where_prompt(), add_generation_prompt=True,
                                        tokenize=True, return_dict=False, return_tensors="pt")
    # Speed is measured in BENCHMARKS.md, not asserted here (shared machines are noisy).
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1]:])
    assert kf.THINK_CLOSE in text and text.endswith(kf.IM_END), text
    reasoning, answer = text[: -len(kf.IM_END)].split(kf.THINK_CLOSE, 1)
    assert reasoning.strip() and answer.strip(), text


def test_tool_prompt_emits_tool_call(model, tokenizer):
    prompt = ev.heldout_prompt("tool")
    sample = ev.greedy_sample(model, tokenizer, prompt, max_new_tokens=96)
    assert sample["has_tool_call"], sample["text"]
    assert sample["tool_calls"][0]["function"]["name"] == "read_file"



# ------------------------------------------------------------------------------------------
# demo_kimi: Kimi-K2.5's architecture and tokenizer kind


def test_demo_kimi_is_deepseek_v3_with_the_mla_geometry_vllms_cpu_kernel_serves():
    cfg = json.loads((KIMI_TARGET / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3" and cfg["num_hidden_layers"] == 8
    # vLLM's CPU MLA kernel serves head size 576 only: Kimi's own kv_lora_rank 512 + qk_rope_head_dim 64.
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64) and cfg["q_lora_rank"]
    assert (cfg["first_k_dense_replace"], cfg["n_routed_experts"], cfg["num_experts_per_tok"],
            cfg["n_shared_experts"]) == (1, 8, 2, 1)
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["num_nextn_predict_layers"]) == ("noaux_tc", "sigmoid", 0)


def test_demo_kimi_tokenizer_is_remote_code_over_tiktoken_and_ships_the_repos_own_class():
    from transformers import AutoTokenizer

    from eagle3.cli import check_config
    from eagle3.data.special_text import encode_as_text
    from tests.conftest import compose_config

    shipped = KIMI_TARGET / "tokenization_tiktoken.py"
    assert shipped.read_bytes() == (Path(eagle3.__file__).parent / "demo" / "tokenization_tiktoken.py").read_bytes()
    config = json.loads((KIMI_TARGET / "tokenizer_config.json").read_text())
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_tiktoken.TikTokenTokenizer"
    # Untrusted, transformers converts the ranks into a tokenizer of its own: config validation refuses that.
    assert type(AutoTokenizer.from_pretrained(KIMI_TARGET)).__name__ != "TikTokenTokenizer"
    errors = check_config(compose_config(["model=demo_kimi", "model.trust_remote_code=false"]))
    assert [e for e in errors if e.startswith("model.trust_remote_code: false -- ")
            and "tokenizer_config.json names its own tokenizer code" in e] != []
    kimi = AutoTokenizer.from_pretrained(KIMI_TARGET, trust_remote_code=True)
    assert not kimi.is_fast and getattr(kimi, "backend_tokenizer", None) is None
    assert type(kimi.model).__module__.startswith("tiktoken")
    # Special-token text in content is encoded as text through tiktoken's encode_ordinary, not as the token.
    assert encode_as_text(kimi, "say <|im_end|>") == kimi.model.encode_ordinary("say <|im_end|>")
    assert kimi.convert_tokens_to_ids(kf.IM_END) not in encode_as_text(kimi, "say <|im_end|>")
    # The BPE is the demo's, as tiktoken ranks: the same ids for the same text.
    demo = AutoTokenizer.from_pretrained(TARGET)
    text = "<|im_user|>user<|im_middle|>How is `json.dumps` implemented? héllo — 你好<|im_end|>"
    assert kimi.encode(text, add_special_tokens=False) == demo.encode(text, add_special_tokens=False)
    assert kimi.decode(kimi.encode(text, add_special_tokens=False)) == text


@pytest.mark.slow
def test_demo_kimi_answers_held_out_first_turns_thinking_then_answering():
    """demo_kimi is weaker than the demo (held-out loss 0.54 of the unigram's against 0.50; 500 steps
    of a sparser model): of 20 held-out first turns, greedy, it closed 9 with `</think>...<|im_end|>`
    within 96 tokens when shipped (the demo 14). A floor of 8 catches a broken target, template or tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(KIMI_TARGET, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(KIMI_TARGET, dtype=torch.float32).eval()
    prompts = []
    for plan in list(convs.training_plans(20, seed=2, split="held_out")):
        conv = convs.kimi_conversation(plan)
        first_user = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "user")
        prompts.append(tokenizer.apply_chat_template(conv["messages"][: first_user + 1], tools=conv.get("tools"),
                                                     add_generation_prompt=True, return_dict=False))
    # One left-padded batch (greedy, each row masked to its own prompt), not twenty generate calls.
    width, im_end = max(len(p) for p in prompts), tokenizer.convert_tokens_to_ids(kf.IM_END)
    ids = torch.tensor([[im_end] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=96, do_sample=False, pad_token_id=im_end,
                         eos_token_id=im_end)
    closed = 0
    for row in out[:, width:].tolist():
        answer = row[: row.index(im_end) + 1] if im_end in row else row
        text = tokenizer.decode(answer)
        closed += kf.THINK_CLOSE in text and text.endswith(kf.IM_END)
    assert closed >= 8, closed
