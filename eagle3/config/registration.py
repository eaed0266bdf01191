"""Registers the schema with Hydra's ConfigStore and the resolvers the YAML files use.

Imported (and so run) by `eagle3.config`, before any composition: both the entrypoint and the
tests compose through it.

`${eagle3_checkpoint:<field>}` is how `conf/model/auto.yaml` derives a target's geometry from its
own config.json (`eagle3.target_info.target_config`). OmegaConf resolves it on each access, so
everything downstream (validation, fingerprints, plan) reads plain values, and a value the user
sets replaces the interpolation. When it cannot be derived it raises `DerivedValueError`, which
config validation reports as one line under the key to set (`resolution_cause`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from eagle3.config.logger_schema import CSVLoggerConfig, WandbLoggerConfig
from eagle3.config.schema import DraftGeometryConfig, Eagle3Config, ModelConfig
from eagle3.config.server_schema import ServerConfig
from eagle3.dtypes import DTYPES
from eagle3.engines import CPU_ENGINE_DTYPES, CPU_ENGINE_VENVS, serving_layer_default
from eagle3.layer_ids import standard_capture_layers
from eagle3.paths import PROJECT_ROOT, asset_path, demo_answerer
from eagle3.target_info import (
    DEFAULT_TEXT_CONFIG_KEY,
    HF_CONFIG_KEYS,
    TargetConfigError,
    target_config,
    target_name,
)

_registered = False
# A sweep job's directory name is "<num>_<overrides>"; file systems refuse names over 255 bytes.
JOB_DIRNAME_MAX = 120


def job_dirname(overrides: str) -> str:
    """`hydra.job.override_dirname` made safe as one directory name.

    Slashes (paths in override values) would nest directories, and a sweep with many overrides
    exceeds the file system's name limit; a long name keeps its readable start and gets a hash
    of the whole, so two jobs never share a directory.
    """
    name = str(overrides).replace("/", "_")
    if len(name.encode("utf-8")) <= JOB_DIRNAME_MAX:
        return name
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:10]
    return name.encode("utf-8")[:JOB_DIRNAME_MAX - 12].decode("utf-8", "ignore") + "~" + digest


CHECKPOINT_RESOLVER = "eagle3_checkpoint"
#: The target's facts `model=auto` reads from the checkpoint: where it cannot, the user sets these.
TARGET_KEYS = (*HF_CONFIG_KEYS, "capture_layers")
#: What `${eagle3_checkpoint:<field>}` can derive (`model.<field>`, and the draft's two under model.draft).
CHECKPOINT_FIELDS = ("name", "dtype", *TARGET_KEYS, "draft_vocab_size", "fc_in_features")


class DerivedValueError(ValueError):
    """A value `${eagle3_checkpoint:...}` cannot derive, as the config-error line reports it.

    Attributes:
        key: The config key to set (`model.num_layers`).
        value: Its raw value (the interpolation).
        why: Why it has no value; `reason` is the bare cause (`<path> has no config.json`).
        valid: What to set instead.
    """

    def __init__(self, key: str, value: Any, why: str, valid: str, reason: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key, self.value, self.why, self.valid, self.reason = key, value, why, valid, reason


def resolution_cause(exc: Optional[BaseException],
                     types: tuple[type, ...] = (DerivedValueError,)) -> Optional[BaseException]:
    """The first exception of `types` behind one OmegaConf raised while resolving, if any.

    OmegaConf wraps a resolver's exception (once per interpolation level it went through) and
    keeps it as the context; the outermost `DerivedValueError` names the key whose own
    derivation failed.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, types):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _model_node(node: Any) -> DictConfig:
    """The `model` node a `${eagle3_checkpoint:...}` sits in (its parent, or the draft's parent)."""
    # `in` is False for a key whose value is missing (model.path before the user sets it): ask keys().
    while node is not None and not (isinstance(node, DictConfig) and {"path", "draft"} <= set(node.keys())):
        node = node._get_parent()
    if node is None:
        raise ValueError(f"${{{CHECKPOINT_RESOLVER}:...}} belongs in a model config (model.*, model.draft.*)")
    return node


def checkpoint_value(field: str, *, _parent_: Any, _root_: Any, _node_: Any) -> Any:
    """The value of `${eagle3_checkpoint:<field>}`, derived from the target's config.json.

    `num_layers`, `hidden_size`, `vocab_size` are the checkpoint's (`text_config` aware);
    `capture_layers` follows `model.num_layers` by EAGLE-3's rule; the draft's `vocab_size` is the
    schema's default capped at the target vocab (a draft vocab is a subset of the target's), its
    `fc_in_features` is len(capture_layers) x hidden. Each reads the model's resolved values, so
    a value the user sets is what the others follow.
    """
    if field not in CHECKPOINT_FIELDS:
        raise ValueError(f"{CHECKPOINT_RESOLVER}: unknown field {field!r}; valid: {', '.join(CHECKPOINT_FIELDS)}")
    model = _model_node(_parent_)
    key, raw = _node_._get_full_key(None), _node_._value()
    if field == "name":
        return target_name(model.path)
    if field == "dtype":
        return _checkpoint_dtype(model, OmegaConf.select(_root_, "paths.hf_cache", default=None))
    if field in HF_CONFIG_KEYS:
        return _config_value(model, field, key, raw, OmegaConf.select(_root_, "paths.hf_cache", default=None))
    if field == "capture_layers":
        return _capture_layers(model, key, raw)
    if field == "draft_vocab_size":
        return min(DraftGeometryConfig.vocab_size, int(model.vocab_size))
    return len(model.capture_layers) * int(model.hidden_size)  # fc_in_features


