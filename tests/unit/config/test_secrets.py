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

from tests.conftest import HANG_GUARD_S, RUN_PY, run_cli

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


@pytest.mark.slow
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
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
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


# ---------------------------------------------------------------- every spelling of a secret (issue 21, item 9)

NGC = "nvapi-abcdefghijklmnopqrstuvwxyz"
AZURE_HEX = "0123456789abcdef0123456789abcdef"  # 32 hex: secret only by its key's name (hex values never are)
AWS_ID = "AKIAIOSFODNN7EXAMPLE"


@pytest.mark.parametrize("override,key,secret", [
    (f"+server.env.NGC_CLI_KEY={NGC}", "server.env.NGC_CLI_KEY", NGC),
    (f"+server.env.AZURE_OPENAI_KEY={AZURE_HEX}", "server.env.AZURE_OPENAI_KEY", AZURE_HEX),
    (f"+server.env.ngc_cli_key={AZURE_HEX}", "server.env.ngc_cli_key", AZURE_HEX),
    (f"+generate.server.env.ngc_cli_key={AZURE_HEX}", "generate.server.env.ngc_cli_key", AZURE_HEX),
], ids=["ngc", "azure-hex", "lower-case-env", "generate-server-env"])
@pytest.mark.slow
def test_env_style_keys_and_ngc_keys_are_refused_before_hydra_writes_anything(run, override, key, secret):
    proc, root, cwd = run("stage=plan", override)
    assert_refused_and_nothing_written(proc, root, cwd, key, secret)


def test_a_lower_case_env_key_in_a_config_file_is_refused_by_the_callback(run, tmp_path):
    # Not on the command line: only the callback's walk of the composed config sees it, by its dotted key.
    searchpath = _leaky_conf(tmp_path, f"server:\n  env:\n    azure_openai_key: {AZURE_HEX}\n")
    proc, root, cwd = run("stage=plan", "experiment=leaky", searchpath)
    assert_refused_and_nothing_written(proc, root, cwd, "server.env.azure_openai_key", AZURE_HEX)


