"""The checks every server launch runs before a command line is built (`eagle3.serving.commands`).

Config validation runs the server rules when a job starts; a launcher runs them again with the
actual draft directory, so a config that bypassed the entrypoint (another stage, a notebook) still
cannot bind a public address or serve a draft the engine would misread. Every problem is reported at
once, one line each (`ServerConfigError`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import ModelConfig
from eagle3.config.server_schema import ServerConfig, SpeculativeConfig
from eagle3.engines import SGLANG
from eagle3.errors import EXIT_CONFIG_ERROR, Eagle3Error
from eagle3.layer_ids import sglang_capture_problem
from eagle3.serving.rules import check_engine_speculates, server_errors
from eagle3.target_info import read_config

__all__ = ["DRAFT_KEY", "ServerConfigError", "checked_draft", "config_line", "draft_errors"]

DRAFT_KEY = "server.speculative.draft_path"
PathLike = Union[str, os.PathLike]


class ServerConfigError(Eagle3Error):
    """Why a server command cannot be built (or run on this machine); `errors` holds one line each.

    A config error (exit 2) even when found at launch: the config names what cannot work, and nothing
    has run yet."""

    exit_code = EXIT_CONFIG_ERROR

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        if len(self.errors) == 1:
            message = self.errors[0]
        else:
            message = f"{len(self.errors)} server errors:\n  " + "\n  ".join(self.errors)
        super().__init__(message)


def config_line(key: str, value: Any, why: str, valid: str) -> str:
    """One error line in the shape of every config rule (`eagle3.config.checks`)."""
    err = ConfigErrors()
    err.add(key, value, why, valid)
    return err.lines[0]


def draft_errors(model: ModelConfig, spec: SpeculativeConfig, draft: PathLike, engine: str) -> list[str]:
    """What is wrong with serving the export at `draft` on `engine` for this target and speculation (one line each)."""
    from eagle3.draft.export import ExportError, capture_layers_of, validate_export

    draft = str(draft)
    try:
        info = validate_export(draft, engine)
    except ExportError as exc:
        return [config_line(DRAFT_KEY, draft, str(exc),
                            f"a draft export for {engine} (stage=train writes draft/{engine} in its output)")]
    errors = []
    expected = [int(i) for i in (spec.capture_layers if spec.capture_layers is not None else model.capture_layers)]
    served = capture_layers_of(draft, engine)
    if served != expected:
        errors.append(config_line(DRAFT_KEY, draft, f"{engine} would capture layers {served} for this draft, "
                                  f"but its fc must read layers {expected} (model.capture_layers)",
                                  f"a draft trained with capture_layers {expected}"))
    elif engine == SGLANG:
        target = read_config(str(model.path), model.text_config_key) or {}
        problem = sglang_capture_problem(served, [str(a) for a in target.get("architectures") or ()])
        if problem:
            errors.append(config_line(DRAFT_KEY, draft, problem, "a draft trained with capture_layers starting "
                                      "at 2 (e.g. [2, L//2, L-3]), or server=vllm"))
    g = info.geometry
    target_hidden = g.fc_in_features // max(len(g.capture_layers), 1)
    for what, found, want in (("target_num_layers", g.target_num_layers, model.num_layers),
                              ("vocab_size", g.vocab_size, model.vocab_size),
                              ("target hidden size (fc_in_features / captures)", target_hidden, model.hidden_size)):
        if found != want:
            errors.append(config_line(DRAFT_KEY, draft, f"trained for another target: its {what} is {found}, "
                                      f"model={model.name} has {want}", f"a draft trained for model={model.name}"))
    return errors


def checked_draft(server: ServerConfig, model: ModelConfig, engine: str, draft: Optional[PathLike]) -> Optional[str]:
    """Run every server and draft rule; the draft path to serve (None = no speculation)."""
    spec = server.speculative
    if spec.algorithm is None and draft is not None:
        raise ValueError(f"a draft ({draft}) was given but server.speculative.algorithm is null")
    if draft is None:
        draft = spec.draft_path
    # Absolute, so the printed command works from any directory.
    draft = None if draft is None else str(Path(str(draft)).expanduser().absolute())
    errors = list(server_errors(server, model, draft_path=draft))
    if spec.algorithm is not None:
        speculating = ConfigErrors()
        check_engine_speculates(server, speculating)
        errors.extend(speculating.lines)
    if server.backend != engine:
        errors.append(config_line("server.backend", server.backend, f"this is the {engine} launcher", engine))
    if spec.algorithm is not None:
        if draft is None:
            errors.append(config_line(DRAFT_KEY, None, "speculative decoding needs a draft",
                                f"the path of an export for {engine}; stage=serve finds this config's "
                                "train output itself; or server.speculative.algorithm=null"))
        else:
            errors.extend(draft_errors(model, spec, draft, engine))
    if errors:
        raise ServerConfigError(errors)
    return draft if spec.algorithm is not None else None
