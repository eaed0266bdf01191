"""The generic config checks, and the driver that runs them and the domain rules before any stage works.

Each check appends one line `key: bad value -- why; valid: ...` (`eagle3.config.checks`) so a user
sees every mistake in one run. Kept here: the stage name, values `model=auto` cannot derive from
the checkpoint, keys without a value, keys the schema does not declare, secrets, and every field's
own choices and range (declared on the field: `eagle3.config.fields`). A rule across fields, or one
that reads the world (files, a checkpoint's config.json), lives in the package that acts on it (a
`rules` module: `eagle3.draft.rules`, `eagle3.data.rules`, `eagle3.serving.rules`,
`eagle3.extract.rules`, `eagle3.generation.rules`; a stage's own rules are registered with it), and
`eagle3.stages`, which sits above those packages, hands them to `validate_config` in the order their
lines are reported: this package imports no domain package (docs/design.md, 'Import layers').
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Optional, cast

from omegaconf import DictConfig, ListConfig, Node, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

from eagle3.config.checks import ConfigErrors
from eagle3.config.convert import config_dict, to_settings
from eagle3.config.fields import check_fields
from eagle3.config.registration import DerivedValueError, resolution_cause
from eagle3.config.schema import Eagle3Config
from eagle3.config.secrets import SECRET_KEY_RE, find_secrets  # noqa: F401  (SECRET_KEY_RE: re-exported)

#: A config rule: appends one line per violation of the typed config to the errors (`eagle3.stages.config_rules`).
Rule = Callable[[Eagle3Config, ConfigErrors], None]
#: The config completed by the domain before the rules run, its mistakes appended to the errors.
Completion = Callable[[Eagle3Config, ConfigErrors], Eagle3Config]


def _check_derived(model: DictConfig, err: ConfigErrors) -> bool:
    """One line per model key `model=auto` cannot derive from the checkpoint; True when there is one.

    OmegaConf raises where a value is first read; here every interpolated value of the model is
    read once, and each failure is reported under the key whose own derivation failed (a value
    derived from another, fc_in_features from hidden_size, fails with it and is not repeated).
    """
    found: dict[str, DerivedValueError] = {}

    def visit(node: DictConfig) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if OmegaConf.is_interpolation(node, key):  # type: ignore[arg-type]  # omegaconf types key as int | str
                try:
                    node[key]
                except Exception as exc:  # whatever the resolver raised, wrapped by OmegaConf
                    cause = resolution_cause(exc)
                    if isinstance(cause, DerivedValueError):
                        found.setdefault(cause.key, cause)
            elif isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                visit(child)

    visit(model)
    for cause in found.values():
        err.add(cause.key, cause.value, cause.why, cause.valid)
    return bool(found)


def _keys_where(cfg: DictConfig, holds: Callable[[Node], bool]) -> list[str]:
    """The full keys of the nodes `holds` picks, found without resolving anything (OmegaConf's own
    walks raise on an interpolation that fails); a picked, missing, null or interpolated node is not entered."""
    out: list[str] = []

    def gather(node: DictConfig | ListConfig) -> None:
        for key in cast(Iterable[Any], range(len(node)) if isinstance(node, ListConfig) else node.keys()):
            child = node._get_node(key)
            if not isinstance(child, Node):
                continue
            if holds(child):
                out.append(node._get_full_key(key))
            elif isinstance(child, (DictConfig, ListConfig)) and not (child._is_interpolation() or child._is_none()
                                                                     or child._is_missing()):
                gather(child)

    gather(cfg)
    return out


def _missing_keys(cfg: DictConfig) -> list[str]:
    """`OmegaConf.missing_keys`, without resolving."""
    return sorted(_keys_where(cfg, lambda node: node._is_missing() and not node._is_interpolation()))


def _interpolated_keys(cfg: DictConfig) -> set[str]:
    """The full keys whose value is an interpolation (of another key, or a resolver's)."""
    return set(_keys_where(cfg, lambda node: node._is_interpolation()))


def _check_known_keys(node: DictConfig, key: str, err: ConfigErrors) -> None:
    """Every key under a schema node is one the schema declares: `+train.max_epoch=1` is refused, not ignored.

    Hydra's `+key=value` adds a key to a typed node without complaint, and nothing would ever read it
    (the run would train `train.max_epochs` epochs while the user believes they set one). Nodes the
    schema types as dicts (`dataset.sources.<name>.columns`, `server.env`, `generate.http.extra_body`) take
    any key. A node with a `_target_` (the optimizer, the logger) is built from its keys, so an extra key
    is a constructor argument: accepted when the class takes it, refused when it does not.
    """
    schema = OmegaConf.get_type(node)
    if schema is not None and dataclasses.is_dataclass(schema):
        declared = {f.name for f in dataclasses.fields(schema)}
        extra = [str(k) for k in node.keys() if str(k) not in declared]
        if extra and "_target_" in node:
            _check_target_arguments(node, key, extra, err)
            extra = []
        for name in extra:
            where = f"{key}.{name}" if key else name
            close = difflib.get_close_matches(name, sorted(declared), n=3)
            err.add(where, config_dict(node, resolve=False)[name],
                    f"not a key of {key or 'the config'} (the schema has no such key, so nothing would read it)",
                    ("did you mean " + " or ".join(close) + "?") if close else ", ".join(sorted(declared)))
    for child_key in node.keys():
        child = node._get_node(child_key)
        if child is None or child._is_missing() or child._is_none() or child._is_interpolation():
            continue
        where = f"{key}.{child_key!s}" if key else str(child_key)
        if isinstance(child, DictConfig):
            _check_known_keys(child, where, err)
        elif isinstance(child, ListConfig):
            for i, item in enumerate(child):
                if isinstance(item, DictConfig):
                    _check_known_keys(item, f"{where}[{i}]", err)


def _check_target_arguments(node: DictConfig, key: str, extra: list[str], err: ConfigErrors) -> None:
    """Extra keys of a `_target_` node must be arguments its class takes (the class is imported only here)."""
    from hydra.utils import get_object

    target_node = node._get_node("_target_")
    assert target_node is not None  # the caller found `_target_` in the node
    target = target_node._value()
    try:
        params = inspect.signature(get_object(str(target))).parameters.values()
    except Exception as exc:  # noqa: BLE001 - an import error, a name that is not there: say which
        err.add(f"{key}._target_", target, f"cannot be imported ({type(exc).__name__}: {exc})".splitlines()[0],
                "an importable class, e.g. torch.optim.AdamW")
        return
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind != inspect.Parameter.VAR_POSITIONAL]
    for name in extra:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=3)
            err.add(f"{key}.{name}", config_dict(node, resolve=False)[name],
                    f"not an argument of {target}", ("did you mean " + " or ".join(close) + "?") if close
                    else ", ".join(accepted))


