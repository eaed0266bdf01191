"""Every YAML composes and validates; every validation rule fires with a useful message."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from eagle3.cli import check_config
from eagle3.config import logger_schema, schema
from eagle3.paths import CONF_DIR, PROJECT_ROOT
from eagle3.stages import stage_names
from tests.conftest import FIXTURES, HANG_GUARD_S, compose_config

GROUP_FILES = sorted(p for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR)


def errors_for(overrides: list[str]) -> list[str]:
    return check_config(compose_config(overrides))


def test_conf_tree_has_the_expected_groups():
    groups = {p.parent.name for p in GROUP_FILES}
    assert {"dataset", "model", "server", "extract", "train", "logger", "paths", "experiment"} <= groups


# Options whose own values come from the command line (they have none to give): what this test gives them.
_RAW = FIXTURES / "raw"
OPTION_ARGS = {
    "dataset/files.yaml": [f"dataset.files=[{_RAW / 'sharegpt.jsonl'},{_RAW / 'glaive.jsonl'}]",
                           "dataset.track=prompt_only"],
    "model/auto.yaml": ["model.path=${eagle3_asset:demo_target}"],
    # scripts/build_target.py makes the checkpoints on a machine that runs it; each one's own
    # config.json (copied from that build) stands for it here, so the experiments are checked
    # against the real geometries (SmolLM2's 30 layers, Gemma 3's 18, Qwen 2's 28) on a fresh clone too.
    "experiment/smollm2.yaml": [f"model.path={FIXTURES / 'smollm2_config'}"],
    "experiment/gemma3_270m.yaml": [f"model.path={FIXTURES / 'gemma3_270m_config'}"],
    "experiment/qwen2_5_coder_1_5b.yaml": [f"model.path={FIXTURES / 'qwen2_5_coder_1_5b_config'}"],
    "variant/mla.yaml": ["model=demo_kimi"],  # MLA attention needs an MLA target
}


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_every_config_file_composes_and_validates(path: Path):
    group = str(path.parent.relative_to(CONF_DIR))
    cfg = compose_config([f"{group}={path.stem}", *OPTION_ARGS.get(str(path.relative_to(CONF_DIR)), [])])
    assert check_config(cfg) == []
    header = [line for line in path.read_text().splitlines()[:3] if not line.startswith("# @package")]
    assert header[0].startswith("# ") and len(header[0]) > 20, f"{path}: first line must say what it is for"
    assert header[1].startswith("# Usage: python scripts/run.py"), f"{path}: second line must show a command"


# Keys a YAML may set to the schema's default: the option exists to say exactly that (logger=none), or
# it undoes what an option it starts from derives (model=auto reads float32 from the Qwen checkpoint).
REPEATS_ALLOWED = {("logger/none.yaml", "logger"), ("experiment/qwen2_5_coder_1_5b.yaml", "model.dtype")}


def _leaves(node, prefix=""):
    """(dotted key, raw value) of every leaf a YAML file sets (its defaults list left out)."""
    for key in node.keys():
        if key == "defaults" and not prefix:
            continue
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(child, DictConfig) and len(child):
            yield from _leaves(child, path)
        else:
            value = child._value()
            yield path, OmegaConf.to_container(child) if isinstance(value, (DictConfig, ListConfig)) else value


_MISSING = object()


def _inherited(rel: Path, key: str):
    """The value a sibling option named in `rel`'s defaults list gives `key` (KeyError if none does).

    `server/vllm_gpu.yaml` starts from `server/vllm.yaml`: setting `profile: generic` there undoes
    vllm's `cpu`, so it restates the parent, not the schema default.
    """
    raw = OmegaConf.load(CONF_DIR / rel)
    for entry in raw.get("defaults", []) if len(rel.parts) > 1 else []:
        if isinstance(entry, str) and entry != "_self_" and (CONF_DIR / rel.parent / f"{entry}.yaml").is_file():
            parent = rel.parent / f"{entry}.yaml"
            value = OmegaConf.to_container(OmegaConf.load(CONF_DIR / parent), resolve=False)  # as written
            for part in key.split("."):
                value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
            if value is not _MISSING:
                return value
            return _inherited(parent, key)
    raise KeyError(key)


@functools.cache
def _structured(node_class: type) -> DictConfig:
    """The schema node of `node_class`, built once (read only: `_schema_default` walks it)."""
    return OmegaConf.structured(node_class)


def _schema_default(rel: Path, key: str):
    """The default of `key` as the option at `rel` sets it: its parent option's value, else the schema's.

    KeyError if neither has one.
    """
    try:
        return _inherited(rel, key)
    except KeyError:
        pass
    text = (CONF_DIR / rel).read_text()
    if rel.parts[0] == "logger" and "@package _global_" not in text:
        node = _structured(logger_schema.WandbLoggerConfig if rel.stem == "wandb" else logger_schema.CSVLoggerConfig)
    else:
        node = _structured(schema.Eagle3Config)
        if "@package _global_" not in text and len(rel.parts) > 1:
            key = f"{rel.parts[0]}.{key}"
    parts = key.split(".")
    if parts[:2] == ["dataset", "sources"] and len(parts) > 3:  # a source entry: the per-source defaults
        node, parts = _structured(schema.DatasetSourceConfig), parts[3:]
    for part in parts:
        if not isinstance(node, DictConfig) or part not in node:
            raise KeyError(key)
        node = node._get_node(part)
    value = node._value()
    return OmegaConf.to_container(node) if isinstance(value, (DictConfig, ListConfig)) else value


@pytest.mark.parametrize("path", sorted(CONF_DIR.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_no_yaml_value_repeats_its_schema_default(path: Path):
    """Each default lives in the schema (its docstring says so); a YAML that restates one is a copy."""
    rel = path.relative_to(CONF_DIR)
    raw = OmegaConf.load(path)
    repeats = []
    for key, value in _leaves(raw):
        if key.startswith("hydra") or (str(rel), key) in REPEATS_ALLOWED:
            continue
        try:
            default = _schema_default(rel, key)
        except KeyError:
            continue  # a key the schema leaves open (dataset sources, experiment-only keys)
        if value == default:
            repeats.append(f"{key}: {value!r}")
    assert not repeats, f"{rel} restates schema defaults (delete them): {', '.join(repeats)}"


def test_schema_docstring_states_the_defaults_rule():
    assert "a key's default lives here" in schema.__doc__


def test_a_missing_value_is_one_line_naming_the_key():
    errors = errors_for(["model.num_layers=???"])
    assert errors == ["model.num_layers: '???' -- has no value (the schema has no default for it); valid: set it "
                      "in the option's YAML or on the command line"]


def test_validation_loads_no_torch():
    """Validation answers before any model code loads: every list of valid choices it reads lives in a
    torch-free module of the package that owns it."""
    code = ("import sys; from tests.conftest import compose_config; from eagle3.cli import check_config; "
            "assert check_config(compose_config(['stage=bench', 'server=vllm'])) == [];"
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_server_backend_has_a_generation_backend():
    from eagle3.engines import SERVER_BACKENDS
    from eagle3.generation.factory import BACKENDS

    assert tuple(BACKENDS) == SERVER_BACKENDS


def test_root_config_has_header():
    lines = (CONF_DIR / "config.yaml").read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1].startswith("# Usage: python scripts/run.py")


def test_root_config_composes_with_demo_defaults():
    cfg = compose_config()
    assert check_config(cfg) == []
    assert cfg.model.name == "demo" and cfg.server.backend == "hf"
    assert set(cfg.dataset.sources) == {"demo_native", "demo_prompts"}
    assert Path(cfg.model.path).is_dir(), "the demo target is committed in the package"
    assert Path(cfg.paths.root).is_absolute()


def test_kimi_model_config_matches_the_published_geometry():
    cfg = compose_config(["model=kimi_k25"])
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (61, 7168, 163840)
    assert list(m.capture_layers) == [2, 30, 58]
    assert m.draft.vocab_size == 32000 and m.draft.fc_in_features == 3 * 7168
    assert m.trust_remote_code is True and m.text_config_key == "text_config"


def test_kimi_native_composes_both_kimi_sets():
    cfg = compose_config(["dataset=kimi_native"])
    assert set(cfg.dataset.sources) == {"deepswe_kimi", "kimik25_2000x"}
    assert {s.track for s in cfg.dataset.sources.values()} == {"target_native"}


def test_plan_v4_experiment_is_the_original_setup():
    cfg = compose_config(["experiment=plan_v4_100k"])
    assert check_config(cfg) == []
    assert cfg.model.name == "kimi_k25" and cfg.server.profile == "sm120"
    assert cfg.data.scale == 100000
    tracks = {s.track for s in cfg.dataset.sources.values()}
    assert tracks == {"target_native", "prompt_only"}


def test_unknown_stage_lists_valid_stages():
    errors = errors_for(["stage=nope"])
    assert len(errors) == 1
    assert errors[0].startswith("stage: 'nope'")
    assert errors[0].endswith(f"valid: {', '.join(stage_names())}")
    assert ", demo_data, prep," in errors[0]  # registry order


def test_capture_layer_out_of_range():
    errors = errors_for(["model.capture_layers=[2,4,8]"])
    assert any(
        e.startswith("model.capture_layers: [2, 4, 8]") and "layer 8 is out of range for a 8-layer model" in e
        and "ids in [0, 7]" in e for e in errors
    ), errors


def test_kimi_capture_layer_out_of_range():
    errors = errors_for(["model=kimi_k25", "model.capture_layers=[2,30,61]", "model.draft.fc_in_features=21504"])
    assert any("layer 61 is out of range for a 61-layer model" in e and "[2, 30, 58]" in e for e in errors)


def test_fc_input_must_match_captured_width():
    errors = errors_for(["model=kimi_k25", "model.draft.fc_in_features=7168"])
    assert errors == [
        "model.draft.fc_in_features: 7168 -- the draft's fc reads len(capture_layers) x hidden = "
        "3 x 7168 = 21504 features; valid: 21504"
    ]


def test_fc_input_follows_number_of_capture_layers():
    # Four capture layers need a 4H fc; keeping the 3H value is the mistake the rule exists for.
    errors = errors_for(["model=kimi_k25", "model.capture_layers=[2,20,40,58]"])
    assert any("4 x 7168 = 28672" in e for e in errors)


def test_draft_vocab_larger_than_target_vocab():
    errors = errors_for(["model=kimi_k25", "model.draft.vocab_size=200000"])
    assert errors == [
        "model.draft.vocab_size: 200000 -- larger than the target vocab (163840); valid: <= 163840"
    ]


def test_eagle_algorithm_with_eagle3_draft_is_refused():
    errors = errors_for(["server=sglang", "server.speculative.algorithm=EAGLE"])
    assert len(errors) == 1
    assert errors[0].startswith("server.speculative.algorithm: 'EAGLE'")
    assert "fc fusion layer is bypassed" in errors[0] and errors[0].endswith("valid: EAGLE3")


def test_eagle_algorithm_checked_against_draft_checkpoint(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    errors = errors_for(["server=vllm", "server.speculative.algorithm=EAGLE",
                         f"server.speculative.draft_path={draft}"])
    assert any("the draft is EAGLE-3" in e for e in errors)
    # An EAGLE(-1/2) checkpoint with EAGLE is fine.
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"]}))
    assert errors_for(["server=vllm", "server.speculative.algorithm=EAGLE",
                       f"server.speculative.draft_path={draft}"]) == []


@pytest.mark.parametrize("key,value", [
    ("attention_backend", "fa3"),
    ("attention_backend", "trtllm_mla"),
    ("prefill_attention_backend", "trtllm_mha"),
    ("decode_attention_backend", "flashmla"),
    ("moe_runner_backend", "deep_gemm"),
    ("moe_runner_backend", "deepgemm"),
])
def test_sm120_refuses_kernels_it_cannot_run(key, value):
    errors = errors_for(["server=sglang_sm120", f"server.kernels.{key}={value}"])
    assert errors == [
        f"server.kernels.{key}: '{value}' -- does not run on sm120 (Unsupported architecture); "
        "valid: triton, flashinfer (MHA)"
    ]


def test_same_kernel_is_fine_on_h200():
    assert errors_for(["server=sglang_h200", "server.kernels.attention_backend=fa3"]) == []


def test_sm120_requires_deepgemm_jit_off_and_sane_memory_fraction():
    errors = errors_for(["server=sglang_sm120", "server.env.SGL_ENABLE_JIT_DEEPGEMM=1",
                         "server.mem_fraction_static=0.9"])
    assert len(errors) == 2
    assert errors[0].startswith("server.env.SGL_ENABLE_JIT_DEEPGEMM: '1'")
    assert errors[1].startswith("server.mem_fraction_static: 0.9")


def test_chain_draft_token_count():
    errors = errors_for(["server=sglang", "server.speculative.num_draft_tokens=3"])
    assert errors == [
        "server.speculative.num_draft_tokens: 3 -- a chain draft (eagle_topk=1) of 3 steps "
        "verifies num_steps+1 tokens; valid: 4"
    ]


def test_generate_server_is_the_backends_engine_and_meets_the_server_rules_when_generate_uses_it():
    # In-process generation (the default) reads no server node.
    assert errors_for(["generate.server.host=0.0.0.0"]) == []
    assert errors_for(["generate.backend=vllm", "generate.server.host=0.0.0.0",
                       "generate.server.extra_args=[--port,1]"]) == [
        "generate.server.host: '0.0.0.0' -- servers this project launches bind loopback only; "
        "valid: 127.0.0.1, ::1 or localhost",
        "generate.server.extra_args: '--port' -- the launcher sets this flag from generate.server.port (and "
        "checks it there); valid: set generate.server.port instead"]
    # The default node (server/cpu.yaml) follows the backend: that engine on this CPU, from its own venv.
    for engine in ("sglang", "vllm"):
        cfg = compose_config([f"generate.backend={engine}", f"extract.backend={engine}"])
        assert check_config(cfg) == []
        for node in (cfg.generate.server, cfg.extract.server):
            assert (node.backend, node.profile) == (engine, "cpu")
            assert node.python == str(PROJECT_ROOT / f".{engine}-venv" / "bin" / "python")
    assert errors_for(["generate.backend=sglang", "server@generate.server=vllm"]) == [
        "generate.backend: 'sglang' -- generate.server.backend is 'vllm': generate would launch (or talk to) a "
        "vllm server; valid: vllm, or keep sglang with server@generate.server=sglang (or server/cpu.yaml, whose "
        "backend follows generate.backend)"]
    assert errors_for(["extract.backend=sglang", "server@extract.server=vllm"]) == [
        "extract.server.backend: 'vllm' -- extract.backend=sglang takes hidden states from a sglang server; valid: "
        "sglang (conf/config.yaml composes server/cpu.yaml into extract.server, whose backend follows "
        "extract.backend)"]
    assert errors_for(["generate.backend=sglang", "server@generate.server=sglang"]) == []
    assert errors_for(["generate.backend=tgi"]) == ["generate.backend: 'tgi' -- not a known choice; "
                                                    "valid: hf, sglang, vllm"]


def test_server_must_bind_loopback():
    errors = errors_for(["server=vllm", "server.host=0.0.0.0"])
    assert errors == ["server.host: '0.0.0.0' -- servers this project launches bind loopback only; "
                      "valid: 127.0.0.1, ::1 or localhost"]


def test_model_geometry_checked_against_local_checkpoint():
    errors = errors_for(["model.num_layers=12", "model.capture_layers=[2,6,9]",
                         "model.draft.fc_in_features=768"])
    assert any(e.startswith("model.num_layers: 12 -- ") and "num_hidden_layers=8" in e for e in errors)


def test_dataset_source_rules():
    errors = errors_for(["dataset.sources.demo_prompts.track=native",
                         "dataset.sources.demo_prompts.schema=csv",
                         "+dataset.sources.demo_prompts.hub_id=someone/set"])
    assert "dataset.sources.demo_prompts.track: 'native' -- not a known choice; valid: target_native, prompt_only" in errors
    assert any(e.startswith("dataset.sources.demo_prompts.schema: 'csv'") for e in errors)
    assert any(e.startswith("dataset.sources.demo_prompts: ") and "exactly one origin" in e for e in errors)


def test_secrets_in_config_are_refused_without_echoing_them():
    errors = errors_for(["+server.env.WANDB_API_KEY=abc123", "+server.env.HF_TOKEN=hf_xyz"])
    assert len(errors) == 2
    assert all("<redacted>" in e and "environment" in e for e in errors)
    assert not any("abc123" in e or "hf_xyz" in e for e in errors)


def test_credentials_in_server_urls_and_flags_are_refused_without_echoing_them():
    # A config composed outside the entrypoint (a notebook) meets the same rule at validation.
    errors = errors_for(["server.urls=[http://u:pw1234@127.0.0.1:1]", "server.extra_args=[--api-key,k3y]",
                         "extract.server.extra_args=['--token=t0k']", "+server.env.GITHUB_TOKEN=g",
                         "generate.server.urls=[http://u:pw5678@127.0.0.1:2]"])
    keys = sorted(e.split(":")[0] for e in errors)
    assert keys == ["extract.server.extra_args[0]", "generate.server.urls[0]", "server.env.GITHUB_TOKEN",
                    "server.extra_args[1]", "server.urls[0]"], errors
    assert not any(s in e for e in errors for s in ("pw1234", "k3y", "t0k", "pw5678"))
    assert "VLLM_API_KEY" in next(e for e in errors if e.startswith("server.extra_args[1]"))


def test_all_errors_are_reported_together():
    errors = errors_for(["stage=nope", "model.capture_layers=[2,4,99]", "model.draft.vocab_size=99999",
                         "train.ttt_decay=1.5", "extract.shard=3", "extract.storage_format=fp4"])
    keys = [e.split(":")[0] for e in errors]
    for key in ("stage", "model.capture_layers", "model.draft.vocab_size", "train.ttt_decay",
                "extract.shard", "extract.storage_format"):
        assert key in keys, (key, errors)


def test_registry_entries_load_the_stage_they_name():
    from eagle3.stages import CHAIN

    for entry in CHAIN:
        stage = entry.load()
        assert stage.name == entry.name and stage.help


def test_sweep_job_dirnames_stay_one_short_directory_name():
    from eagle3.config.registration import JOB_DIRNAME_MAX, job_dirname

    assert job_dirname("data.scale=64") == "data.scale=64"
    assert job_dirname("server.python=.vllm-venv/bin/python") == "server.python=.vllm-venv_bin_python"
    long_a = ",".join(f"train.key{i}=value{i}" for i in range(20))
    long_b = long_a.replace("value19", "value20")
    a, b = job_dirname(long_a), job_dirname(long_b)
    assert len(a.encode()) <= JOB_DIRNAME_MAX and a != b and a.startswith("train.key0=value0,")


def test_a_deeper_draft_is_refused_only_where_sglang_serves_it():
    """SGLang builds one draft layer; vLLM any number (eagle3.engines.ENGINE_MAX_DRAFT_LAYERS)."""
    assert errors_for(["model.draft.num_layers=2"]) == []  # trained and exported for vLLM
    assert errors_for(["stage=bench", "server=vllm", "model.draft.num_layers=3"]) == []
    errors = errors_for(["stage=bench", "server=sglang", "model.draft.num_layers=2"])
    assert len(errors) == 1 and errors[0].startswith("model.draft.num_layers: 2 -- sglang cannot serve")
    assert "EAGLE3 currently only supports 1 layer" in errors[0] and "valid: 1 for sglang" in errors[0]
    assert errors_for(["model.draft.num_layers=0"]) == ["model.draft.num_layers: 0 -- must be a positive number; "
                                                         "valid: > 0"]


def test_rescored_chains_refuse_packed_rows():
    errors = errors_for(["variant=rescored", "train.packing=true"])
    assert errors == ["train.packing: true -- train.ttt_chains=rescored scores each sample's chains as one prefix "
                      "tree and reads right-padded rows; valid: false, or train.ttt_chains=all"]
    assert errors_for(["variant=rescored"]) == []