SECRET_NAMES = [
    # environment-variable style: a credential word among the `_`-separated words
    "NGC_CLI_KEY", "AZURE_OPENAI_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN",
    "DB_PASS", "MYSQL_PWD", "SMTP_PASSWD", "SERVICE_CREDENTIALS", "BASIC_AUTH", "OPENAI_APIKEY", "KEY",
    # a secret word in any spelling
    "password", "Password", "PASSWORD", "dbPassword", "db_password", "db-password", "user_passwd",
    "client-secret", "clientSecret", "client_secret", "MY_SECRET_NAME", "secret_name", "aws_credentials",
    "apiKey", "api-key", "privateKey", "private-key", "accessKey", "authToken", "accessToken", "refresh_secret_ref",
    # any key directly under an environment dict, judged as the variable it becomes
    "server.env.ngc_cli_key", "extract.server.env.x_key", "server.env.azure-openai-key", "hydra.job.env_set.MY_KEY",
    "hydra.job.env_set.hf_token", "+server.env.NGC_CLI_KEY",
]
NOT_SECRET_NAMES = [
    # eagle3's schema keys: redacting them would corrupt records
    "text_config_key", "exclude_keys", "thinking_keys", "bos_token", "pad_token", "eos_token", "max_new_tokens",
    "batch_tokens", "assumed_tokens_per_sample", "tokens_per_s", "chars_per_token", "num_draft_tokens",
    "num_key_value_heads", "tokenize", "sort_key", "dataset.columns.key", "key", "keys",
    # environment variables that are not credentials
    "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "MAX_TOKENS", "BYPASS_CACHE", "KEYBOARD_LAYOUT",
    "server.env.TOKENIZERS_PARALLELISM", "server.env.CUDA_VISIBLE_DEVICES", "server.env.SGL_ENABLE_JIT_DEEPGEMM",
    "server.env.max_tokens", "server.env.PWD", "PWD",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_name_is_secret_in_every_spelling(name):
    from eagle3.config.secrets import find_secrets, is_secret_key, redact, redact_text

    assert is_secret_key(name)
    *parents, last = name.lstrip("+").split(".")
    cfg: dict = {last: AZURE_HEX}
    for parent in reversed(parents):
        cfg = {parent: cfg}
    assert [f.key for f in find_secrets(cfg)] == [name.lstrip("+")]
    assert AZURE_HEX not in json.dumps(redact(cfg))
    assert redact_text(f"{name}={AZURE_HEX} vllm serve m") == f"{name}=<redacted> vllm serve m"


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_a_schema_or_harmless_name_is_not_secret(name):
    from eagle3.config.secrets import find_secrets, is_secret_key, redact, redact_text

    assert not is_secret_key(name)
    *parents, last = name.split(".")
    cfg: dict = {last: "value123"}
    for parent in reversed(parents):
        cfg = {parent: cfg}
    assert find_secrets(cfg) == [] and redact(cfg) == cfg
    assert redact_text(f"{name}=value123 run") == f"{name}=value123 run"


SECRET_VALUES = [NGC, "nvapi-" + "Ab3_-" * 12, AWS_ID, "ASIAZ2ABCDEFGHIJ7XYZ", "glpat-abcdefghij0123456789",
                 "xoxb-1234567890-abcdefghij", "xoxp-0123456789-abc", "AIza" + "Sy0123456789abcdefghijklmnopqrstu_-"]
NOT_SECRET_VALUES = [
    "0123456789abcdef" * 4,  # a sha256
    "0123456789abcdef0123456789abcdef01234567",  # a fingerprint
    AZURE_HEX, AZURE_HEX.upper(),
    "moonshotai/Kimi-K2.5", "nvidia/Llama-3.1-Nemotron-Nano-8B-v1", "nvapi-short",
    "AKIA" + "A" * 17,  # too long for an AWS key id
    "akiaiosfodnn7example", "/data/AKIA/x", "xoxo-hugs", "AIzaShort",
]


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_a_known_token_shape_is_secret_under_any_key(value):
    from eagle3.config.secrets import find_secrets, redact, redact_text

    (found,) = find_secrets({"data": {"notes": f"see {value} here"}})
    assert found.key == "data.notes" and value not in found.shown and "environment" in found.valid
    assert value not in json.dumps(redact({"data": {"notes": value}}))
    assert redact_text(f"NGC_CLI_KEY={value} vllm serve m") == "NGC_CLI_KEY=<redacted> vllm serve m"
    assert redact_text(f"launching with {value} now") == "launching with <redacted> now"


@pytest.mark.parametrize("value", NOT_SECRET_VALUES)
def test_hex_digests_and_look_alikes_are_not_secret(value):
    from eagle3.config.secrets import find_secrets, redact, redact_text

    assert find_secrets({"data": {"notes": value, "fingerprint": value}}) == []
    assert redact({"data": {"fingerprint": value}}) == {"data": {"fingerprint": value}}
    assert redact_text(f"model={value} run") == f"model={value} run"


def test_records_redact_env_keys_by_their_parent():
    """`redact` (job.json, manifests, W&B) knows an `env` dict's keys are environment variables."""
    from eagle3.config.secrets import redact, redact_overrides

    record = {"server": {"env": {"ngc_cli_key": AZURE_HEX, "OMP_NUM_THREADS": "2"}},
              "hydra": {"job": {"env_set": {"my_token": AZURE_HEX}}}, "notes": f"NGC_CLI_KEY={NGC}"}
    out = redact(record)
    assert AZURE_HEX not in json.dumps(out) and NGC not in json.dumps(out)
    assert out["server"]["env"]["OMP_NUM_THREADS"] == "2"
    assert redact_overrides([f"+server.env.AZURE_OPENAI_KEY={AZURE_HEX}", "stage=plan"]) == \
        ["+server.env.AZURE_OPENAI_KEY='<redacted>'", "stage=plan"]


@pytest.mark.parametrize("overrides", [
    [], ["model=kimi_k25"], ["experiment=plan_v4_100k"], ["logger=wandb"], ["server=sglang_sm120"],
    ["server=vllm_gpu", "model=llama31_8b"], ["server=sglang_h200", "dataset=plan_v4"],
], ids=lambda o: ",".join(o) or "default")
def test_no_key_of_a_composed_config_is_taken_for_a_secret(overrides):
    """A name rule that flags a schema key would refuse real configs and blank it in every record."""
    from omegaconf import OmegaConf

    from eagle3.config.secrets import find_secrets, redact
    from tests.conftest import compose_config

    plain = OmegaConf.to_container(compose_config(overrides), resolve=False)
    assert find_secrets(plain) == []
    assert redact(plain) == plain