def _check_secrets(node: Any, key: str, err: ConfigErrors) -> None:
    """Secrets belong in the environment (WANDB_API_KEY, HF_TOKEN, VLLM_API_KEY), never in configs or logs.

    The entrypoint refuses them before Hydra writes a file (`eagle3.config.callbacks`); this catches
    a config composed elsewhere (a notebook, a test) before a stage records it.
    """
    for found in find_secrets(node, key):
        err.add(found.key, found.shown, found.why, found.valid)


def validate_config(cfg: DictConfig, stages: Iterable[str], rules: Iterable[Rule] = (),
                    complete: Optional[Completion] = None) -> tuple[Optional[Eagle3Config], list[str]]:
    """The config as the schema's dataclasses, and all its rule violations, one line each (empty = valid;
    the config is None when it does not convert).

    The generic checks run here (the stage name, values `model=auto` cannot derive, missing and
    unknown keys, secrets, each field's constraint); the domain rules come from the caller, which sits
    above the packages that own them (`eagle3.stages.config_rules`), and run after them in order.

    Args:
        cfg: The composed config.
        stages: Valid values of `stage`.
        rules: The domain rules, each `rule(settings, errors)` on the config as the schema's dataclasses
            (once the generic checks found every value resolvable), in the order their lines are reported.
        complete: What the domain makes of the config before the rules read it (`dataset.files` into
            sources: `eagle3.data.detect.with_file_sources`); its mistakes go to the errors too.
    """
    err = ConfigErrors()
    stages = tuple(stages)
    if cfg.stage not in stages:
        err.add("stage", cfg.stage, "not a registered stage", ", ".join(stages))
    underived = _check_derived(cfg.model, err)
    missing = _missing_keys(cfg)
    for key in missing:
        err.add(key, "???", "has no value (the schema has no default for it)", "set it in the option's YAML "
                "or on the command line")
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot resolve: report, keep checking
        # A missing or underivable value is reported above, under its own key.
        if resolution_cause(exc, (MissingMandatoryValue, InterpolationToMissingValueError, DerivedValueError)) is None:
            err.add("config", "<interpolation>", f"cannot be resolved: {exc}".splitlines()[0])
        plain = OmegaConf.to_container(cfg, resolve=False)
    if missing or underived:
        return None, err.lines  # the rules below read those keys
    _check_secrets(plain, "", err)
    _check_known_keys(cfg, "", err)
    try:
        settings = to_settings(cfg)
    except Exception as exc:  # noqa: BLE001 - reported as the config's one line; the rules need the typed config
        err.add("config", "<schema>", f"does not convert to the schema's dataclasses: {exc}".splitlines()[0])
        return None, err.lines
    if complete is not None:
        settings = complete(settings, err)
    check_fields(settings, err, derived=_interpolated_keys(cfg))
    for rule in rules:
        rule(settings, err)
    return settings, err.lines
