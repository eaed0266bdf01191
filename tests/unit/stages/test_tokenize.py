"""Stage `tokenize`: rejects instead of crashes, length policies, the config slice, kill -9 + resume.

The stage runs on prep output of a local data file (demo conversations written in the
`openai_messages` schema), or, for inputs prep would refuse, on a prep-like output built here.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, StageOutput, read_jsonl
from eagle3.data.render import RenderSettings
from eagle3.data.tokenize_run import TokenizerSpec, tokenize_unit
from eagle3.demo import conversations as demo_convs
from eagle3.paths import asset_path
from eagle3.stages import StageContext
from eagle3.stages.merge import MERGE
from eagle3.stages.prep import CONVERSATIONS_FILE, PREP
from eagle3.stages.tokenize import TOKENIZE, TOKENIZED_FILE
from tests.conftest import HANG_GUARD_S, RUN_PY, compose_settings

TOKENIZER_DIR = asset_path("demo_target")
TRAINING_TEMPLATE = asset_path("chat_templates/kimi_k25_training.jinja")
UNIT = "demo_native"  # the demo source, pointed at a local data file


def demo_conversations(n: int, seed: int = 3) -> list[dict]:
    return [dict(demo_convs.kimi_conversation(plan), id=f"c{i}")
            for i, plan in enumerate(demo_convs.training_plans(n, seed))]


def upstream(root: Path, convs: list[dict]) -> Manifest:
    """A complete prep-like output holding `convs` as conversations.jsonl."""
    out = StageOutput.open(root, "prep", UNIT, {"n": len(convs)})
    writer = out.records("conversations.jsonl")
    for conv in convs:
        out.count_in()
        writer.write({"source": UNIT, "track": "target_native", **conv})
    manifest = out.finalize()
    out.close()
    return manifest


def run_tokenize(root: Path, up: Manifest, settings: RenderSettings, workers: int = 1, chunk: int = 8) -> Manifest:
    out = StageOutput.open(root, "tokenize", UNIT, {"settings": repr(settings)}, inputs={"conversations": up})
    with out:
        extra = tokenize_unit(out, up.dir / CONVERSATIONS_FILE, up.counts["out"], UNIT, settings,
                              TokenizerSpec(str(TOKENIZER_DIR)), workers, chunk, TOKENIZED_FILE)
        return out.finalize(extra=extra)


@pytest.mark.slow
def test_bad_input_is_rejected_and_the_job_goes_on(tmp_path):
    # A template that refuses non-string content, as a strict template does.
    strict = ("{%- for m in messages -%}{%- if m.content is mapping -%}"
              "{{ raise_exception('content of ' ~ m.role ~ ' must be a string') }}{%- endif -%}{%- endfor -%}"
              + TRAINING_TEMPLATE.read_text(encoding="utf-8"))
    convs = demo_conversations(30)
    bad_tool = {"id": "bad-tool", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.f:0", "type": "function",
                                                            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.f:0", "content": {"rows": [1, 2]}},
        {"role": "assistant", "content": "done"}]}
    prompt_only = {"id": "no-answer", "messages": [{"role": "user", "content": "hello?"}]}
    for conv in convs[3:5]:
        conv["meta"] = {"truncated": True}  # answers generate cut at max_new_tokens
    convs[7:7] = [bad_tool]
    convs[20:20] = [prompt_only]
    up = upstream(tmp_path, convs)
    manifest = run_tokenize(tmp_path, up, RenderSettings(template=strict, thinking=True, max_len=4096, overlength="truncate", answer_ids="emitted"), workers=2, chunk=4)

    counts = manifest.counts
    assert counts["in"] == 32 and counts["out"] == 30
    assert counts["rejected"] == {"no_response_tokens": 1, "template_error": 1}
    rejects = {r["id"]: r for r in read_jsonl(manifest.dir / "rejects.jsonl")}
    assert rejects["bad-tool"]["reason"] == "template_error"
    assert rejects["bad-tool"]["detail"] == "TemplateError: content of tool must be a string"
    assert rejects["bad-tool"]["source"] == UNIT
    records = list(read_jsonl(manifest.dir / TOKENIZED_FILE))
    assert [r["id"] for r in records] == [c["id"] for c in convs if c["id"] not in rejects]  # input order
    assert counts["tokens"] == sum(r["seq_len"] for r in records)
    assert counts["response_tokens"] == sum(r["n_response_tokens"] for r in records)
    assert counts["generation_truncated"] == 2 and counts["truncated"] == 0
    assert [r["truncated"] for r in records[2:6]] == [False, True, True, False]
    assert manifest.extra["workers"] == 2


def test_over_length_policies_are_counted(tmp_path):
    convs = demo_conversations(40)
    up = upstream(tmp_path / "up", convs)
    full = run_tokenize(tmp_path / "full", up, RenderSettings(TRAINING_TEMPLATE.read_text(), True, 10**6, "truncate", "emitted"))
    lengths = {r["id"]: r["seq_len"] for r in read_jsonl(full.dir / TOKENIZED_FILE)}
    limit = sorted(lengths.values())[-8]  # 7 conversations are longer than this
    n_long = sum(v > limit for v in lengths.values())
    assert n_long == 7

    cut = run_tokenize(tmp_path / "cut", up, RenderSettings(TRAINING_TEMPLATE.read_text(), True, limit, "truncate", "emitted"))
    assert cut.counts["out"] == 40 and cut.counts["truncated"] == n_long and cut.counts["rejected"] == {}
    for record in read_jsonl(cut.dir / TOKENIZED_FILE):
        assert record["seq_len"] == min(limit, lengths[record["id"]])
        assert record["truncated"] is (lengths[record["id"]] > limit)

    drop = run_tokenize(tmp_path / "drop", up, RenderSettings(TRAINING_TEMPLATE.read_text(), True, limit, "drop", "emitted"))
    assert drop.counts["out"] == 40 - n_long and drop.counts["rejected"] == {"too_long": n_long}
    assert drop.counts["truncated"] == 0
    assert {r["id"] for r in read_jsonl(drop.dir / "rejects.jsonl")} == {k for k, v in lengths.items() if v > limit}


# ------------------------------------------------------------------ the stage through prep
def local_overrides(data_file: Path, root: Path, extra: tuple[str, ...] = ()) -> list[str]:
    src = f"dataset.sources.{UNIT}"
    return ["model=demo", f"model.path={TOKENIZER_DIR}", "dataset=demo_native", f"{src}.generator=null",
            f"{src}.num_samples=null", f"{src}.data_files=[{data_file}]", "prep.dedupe=false",
            "data.max_len=384", "data.eval_size=10", f"paths.root={root}", *extra]


def write_data_file(path: Path, n: int) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for conv in demo_conversations(n, seed=11):
            fh.write(json.dumps(conv) + "\n")
    return path


def stage_ctx(root: Path, tmp_path: Path) -> StageContext:
    return StageContext(root=root, run_dir=tmp_path / "run")


def test_config_slice_covers_what_changes_the_output(tmp_path):
    data = write_data_file(tmp_path / "data.jsonl", 60)
    root = tmp_path / "art"
    cfg = compose_settings(local_overrides(data, root))
    ctx = stage_ctx(root, tmp_path)
    PREP(cfg, ctx)
    [manifest] = TOKENIZE(cfg, ctx)
    sha = hashlib.sha256(TRAINING_TEMPLATE.read_bytes()).hexdigest()
    assert manifest.config["template_sha256"] == sha and manifest.config["thinking"] is True
    assert manifest.config["max_len"] == 384 and manifest.config["overlength"] == "truncate"
    assert len(manifest.config["tokenizer"]["local_files_sha256"]) == 64
    assert manifest.counts["in"] == 60 == manifest.counts["out"]
    assert manifest.counts["truncated"] > 0
    assert manifest.extra["template"] == str(TRAINING_TEMPLATE)

    def slice_(*extra):
        return TOKENIZE.unit_config(compose_settings(local_overrides(data, root, extra)), UNIT)

    assert slice_("tokenize.num_workers=1", "tokenize.chunk_size=3") == manifest.config
    assert TOKENIZE.locate(compose_settings(local_overrides(data, root, ("tokenize.num_workers=1",))), ctx, UNIT)[1] \
        is not None  # the worker count does not change the output, so it finds this one
    changed = [slice_(f"dataset.sources.{UNIT}.thinking=false"), slice_("data.max_len=512"),
               slice_("tokenize.overlength=drop"), slice_("model.training_chat_template=null"),
               slice_(f"model.training_chat_template={asset_path('chat_templates/kimi_k25.jinja')}"),
               slice_("tokenize.answer_ids=reencoded")]
    assert all(c != manifest.config for c in changed) and len({json.dumps(c) for c in changed}) == 6
    # merge reads what tokenize wrote.
    [merged] = MERGE(cfg, ctx)
    assert merged.extra["train_samples"] + merged.extra["eval_samples"] == 60


def _kill_when_partial(cmd: list[str], partial: Path, min_lines: int, timeout: float = HANG_GUARD_S) -> int:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    lines = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if partial.exists():
                lines = partial.read_bytes().count(b"\n")
                if lines >= min_lines:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.02)
    finally:
        proc.wait(timeout=30)
        try:  # the pool workers of the killed job (ours to clean up)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed ({lines} lines)"
    return lines


@pytest.mark.slow
def test_kill_9_then_rerun_equals_an_uninterrupted_run(tmp_path):
    n = 600
    data = write_data_file(tmp_path / "data.jsonl", n)
    roots = {"killed": tmp_path / "killed", "clean": tmp_path / "clean"}
    cfgs = {k: compose_settings(local_overrides(data, r)) for k, r in roots.items()}
    for key, root in roots.items():
        PREP(cfgs[key], stage_ctx(root, tmp_path))
    killed_dir = TOKENIZE.locate(cfgs["killed"], stage_ctx(roots["killed"], tmp_path), UNIT)[0]

    def args(workers):
        return [sys.executable, str(RUN_PY), "stage=tokenize", f"tokenize.num_workers={workers}",
                "tokenize.chunk_size=8", *local_overrides(data, roots["killed"])]

    lines = _kill_when_partial(args(2), killed_dir / f"{TOKENIZED_FILE}.partial", min_lines=100)
    assert 100 <= lines < n
    assert json.loads((killed_dir / "manifest.json").read_text())["status"] == "running"

    # Resumed with one worker (in the CLI process): the output must not depend on the worker count.
    rerun = subprocess.run(args(1), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    clean_cfg = compose_settings(local_overrides(data, roots["clean"], ("tokenize.num_workers=1",)))
    [clean] = TOKENIZE(clean_cfg, stage_ctx(roots["clean"], tmp_path))
    resumed = Manifest.load(killed_dir)
    assert resumed.status == "complete" and resumed.fingerprint == clean.fingerprint
    assert (killed_dir / TOKENIZED_FILE).read_bytes() == (clean.dir / TOKENIZED_FILE).read_bytes()
    assert resumed.counts == clean.counts
    assert resumed.counts["in"] == n == resumed.counts["out"] and resumed.counts["truncated"] > 0
