"""Secrets never reach disk: refused before Hydra writes a file, redacted wherever a record slips one through.

Each end-to-end test runs the entrypoint with a secret and then reads every file under paths.root
(and the working directory, where Hydra's default `outputs/` would go), names included, for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI_TIMEOUT_S, RUN_PY, run_cli

HF = "hf_0123456789abcdefghij"
SWEEP_A = "hf_aaaaaaaaaaaaaaaaaaaaaaaa"
SWEEP_B = "hf_bbbbbbbbbbbbbbbbbbbbbbbb"
PASSWORD = "secretpass"
API_KEY = "sk-secret0123456789abcdef"


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file (any content, binary too) or path name under `root` that holds `secret`."""
    hits = []
    needle = secret.encode()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if secret in name:
                hits.append(os.path.join(dirpath, name))
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and needle in path.read_bytes():
                hits.append(str(path))
    return hits


@pytest.fixture
def run(tmp_path):
    """Run the entrypoint from an empty directory with artifacts under tmp_path/root."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    root = tmp_path / "root"

    def _run(*args: str):
        proc = run_cli([*args, f"paths.root={root}"], cwd=cwd)
        return proc, root, cwd

    return _run


def assert_refused_and_nothing_written(proc, root: Path, cwd: Path, key: str, *secrets: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "eagle3: config has" in proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.strip().startswith(key))
    assert "valid:" in line and "environment" in line, line
    assert "Traceback" not in proc.stderr
    for secret in secrets:
        assert secret not in proc.stdout + proc.stderr
        assert files_holding(root, secret) == []
        assert files_holding(cwd, secret) == []
    assert list(cwd.iterdir()) == []  # no outputs/ (or anything else) in the working directory
    assert not root.exists() or [p for p in root.rglob("*") if p.is_file()] == []


def test_hf_token_override_is_refused_before_hydra_writes_anything(run):
    proc, root, cwd = run("stage=prep", f"+server.env.HF_TOKEN={HF}")
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.HF_TOKEN", HF)


def test_sweep_over_tokens_is_refused_before_the_sweep_dir_exists(run):
    proc, root, cwd = run("-m", "stage=prep", f"+server.env.HF_TOKEN={SWEEP_A},{SWEEP_B}")
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.HF_TOKEN", SWEEP_A, SWEEP_B)
    assert "JobFailed" not in proc.stderr


def test_url_with_password_is_refused(run):
    proc, root, cwd = run("stage=prep", f"server.urls=[http://u:{PASSWORD}@127.0.0.1:1]")
    assert_refused_and_nothing_written(proc, root, cwd, "server.urls", PASSWORD)
    assert "http://<redacted>@127.0.0.1:1" in proc.stderr


def test_url_with_token_query_is_refused(run):
    proc, root, cwd = run("stage=prep", f"server.urls=['http://127.0.0.1:1/v1?token={PASSWORD}']")
    assert_refused_and_nothing_written(proc, root, cwd, "server.urls", PASSWORD)


@pytest.mark.parametrize("args", [f"[--api-key,{API_KEY}]", f"[--api-key={API_KEY}]", "[--api-key,plainvalue123]"])
def test_api_key_in_server_extra_args_is_refused_pointing_at_the_environment(run, args):
    secret = args.strip("[]").replace("=", ",").split(",")[1]
    proc, root, cwd = run("stage=prep", f"server.extra_args={args}")
    assert_refused_and_nothing_written(proc, root, cwd, "server.extra_args", secret)
    assert "VLLM_API_KEY" in proc.stderr


# The entrypoint's own check of the command line switched off: what the Hydra callback alone refuses.
CALLBACK_ONLY = """
import runpy, sys
import eagle3.config.callbacks, eagle3.config.secrets as secrets
secrets.find_secrets_in_overrides = lambda overrides: []
runpy.run_path(sys.argv.pop(1), run_name="__main__")
"""


@pytest.mark.parametrize("args,secret", [
    (("stage=prep", f"+server.env.HF_TOKEN={HF}"), HF),
    (("-m", "stage=prep", f"+server.env.HF_TOKEN={SWEEP_A},{SWEEP_B}"), SWEEP_B),
    (("-m", "stage=prep", f"server.urls=[http://u:{PASSWORD}@127.0.0.1:1],[http://127.0.0.1:2]"), PASSWORD),
    (("stage=prep", f"server.extra_args=[--api-key,{API_KEY}]"), API_KEY),
], ids=["run", "sweep", "sweep-url", "api-key"])
def test_the_hydra_callback_alone_refuses_before_anything_is_written(tmp_path, args, secret):
    cwd, root = tmp_path / "cwd", tmp_path / "root"
    cwd.mkdir()
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    proc = subprocess.run([sys.executable, "-c", CALLBACK_ONLY, str(RUN_PY), *args, f"paths.root={root}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert_refused_and_nothing_written(proc, root, cwd, args[-1].lstrip("+").split("=")[0], secret)


def test_the_entrypoint_refuses_command_line_secrets_even_with_the_callback_removed(run):
    proc, root, cwd = run("-m", "stage=prep", "~hydra.callbacks.refuse_secrets",
                          f"+server.env.HF_TOKEN={SWEEP_A},{SWEEP_B}")
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.HF_TOKEN", SWEEP_A, SWEEP_B)


def _leaky_conf(tmp_path: Path, body: str) -> str:
    """A config dir holding experiment/leaky.yaml, for `hydra.searchpath`: the secret is in no override."""
    conf = tmp_path / "extra_conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "leaky.yaml").write_text("# @package _global_\n" + body)
    return f"hydra.searchpath=[file://{conf.parent}]"


def test_secret_in_a_config_file_is_refused_before_hydra_copies_the_config(run, tmp_path):
    searchpath = _leaky_conf(tmp_path, f"server:\n  env:\n    WANDB_API_KEY: {'a' * 40}\n")
    proc, root, cwd = run("stage=prep", "experiment=leaky", searchpath)
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.WANDB_API_KEY", "a" * 40)


def test_secret_in_a_config_files_sweep_params_is_refused(run, tmp_path):
    searchpath = _leaky_conf(tmp_path, f"hydra:\n  sweeper:\n    params:\n      +server.env.HF_TOKEN: {SWEEP_A},{SWEEP_B}\n")
    proc, root, cwd = run("-m", "stage=prep", "experiment=leaky", searchpath)
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.HF_TOKEN", SWEEP_A, SWEEP_B)


def test_harmless_overrides_still_run_and_are_recorded(run):
    # The control: look-alikes of each refused shape are not secrets, and reach .hydra/ and job.json as before.
    proc, root, cwd = run("stage=prep", "server.urls=['http://127.0.0.1:1/v1?model=m']",
                          "server.extra_args=[--max-num-seqs,4]", "+server.env.SOME_FLAG=hf_short")
    assert proc.returncode != 2, proc.stderr[-2000:]
    (run_dir,) = (root / "runs").iterdir()
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "http://127.0.0.1:1/v1?model=m" in overrides and "hf_short" in overrides
    record = json.loads((run_dir / "job.json").read_text())
    assert "server.extra_args=[--max-num-seqs,4]" in record["overrides"]
    assert list(cwd.iterdir()) == []


# ---------------------------------------------------------------- the one decision, and redaction


def test_what_is_a_secret():
    from eagle3.config.secrets import find_secrets

    cfg = {"server": {"env": {"HF_TOKEN": "x", "HUGGING_FACE_HUB_TOKEN": "y", "VLLM_CPU_KVCACHE_SPACE": "1"},
                      "urls": ["http://a:b@h:1", "http://h:2/?api_key=z", "http://h:3/?model=m"],
                      "extra_args": ["--token", "t", "--max-num-seqs", "4", "--api-key=k"]},
           "model": {"path": "hf_internal_testing/tiny", "pad_token": "<pad>", "bos_token": "<s>"},
           "logger": {"api_key": "", "notes": f"uses {HF}"}}
    keys = sorted(f.key for f in find_secrets(cfg))
    assert keys == ["logger.notes", "server.env.HF_TOKEN", "server.env.HUGGING_FACE_HUB_TOKEN",
                    "server.extra_args[1]", "server.extra_args[4]", "server.urls[0]", "server.urls[1]"]
    shown = [f.shown for f in find_secrets(cfg)]
    assert "http://<redacted>@h:1" in shown and "http://h:2/?api_key=<redacted>" in shown
    assert not any(HF in s or s.endswith("=z") for s in shown)


def test_sweep_overrides_are_checked_value_by_value():
    from eagle3.config.secrets import find_secrets_in_overrides

    assert find_secrets_in_overrides(["stage=prep", "data.scale=64,128", "server.urls=[http://h:1]"]) == []
    found = find_secrets_in_overrides([f"data.notes=a,{HF}", "server.extra_args=[--x,1],[--api-key,k]",
                                       "+server.env.HF_TOKEN=a,b"])
    assert [f.key for f in found] == ["data.notes", "server.extra_args[1]", "server.env.HF_TOKEN"]


def test_records_redact_what_slips_through(tmp_path):
    from eagle3.artifacts import Manifest
    from eagle3.sweeps.jobs import parse_overrides, read_job_record, write_job_record

    write_job_record(tmp_path, {"overrides": [f"+server.env.HF_TOKEN={HF}"],
                                "failure": f"server.urls: http://u:{PASSWORD}@h:1 -- no server answered"})
    record = read_job_record(tmp_path)
    assert HF not in json.dumps(record) and PASSWORD not in json.dumps(record)
    assert "http://<redacted>@h:1" in record["failure"]
    assert parse_overrides(record["overrides"]) == {"server.env.HF_TOKEN": "<redacted>"}

    manifest = Manifest(stage="generate", name="x", fingerprint="f",
                        config={"server": {"extra_args": ["--api-key", API_KEY]}},
                        extra={"backend": {"urls": [f"http://h:1/?token={PASSWORD}"]}})
    (tmp_path / "m").mkdir()
    manifest.write(tmp_path / "m")
    text = (tmp_path / "m" / "manifest.json").read_text()
    assert API_KEY not in text and PASSWORD not in text and "?token=<redacted>" in text


def test_wandb_config_is_redacted_but_hashes_kept():
    from eagle3.tracking import redact

    sha = "0123456789abcdef0123456789abcdef01234567"
    out = redact({"server": {"env": {"WANDB_API_KEY": sha}, "urls": [f"http://u:{PASSWORD}@h"]},
                  "data": {"fingerprint": sha}})
    assert out["server"]["env"]["WANDB_API_KEY"] == "<redacted>"
    assert PASSWORD not in json.dumps(out)
    assert out["data"]["fingerprint"] == sha


def test_a_server_command_line_shows_secrets_redacted():
    """Library callers bypass validation; the command line that reaches logs still hides a secret."""
    from eagle3.serving.commands import ServerCommand

    command = ServerCommand(backend="vllm", argv=["python", "-m", "vllm", "--api-key", "sk-abcdefghijklmnopqrstuv",
                                                  "--port", "8000"],
                            env={"HF_TOKEN": "hf_0123456789abcdefghij", "OMP_NUM_THREADS": "2"},
                            host="127.0.0.1", port=8000)
    line = command.shell()
    assert "sk-abcdefghijklmnopqrstuv" not in line and "hf_0123456789abcdefghij" not in line
    assert "OMP_NUM_THREADS=2" in line and "--port 8000" in line and line.count("<redacted>") == 2
