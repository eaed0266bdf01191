"""The hidden-state sources' parts that need no server: vLLM's command line, the connector module,
the final norm, the checks on a server's file, the config rules, and the plan of both modes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3.cli import check_config
from eagle3.config.convert import to_settings
from eagle3.config.client_schema import ExtractHTTPConfig
from eagle3.extract import vllm_connector
from eagle3.extract.sources import (PLUGIN_MODULE, exchange_dir, extraction_batch_tokens, extraction_command,
                                     vllm_layer_ids)
from eagle3.extract.vllm_client import VLLMStates
from eagle3.paths import PROJECT_ROOT
from eagle3.target.weights import load_final_norm, rms_norm
from tests.conftest import compose_config

DEMO_TARGET = PROJECT_ROOT / "eagle3" / "assets" / "demo_target"
VLLM_GENERIC = ["extract.backend=vllm", "extract.server.profile=generic", f"extract.server.python={sys.executable}"]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_extraction_server_runs_the_target_in_its_dtype_with_eagle3s_connector(tmp_path):
    cfg = to_settings(compose_config([*VLLM_GENERIC, f"paths.root={tmp_path}"]))
    command = extraction_command(cfg, tmp_path / "run")
    argv = command.argv
    assert _flag(argv, "--dtype") == "float32"  # model.dtype: what the stored states are a function of
    assert _flag(argv, "--max-model-len") == "2049"  # data.max_len + the one token generated
    assert "--no-enable-prefix-caching" in argv
    spec = json.loads(_flag(argv, "--speculative-config"))
    # HF hidden_states indices of the capture layers [2, 4, 5], then num_layers = the final residual.
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}}}
    transfer = json.loads(_flag(argv, "--kv-transfer-config"))
    assert transfer["kv_connector"] == vllm_connector.CONNECTOR_NAME == "Eagle3HiddenStatesConnector"
    assert transfer["kv_connector_module_path"] == PLUGIN_MODULE and transfer["kv_role"] == "kv_producer"
    assert transfer["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "hidden_states" / ".incoming")
    assert str(exchange_dir(cfg.extract)) == transfer["kv_connector_extra_config"]["shared_storage_path"]
    plugin = tmp_path / "run" / "vllm_plugin"
    assert command.env["PYTHONPATH"].split(":")[0] == str(plugin)
    assert (plugin / f"{PLUGIN_MODULE}.py").read_bytes() == Path(vllm_connector.__file__).read_bytes()
    assert command.host == "127.0.0.1" and _flag(argv, "--host") == "127.0.0.1"
    assert "eagle3" not in " ".join(a for a in argv if a.startswith("--speculative"))  # it extracts, never drafts


def test_kimi_extraction_server_on_eight_gpus(tmp_path):
    cfg = to_settings(compose_config(["experiment=plan_v4_100k", f"paths.root={tmp_path}"]))
    argv = extraction_command(cfg, tmp_path / "run").argv
    assert _flag(argv, "--tensor-parallel-size") == "8" and "--trust-remote-code" in argv
    assert vllm_layer_ids(cfg.model) == [2, 30, 58, 61]
    assert _flag(argv, "--max-model-len") == "16385"  # data.max_len 16384 (10K+ trajectories) + 1
    assert "VLLM_CPU_KVCACHE_SPACE" not in extraction_command(cfg, tmp_path / "run").env  # vllm_gpu: no CPU env


def test_the_connector_module_imports_without_vllm_and_names_only_its_class():
    assert vllm_connector.CONNECTOR_NAME == "Eagle3HiddenStatesConnector"
    with pytest.raises(AttributeError, match="no attribute 'Other'"):
        vllm_connector.Other  # noqa: B018
    with pytest.raises(ImportError):  # the main environment has no vLLM: the class is built only inside a server
        getattr(vllm_connector, vllm_connector.CONNECTOR_NAME)


def test_the_connectors_file_is_whole_or_absent(tmp_path):
    target = tmp_path / "states.safetensors"
    vllm_connector._write_atomically({"x": torch.ones(3)}, str(target))
    assert target.is_file() and [p.name for p in tmp_path.iterdir()] == ["states.safetensors"]
    with pytest.raises(Exception):
        vllm_connector._write_atomically({"x": "not a tensor"}, str(tmp_path / "bad.safetensors"))
    assert [p.name for p in tmp_path.iterdir()] == ["states.safetensors"]  # no temporary left behind


def test_final_norm_equals_transformers_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    weight, eps = load_final_norm(str(DEMO_TARGET))
    assert weight.shape == (256,) and weight.dtype == torch.float32 and eps == pytest.approx(1e-5)
    ref = LlamaRMSNorm(256, eps=eps)
    with torch.no_grad():
        ref.weight.copy_(weight)
    x = torch.randn(7, 256) * 5
    torch.testing.assert_close(rms_norm(x, weight, eps), ref(x), atol=1e-6, rtol=1e-6)
    naive = torch.stack([weight * r / torch.sqrt((r * r).mean() + eps) for r in x])
    torch.testing.assert_close(rms_norm(x, weight, eps), naive, atol=1e-5, rtol=1e-5)


def _states(n_capture=3, hidden=4):
    settings = ExtractHTTPConfig(concurrency=1, request_timeout_s=1, max_attempts=1, backoff_s=0, max_backoff_s=0,
                                 max_consecutive_failures=0, connect_wait_s=1, file_wait_s=1)
    return VLLMStates(["http://127.0.0.1:9"], settings, n_capture, (torch.full((hidden,), 2.0), 1e-6))


def test_a_servers_file_becomes_aux_and_normed_final_states():
    source = _states()
    states = torch.randn(5, 4, 4)  # [T, C + 1, H]
    aux, final = source._convert([1, 2, 3, 4, 5], {"hidden_states": states, "token_ids": torch.arange(1, 6)}, "f")
    torch.testing.assert_close(aux, states[:, :3].reshape(5, 12))  # capture layers side by side
    torch.testing.assert_close(final, rms_norm(states[:, 3], torch.full((4,), 2.0), 1e-6))
    source.close()


@pytest.mark.parametrize("data, reason, text", [
    ({"hidden_states": torch.zeros(3, 4, 4), "token_ids": torch.tensor([1, 2, 9])}, "hidden_states_mismatch",
     "other token ids"),
    ({"hidden_states": torch.zeros(3, 3, 4), "token_ids": torch.tensor([1, 2, 3])}, "bad_hidden_states",
     "shape [3, 3, 4], expected [3, 4, 4]"),
    ({"token_ids": torch.tensor([1, 2, 3])}, "bad_hidden_states", "lacks hidden_states/token_ids"),
])
def test_a_servers_file_that_does_not_match_the_prompt_is_a_reject(data, reason, text):
    source = _states()
    got = source._convert([1, 2, 3], data, "/x/f.safetensors")
    assert got[0] == reason and text in got[1] and "/x/f.safetensors" in got[1]
    source.close()


def test_the_client_reads_and_removes_the_servers_file(tmp_path):
    import asyncio

    source = _states()
    path = tmp_path / "r.safetensors"
    save_file({"hidden_states": torch.ones(2, 4, 4), "token_ids": torch.tensor([5, 6])}, str(path))
    data = asyncio.run(source._read(path))
    assert not path.exists() and data["token_ids"].tolist() == [5, 6]
    with pytest.raises(Exception, match="not written within 1 s"):
        asyncio.run(source._read(tmp_path / "never.safetensors"))
    source.close()


def test_config_rules_of_the_hidden_state_sources():
    errors = check_config(compose_config(["train.hidden_states=cached", "extract.backend=tgi"]))
    assert any(e.startswith("train.hidden_states: 'cached'") and "store, online" in e for e in errors), errors
    assert any(e.startswith("extract.backend: 'tgi'") and "hf, vllm" in e for e in errors), errors
    errors = check_config(compose_config(["extract.backend=vllm", "server@extract.server=sglang"]))
    assert any(e.startswith("extract.server.backend: 'sglang'") and "vllm" in e for e in errors), errors
    errors = check_config(compose_config(["extract.backend=vllm", "extract.http.concurrency=0"]))
    assert any(e.startswith("extract.http.concurrency: 0") for e in errors), errors
    errors = check_config(compose_config(["stage=serve", "serve.hidden_states=true"]))
    assert any(e.startswith("serve.hidden_states") and "extract.backend=vllm" in e for e in errors), errors
    assert check_config(compose_config(["extract.backend=vllm", "train.hidden_states=online"])) == []


def test_serve_dry_run_prints_the_extraction_server(cli, tmp_path):
    done = cli("stage=serve", "serve.hidden_states=true", "serve.dry_run=true", *VLLM_GENERIC)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "handing out hidden states into" in done.stdout and "extract_hidden_states" in done.stdout
    assert "dry run: nothing launched" in done.stdout
    assert not (tmp_path / "artifacts" / "hidden_states" / ".incoming").exists()  # a dry run creates nothing



def test_the_sglang_extraction_server_loads_eagle3s_capture_plugin_and_computes_each_prompt_whole(tmp_path):
    from importlib.metadata import distributions

    from eagle3.extract import sglang_plugin
    from eagle3.extract.sources import SGLANG_PLUGIN_MODULE

    cfg = to_settings(compose_config(["extract.backend=sglang", f"paths.root={tmp_path}"]))
    command = extraction_command(cfg, tmp_path / "run")
    argv = command.argv
    assert command.backend == "sglang" and argv[0] == str(PROJECT_ROOT / ".sglang-venv" / "bin" / "python")
    assert _flag(argv, "--dtype") == "float32" and _flag(argv, "--context-length") == "2049"
    assert "--enable-return-hidden-states" in argv and "--disable-radix-cache" in argv  # no cached prefix
    assert _flag(argv, "--chunked-prefill-size") == "2049"  # one chunk per prompt
    assert _flag(argv, "--device") == "cpu" and command.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert not any(a.startswith("--speculative") for a in argv)
    # The capture layers as they are (eagle3's numbering): the plugin sets them itself.
    assert command.env[sglang_plugin.CAPTURE_ENV] == "2,4,5"
    plugin = tmp_path / "run" / "sglang_plugin"
    assert command.env["PYTHONPATH"].split(":")[0] == str(plugin)
    assert (plugin / f"{SGLANG_PLUGIN_MODULE}.py").read_bytes() == Path(sglang_plugin.__file__).read_bytes()
    # What SGLang's load_plugins() finds there: our entry point in its group.
    [dist] = [d for d in distributions(path=[str(plugin)])]
    [entry] = [e for e in dist.entry_points if e.group == "sglang.srt.plugins"]
    assert (entry.name, entry.value) == ("eagle3_capture", f"{SGLANG_PLUGIN_MODULE}:register")


def _sglang_states(n_capture=3, hidden=4):
    from eagle3.extract.sglang_client import SGLangStates

    settings = ExtractHTTPConfig(concurrency=1, request_timeout_s=1, max_attempts=1, backoff_s=0, max_backoff_s=0,
                                 max_consecutive_failures=0, connect_wait_s=1, file_wait_s=1)
    return SGLangStates(["http://127.0.0.1:9"], settings, n_capture, hidden)


def test_an_sglang_answer_becomes_aux_and_the_final_state_as_it_is():
    source = _sglang_states()
    rows = torch.randn(5, 16)  # [T, (C + 1) * H]: three captures, then the final-normed state
    aux, final = source._convert([1, 2, 3, 4, 5], (rows.tolist(), 5), "u")
    torch.testing.assert_close(aux, rows[:, :12])
    torch.testing.assert_close(final, rows[:, 12:])  # no norm applied: the plugin hands it out normed
    source.close()


@pytest.mark.parametrize("answer, reason, text", [
    ((torch.zeros(3, 16).tolist(), 4), "hidden_states_mismatch", "read 4 prompt tokens, not the 3 sent"),
    ((torch.zeros(2, 16).tolist(), None), "hidden_states_mismatch", "2 rows of states for 3 prompt tokens"),
    ((torch.zeros(3, 12).tolist(), 3), "bad_hidden_states", "shape [3, 12], expected [3, 16]"),
    (([[float("nan")] * 16] * 3, 3), "bad_hidden_states", "non-finite"),
    ((["x"], 3), "bad_hidden_states", "not a table of numbers"),
])
def test_an_sglang_answer_that_does_not_fit_the_prompt_is_a_reject(answer, reason, text):
    source = _sglang_states()
    got = source._convert([1, 2, 3], answer, "http://h/generate")
    assert got[0] == reason and text in got[1] and "http://h/generate" in got[1], got
    source.close()


@pytest.mark.parametrize("backend, cuda, want", [("hf", False, 2048), ("hf", True, 8192), ("vllm", False, 8192),
                                                 ("sglang", False, 8192)])
def test_extraction_batches_default_to_what_the_device_runs_fastest(monkeypatch, backend, cuda, want):
    """On a CPU large in-process batches leave the caches (BENCHMARKS: 1.05-1.31x slower at 8,192)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = to_settings(compose_config([f"extract.backend={backend}"]))
    assert cfg.extract.batch_tokens is None
    assert extraction_batch_tokens(cfg.extract) == want
    pinned = to_settings(compose_config([f"extract.backend={backend}", "extract.batch_tokens=96"]))
    assert extraction_batch_tokens(pinned.extract) == 96
