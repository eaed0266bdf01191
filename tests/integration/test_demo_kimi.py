"""The Kimi-shaped demo target end to end (`model=demo_kimi`): the code paths a Kimi-K2.5 user's run takes.

One chain, built once for this file: prep -> generate (transformers; vLLM too, below) -> tokenize (the tiktoken remote-code
tokenizer) -> merge -> vocab -> extract (transformers' DeepSeek-V3: MLA, MoE) -> train -> eval. On it:
vLLM's CPU build captures through its DeepSeek model class what transformers captures; an MLA draft
(`model.draft.attention=mla`) trained on the same store is exported as `Eagle3DeepseekV2ForCausalLM`,
and vLLM serves it losslessly, the target alone decoding what transformers decodes, beside the target; a Llama-style draft is refused by vLLM's CPU build
in one line before anything starts. vLLM starts take ~1 min each on 2 cores. Needs `tests.vllm_env`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.serving.benchmark import outputs_match
from eagle3.states.store import HiddenStateStore
from tests.conftest import SMALL_DEMO_DATA, run_cli, unit_dirs
from tests.emitted_ids import assert_trained_on_emitted_ids
from tests.vllm_env import assert_stopped, free_port, launch_overrides, vllm_python

# Slow; its jobs launch servers (or run sweeps), each a process of its own (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

#: The chain's own overrides: small data, a short schedule, states stored in fp32 (compared across engines).
KIMI = ("model=demo_kimi", *SMALL_DEMO_DATA, "train.ttt_steps=3", "train.max_epochs=4",
        "train.eval_every_n_epochs=4", "eval.ks=[3]", "extract.storage_format=fp32")
MLA = "model.draft.attention=mla"
K = 3
# The two engines add the same fp32 numbers in different orders (vLLM's MLA and MoE kernels, its
# RMSNorm); the Llama demo's states agree to 1.2e-5 (tests/integration/test_vllm_extract.py).
FP32_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def kimi_chain(tmp_path_factory):
    """`stage=all model=demo_kimi` (the default Llama-style draft): its root and the finished job."""
    root = tmp_path_factory.mktemp("demo_kimi") / "artifacts"
    (root.parent / "elsewhere").mkdir()
    done = _cli(root, "stage=all", in_process=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done


def _cli(root: Path, *args: str, in_process: bool | None = None):
    return run_cli([*KIMI, f"paths.root={root}", *args], cwd=root.parent / "elsewhere", in_process=in_process)


def _unit(root: Path, stage: str, **config) -> Path:
    found = [d for d in unit_dirs(root, stage) if all(Manifest.load(d).config.get(k) == v for k, v in config.items())]
    assert len(found) == 1, (stage, config, found)
    return found[0]


def test_stage_all_on_demo_kimi_ends_with_its_eval_line(kimi_chain):
    root, done = kimi_chain
    lines = [line for line in done.stdout.splitlines() if line.startswith("eval: ")]
    assert lines, done.stdout[-2000:]
    report = json.loads((_unit(root, "eval") / "eval_report.json").read_text())
    real = report["real"][str(K)]
    assert real["lossless"] is True and real["accept_length"] > 1.2, real
    # The data went through the tiktoken tokenizer and the DeepSeek-V3 target.
    tokenized = [Manifest.load(d) for d in unit_dirs(root, "tokenize")]
    assert tokenized and all(m.status == "complete" and m.counts["out"] > 0 for m in tokenized)
    extract = Manifest.load(_unit(root, "extract"))
    assert extract.config["backend"] == "hf" and extract.counts["out"] > 0


def _states(manifest: Manifest) -> dict[str, tuple]:
    store = HiddenStateStore(manifest.extra["store_dir"])
    return {r["id"]: store.load(r["key"]) for r in read_jsonl(Path(manifest.dir) / "keys.jsonl")}


def test_vllm_captures_through_its_deepseek_class_what_transformers_captures(kimi_chain):
    """vLLM's aux id k is the residual entering layer k (transformers' hidden_states[k]); the final
    state is normed from the target's own norm: the same store, from either engine."""
    root, _ = kimi_chain
    python, port = vllm_python(), free_port()
    done = _cli(root, "stage=extract", "extract.backend=vllm", *launch_overrides(python, port, node="extract.server"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_stopped(port)
    hf, vllm = (Manifest.load(_unit(root, "extract", backend=b)) for b in ("hf", "vllm"))
    hf_states, vllm_states = _states(hf), _states(vllm)
    assert set(hf_states) == set(vllm_states) and len(hf_states) == hf.counts["out"]
    worst = {"aux": 0.0, "final": 0.0}
    for sid, (aux, final, ids) in hf_states.items():
        v_aux, v_final, v_ids = vllm_states[sid]
        assert torch.equal(ids, v_ids) and aux.shape == v_aux.shape and aux.shape[1] == 3 * 256 and final.shape == v_final.shape
        worst["aux"] = max(worst["aux"], float((aux.float() - v_aux.float()).abs().max()))
        worst["final"] = max(worst["final"], float((final.float() - v_final.float()).abs().max()))
    print(f"vLLM vs transformers, demo_kimi states: max |diff| {worst}")
    assert worst["aux"] <= FP32_TOLERANCE and worst["final"] <= FP32_TOLERANCE, worst


def test_an_mla_draft_is_exported_for_both_engines_and_vllm_serves_it_losslessly(kimi_chain):
    root, _ = kimi_chain
    before = unit_dirs(root, "train")
    trained = _cli(root, "stage=all", MLA)
    assert trained.returncode == 0, trained.stderr[-3000:]
    [train_unit] = unit_dirs(root, "train") - before
    # The default layer for vLLM (norm_before_residual) is one SGLang lacks: exported for vLLM only
    # (the SGLang MLA export's format: tests/unit/draft/test_mla.py).
    assert sorted(p.name for p in (train_unit / "draft").iterdir()) == ["vllm"]
    cfg = json.loads((train_unit / "draft" / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["model_type"] == "deepseek_v2"
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["q_lora_rank"]) == (512, 64, 128)
    with safe_open(str(train_unit / "draft" / "vllm" / "model.safetensors"), "pt") as f:
        assert "midlayer.self_attn.kv_a_proj_with_mqa.weight" in f.keys()
    [eval_unit] = [d for d in unit_dirs(root, "eval") if Manifest.load(d).inputs["train"]["path"] == str(train_unit)]
    in_process = json.loads((eval_unit / "eval_report.json").read_text())["real"][str(K)]
    assert in_process["lossless"] is True and in_process["accept_length"] > 1.2, in_process

    python, port = vllm_python(), free_port()
    bench_before = unit_dirs(root, "bench")
    # fp32, as transformers decodes below: the target alone must give transformers' greedy tokens.
    done = _cli(root, "stage=bench", MLA, "bench.repeats=1", "server=vllm", *launch_overrides(python, port),
                "server.dtype=float32", f"server.speculative.num_steps={K}",
                f"server.speculative.num_draft_tokens={K + 1}")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_stopped(port)
    [bench_unit] = unit_dirs(root, "bench") - bench_before
    report = json.loads((bench_unit / "bench_report.json").read_text())
    assert report["status"] == "ok" and report["draft"] == str(train_unit / "draft" / "vllm")
    accept = report["accept"]
    print(f"demo_kimi MLA draft: vLLM accept length {accept['accept_length']:.3f}, in-process "
          f"{in_process['accept_length']:.3f}")
    assert accept["drafts"] > 0 and accept["accept_length"] > 1.05, accept
    match = outputs_match(report["output_ids"]["baseline"], report["output_ids"]["speculative"])
    assert match is not None and match["identical"] == match["of"] == report["num_prompts"], match
    # The target alone in vLLM's DeepSeek class decodes what transformers' DeepseekV3ForCausalLM does.
    assert report["output_ids"]["baseline"] == _transformers_greedy(root, report), "vLLM and transformers differ"


def _transformers_greedy(root: Path, report: dict) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    from eagle3.data.heldout import heldout_prompts
    from eagle3.paths import asset_path

    merged = Manifest.load(_unit(root, "merge"))
    prompts = {p["id"]: p["input_ids"] for p in heldout_prompts(Path(merged.dir) / "eval.jsonl", 10**6)}
    model = AutoModelForCausalLM.from_pretrained(asset_path("demo_kimi_target"), dtype=torch.float32).eval()
    outs = []
    for pid, produced in zip(report["prompt_ids"], report["output_ids"]["baseline"], strict=True):
        ids = torch.tensor([prompts[pid]])
        with torch.no_grad():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=len(produced))[0, ids.shape[1]:]
        outs.append(new.tolist())
    return outs


def test_vllm_cpu_refuses_a_llama_style_draft_on_demo_kimi_in_one_line_before_starting(kimi_chain):
    root, _ = kimi_chain
    before = unit_dirs(root, "bench")
    done = _cli(root, "stage=bench", "server=vllm", f"server.python={vllm_python()}")
    assert done.returncode == 2 and unit_dirs(root, "bench") == before
    [line] = [line for line in done.stderr.splitlines() if "share no block size" in line]
    assert line.strip().startswith("model.draft.attention: 'llama' -- vLLM's CPU build cannot serve a "
                                   "llama-attention draft beside an MLA target"), line
    assert "valid: model.draft.attention=mla, or server=vllm_gpu on a GPU" in line


def test_generate_through_vllm_answers_with_the_kimi_parsers_through_the_deepseek_class(kimi_chain):
    """`generate.backend=vllm` on the chain's prompt-only source: the remote-code tokenizer and the
    DeepSeek class behind vLLM's OpenAI server, reasoning split off by the kimi_k2 parser."""
    from eagle3.data.conversation import check_conversation

    root, _ = kimi_chain
    python, port = vllm_python(), free_port()
    before = unit_dirs(root, "generate")
    done = _cli(root, "stage=generate", "generate.backend=vllm", *launch_overrides(python, port, node="generate.server"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_stopped(port)
    [unit] = unit_dirs(root, "generate") - before
    manifest = Manifest.load(unit)
    records = list(read_jsonl(unit / "conversations.jsonl"))
    assert manifest.status == "complete" and manifest.counts["out"] == len(records) > 0, manifest.counts
    assistants = [m for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert all(check_conversation(r["messages"]) is None for r in records)
    assert all(isinstance(m.get("reasoning_content"), str) and "<think>" not in m["content"] for m in assistants)
    assert any(m["reasoning_content"] for m in assistants) and any(m["content"].strip() for m in assistants)
    # vLLM sent the ids behind each answer (return_token_ids), end-of-turn token included, and the
    # tiktoken tokenizer's training ids are those ids, not the text re-encoded.
    turns = [t for r in records for t in r["meta"]["generation"]["turns"]]
    assert all(len(t["token_ids"]) == t["completion_tokens"] for t in turns)
    before = unit_dirs(root, "tokenize")
    done = _cli(root, "stage=tokenize", "generate.backend=vllm",
                *launch_overrides(python, port, node="generate.server"))
    assert done.returncode == 0, done.stderr[-3000:]
    [tokenized] = [d for d in unit_dirs(root, "tokenize") - before if Manifest.load(d).name == manifest.name]
    assert assert_trained_on_emitted_ids(unit, tokenized) > 0