def _config_value(model: DictConfig, field: str, key: str, raw: Any, cache_dir: Optional[str]) -> int:
    hf_key, valid = HF_CONFIG_KEYS[field], f"set {key} (an integer), or a model.path whose config.json can be read"
    try:
        found = target_config(model.path, model.revision, model.text_config_key, cache_dir)
    except TargetConfigError as exc:
        raise DerivedValueError(key, raw, f"model=auto reads it from the checkpoint's config.json: {exc}",
                                valid, str(exc)) from None
    value = found.values.get(hf_key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        where = model.text_config_key or DEFAULT_TEXT_CONFIG_KEY
        reason = f"{found.file} has no positive integer {hf_key} (at its top level or under {where!r})"
        raise DerivedValueError(key, raw, f"model=auto reads it from config.json, but {reason}", valid, reason)
    return value


def _checkpoint_dtype(model: DictConfig, cache_dir: Optional[str]) -> str:
    """The dtype the checkpoint was saved in (`torch_dtype` / `dtype`), else the schema's default.

    A checkpoint saved in float32 (a small test model) then runs as saved, a bf16 one in bf16. An
    unreadable config is not reported here: the geometry keys report it, once each.
    """
    try:
        values = target_config(model.path, model.revision, model.text_config_key, cache_dir).values
    except TargetConfigError:
        return ModelConfig.dtype
    saved = values.get("torch_dtype") or values.get("dtype")
    return saved if saved in DTYPES else ModelConfig.dtype


def _capture_layers(model: DictConfig, key: str, raw: Any) -> list[int]:
    try:
        num_layers = int(model.num_layers)
    except Exception as exc:  # OmegaConf's wrapper of what model.num_layers raised
        cause = resolution_cause(exc)
        if not isinstance(cause, DerivedValueError):
            raise  # not the checkpoint's fault (model.path unset): reported under its own key
        raise DerivedValueError(key, raw, f"model=auto derives it from model.num_layers ([2, L//2, L-3]), read "
                                f"from the checkpoint's config.json: {cause.reason}",
                                f"set {key} (a list of layer ids), or model.num_layers", cause.reason) from None
    try:
        return standard_capture_layers(num_layers)
    except ValueError as exc:
        raise DerivedValueError(key, raw, f"model=auto cannot derive it: {exc}",
                                f"set {key} to strictly increasing layer ids in [1, {num_layers - 1}] "
                                "(3 of them for SGLang)", str(exc)) from None


def cpu_engine_setting(backend: str, setting: str) -> str:
    """`${eagle3_cpu_engine:<backend>,python|dtype}` (conf/server/cpu.yaml): the engine's own interpreter in the
    project root and the dtype it generates in on a CPU (`eagle3.engines.CPU_ENGINE_VENVS`, `CPU_ENGINE_DTYPES`).

    A backend that is no engine (`hf`: the node is not launched) gets the schema's defaults.
    """
    if setting == "python":
        venv = CPU_ENGINE_VENVS.get(backend)
        return str(PROJECT_ROOT / venv / "bin" / "python") if venv else ServerConfig.python
    if setting == "dtype":
        return CPU_ENGINE_DTYPES.get(backend, ServerConfig.dtype)
    raise ValueError(f"eagle3_cpu_engine: unknown setting {setting!r}; valid: python, dtype")


def register_configs() -> None:
    """Register schema nodes and resolvers once per process."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    cs.store(name="eagle3_schema", node=Eagle3Config)
    cs.store(group="logger", name="wandb_schema", node=WandbLoggerConfig)
    cs.store(group="logger", name="csv_schema", node=CSVLoggerConfig)
    OmegaConf.register_new_resolver(
        "eagle3_project_root", lambda: str(PROJECT_ROOT), replace=True
    )
    OmegaConf.register_new_resolver(
        "eagle3_asset", lambda name: str(asset_path(name)), replace=True
    )
    OmegaConf.register_new_resolver("eagle3_demo_answerer", demo_answerer, replace=True)
    OmegaConf.register_new_resolver("eagle3_job_dirname", job_dirname, replace=True)
    # model.draft.<variant> defaults by the serving engine, from the one table in eagle3.engines.
    OmegaConf.register_new_resolver("eagle3_serving_layer", serving_layer_default, replace=True)
    OmegaConf.register_new_resolver("eagle3_cpu_engine", cpu_engine_setting, replace=True)
    # Run and sweep directories carry it (conf/config.yaml): a clock second is not unique between jobs.
    # Cached like Hydra's `now`: Hydra copies the cache into each job's config, so the jobs of a sweep
    # that a launcher runs in other processes (joblib, submitit) name the sweep directory alike.
    OmegaConf.register_new_resolver("eagle3_pid", os.getpid, replace=True, use_cache=True)
    OmegaConf.register_new_resolver(CHECKPOINT_RESOLVER, checkpoint_value, replace=True)
    _registered = True
