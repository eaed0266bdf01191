"""A Gemma 3 target through vLLM's CPU build, with eagle3's vLLM plugin (eagle3/serving/vllm_plugin).

vLLM 0.32's own `Gemma3ForCausalLM` lacks `SupportsEagle3`, so without the plugin vLLM neither serves a
Gemma 3 EAGLE-3 draft nor hands out its hidden states ("Model does not support EAGLE3 interface").
With it, the states vLLM hands out (`extract.backend=vllm`, the same capture path its drafts read)
must equal transformers' (`extract.backend=hf`) within fp32 noise, on a tiny random Gemma 3 whose
every trait would show a slip: `(1 + weight)` norms, the sqrt(hidden)-scaled embedding, sliding-window
layers beside a full one (tests/gemma3_target.py). Needs `tests.vllm_env`'s environment.
"""

from __future__ import annotations

import pytest

from tests.conftest import SMALL_DEMO_DATA, run_cli
from tests.gemma3_target import build_tiny_gemma3
from tests.integration.test_vllm_extract import FP32, FP32_TOLERANCE, _extract_unit, store_errors
from tests.vllm_env import assert_stopped, free_port, launch_overrides, vllm_python

pytestmark = [pytest.mark.slow, pytest.mark.own_process]


def _gemma(target) -> tuple[str, ...]:
    """The demo data's settings on the tiny Gemma target (its tokenizer and template are the demo's)."""
    return ("model=auto", f"model.path={target}", "model.draft.vocab_size=2048",
            "model.training_chat_template=${eagle3_asset:chat_templates/kimi_k25_training.jinja}",
            "model.reasoning_parser=kimi_k2", "model.tool_call_parser=kimi_k2", *SMALL_DEMO_DATA)


@pytest.mark.budget(200)  # measured: see BENCHMARKS.md, the CI suite's wall time
def test_vllm_hands_out_a_gemma3_targets_states_as_transformers_computes_them(tmp_path):
    python = vllm_python()
    target = build_tiny_gemma3(tmp_path / "gemma3")
    root, work = tmp_path / "artifacts", tmp_path / "elsewhere"
    work.mkdir()
    for stage in ("demo_data", "prep", "generate", "tokenize", "merge", "vocab"):
        done = run_cli([f"stage={stage}", *_gemma(target), f"paths.root={root}"], cwd=work, in_process=True)
        assert done.returncode == 0, done.stderr[-3000:]
    done = run_cli(["stage=extract", FP32, *_gemma(target), f"paths.root={root}"], cwd=work, in_process=True)
    assert done.returncode == 0, done.stderr[-3000:]
    port = free_port()
    done = run_cli(["stage=extract", FP32, *_gemma(target), f"paths.root={root}", "extract.backend=vllm",
                    *launch_overrides(python, port, node="extract.server")], cwd=work, timeout=1800)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_stopped(port)
    hf, vllm = _extract_unit(root, "hf"), _extract_unit(root, "vllm")
    assert hf.counts == vllm.counts and vllm.counts["out"] == vllm.counts["in"] > 0
    worst = store_errors(hf, vllm)
    print(f"gemma3: vllm vs hf fp32 store: max abs error {worst}")
    assert worst["aux"] <= FP32_TOLERANCE and worst["final"] <= FP32_TOLERANCE, worst
