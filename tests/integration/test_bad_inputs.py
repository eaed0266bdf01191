"""Values and inputs that used to be accepted without a word (issue 21), each refused in one line now.

Config rules run in-process on the composed config (what the entrypoint validates before any work);
what only the entrypoint can show (Hydra's own directories, exit codes, a second job in the same
second) runs it as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle3.cli import check_config
from eagle3.data.conversation import conversation_problem
from tests.conftest import HANG_GUARD_S, RUN_PY, compose_config, run_cli
from tests.own_target import build_tiny_llama, write_conversations


def errors_of(*overrides: str) -> list[str]:
    return check_config(compose_config(["stage=all", *overrides]))


def line_for(errors: list[str], key: str) -> str:
    [line] = [e for e in errors if e.startswith(f"{key}:")]
    return line


@pytest.mark.parametrize("override, key, valid", [
    ("train.optimizer.lr=-0.1", "train.optimizer.lr", "> 0"),
    ("train.optimizer.lr=0", "train.optimizer.lr", "> 0"),
    ("train.optimizer.betas=[0.9,1.5]", "train.optimizer.betas", "two numbers in [0, 1)"),
    ("train.optimizer.weight_decay=-1", "train.optimizer.weight_decay", ">= 0"),
    ("train.num_workers=-2", "train.num_workers", ">= 0"),
    ("lock_timeout_s=0", "lock_timeout_s", "> 0"),
    ("server.context_length=0", "server.context_length", "> 0"),
    ("data.eval_size=0", "data.eval_size", ">= 1"),
])
def test_a_value_out_of_range_is_refused_naming_the_key_and_what_is_valid(override, key, valid):
    line = line_for(errors_of(override), key)
    assert f"valid: {valid}" in line, line


def test_the_defaults_pass_the_range_rules():
    assert errors_of() == []


def test_eval_size_zero_says_what_the_numbers_would_be():
    line = line_for(errors_of("data.eval_size=0"), "data.eval_size")
    assert "numbers made of nothing" in line


@pytest.mark.parametrize("override, key, hint", [
    ("+train.max_epoch=1", "train.max_epoch", "did you mean max_epochs"),
    ("+model.draft.num_layer=2", "model.draft.num_layer", "did you mean num_layers"),
    ("+eval.k=[3]", "eval.k", "did you mean ks"),
    ("+generate.http.partitions.0.concurency=4", "generate.http.partitions[0].concurency", "did you mean concurrency"),
    ("+seeds=1", "seeds", "did you mean seed"),
    # The optimizer is built from its keys: an extra key must be an argument of its class.
    ("+train.optimizer.momentum=0.9", "train.optimizer.momentum", "did you mean muon_momentum"),
])
def test_a_key_the_schema_does_not_have_is_refused_not_ignored(override, key, hint):
    line = line_for(errors_of(override), key)
    what = "not an argument of eagle3.draft.optim.MuonAdamW" if "optimizer" in key else "nothing would read it"
    assert hint in line and what in line, line


@pytest.mark.parametrize("override", [
    "+train.optimizer.eps=1e-6",          # an argument MuonAdamW takes
    "+server.env.OMP_PROC_BIND=close",    # server.env is a dict of any variables
    "+dataset.sources.demo_native.columns.messages=conversation",  # adapter column renames
    "+generate.http.extra_body.min_p=0.05",
    "+logger.version=v1",                 # Lightning loggers take their own keyword arguments
])
def test_keys_that_are_read_are_still_accepted(override):
    assert errors_of(override) == []


def test_a_misspelt_key_ends_the_cli_before_any_work(tmp_path):
    done = run_cli(["stage=train", "+train.max_epoch=1", f"paths.root={tmp_path / 'root'}"], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "train.max_epoch: 1 -- not a key of train" in done.stderr
    assert not (tmp_path / "root" / "train").exists()


@pytest.mark.parametrize("arguments, reason", [
    ('{"path": "a.txt"', "bad_tool_arguments"),     # cut short
    ("{'path': 'a.txt'}", "bad_tool_arguments"),    # a Python repr, not JSON
    ('["a.txt"]', "bad_tool_arguments"),            # JSON, not an object
    ('{"path": "a.txt"}', None),
])
def test_tool_calls_whose_arguments_are_not_a_json_object_are_rejected(arguments, reason):
    conv = {"messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.read:0", "type": "function", "function": {"name": "read", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "functions.read:0", "content": "text"},
        {"role": "assistant", "content": "done"}]}
    problem = conversation_problem(conv)
    assert (problem[0] if problem else None) == reason
    if problem:
        assert "message 1, call 0 (read): arguments" in problem[1]


# ------------------------------------------------------------------ paths.root and run directories
def test_a_paths_root_that_is_a_file_is_one_line_before_hydra_writes(tmp_path):
    root = tmp_path / "root"
    root.write_text("not a directory")
    done = run_cli(["stage=plan", f"paths.root={root}"], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"paths.root: '{root}' -- is a file, not a directory" in done.stderr


def test_a_read_only_paths_root_is_one_line_before_hydra_writes(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    # CI runs as root, which writes through permission bits: a read-only mount is what refuses it.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)], check=True, capture_output=True)
    try:
        done = run_cli(["stage=plan", f"paths.root={mount / 'artifacts'}"], cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"paths.root: '{mount / 'artifacts'}' -- cannot be written (Read-only file system" in done.stderr


@pytest.mark.slow
def test_two_jobs_started_at_once_keep_their_own_run_directory_and_record(tmp_path):
    """A failing and a succeeding job of the same stage, started together: each job.json tells its own end."""
    root = tmp_path / "root"
    cmds = [[sys.executable, str(RUN_PY), "stage=plan", f"paths.root={root}"],
            [sys.executable, str(RUN_PY), "stage=plan", "data.scale=-1", f"paths.root={root}"]]
    procs = [subprocess.Popen(c, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
    assert [p.wait(timeout=HANG_GUARD_S) for p in procs] == [0, 2]
    records = [json.loads((d / "job.json").read_text()) for d in sorted((root / "runs").iterdir())]
    assert sorted(r["status"] for r in records) == ["complete", "failed"]
    [failed] = [r for r in records if r["status"] == "failed"]
    assert "data.scale" in failed["failure"]


# ------------------------------------------------------------------ data.scale beyond the data
def test_a_data_scale_beyond_the_mixture_stops_at_merge_in_one_line(tmp_path):
    """A sweep's larger scales must not train the same samples under another label."""
    target = build_tiny_llama(tmp_path / "my-llama", layers=8, hidden=64)
    chats = write_conversations(tmp_path / "chats.jsonl", 30)
    args = ["stage=all", "model=auto", f"model.path={target}", "dataset=files", f"dataset.files=[{chats}]",
            "dataset.track=target_native", "data.eval_size=4", "data.scale=1000", f"paths.root={tmp_path / 'a'}"]
    stopped = run_cli(args, cwd=tmp_path)
    assert stopped.returncode == 3 and "Traceback" not in stopped.stderr, stopped.stderr[-2000:]
    [line] = [x for x in stopped.stderr.splitlines() if x.startswith("eagle3:")]
    assert "data.scale=1000 asks for 1,000 train samples, but the mixture holds 26 (30 tokenized, 4 to the eval " \
           "split" in line and "lower data.scale to at most 26" in line, line
    assert not list((tmp_path / "a" / "merge").iterdir())  # refused: no `running` unit nor rejects file left
    assert not (tmp_path / "a" / "train").exists()
