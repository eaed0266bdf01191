"""What counts as a secret, in one place: config validation, the Hydra guard, job.json, manifests and W&B use it.

A secret written into a config is on disk before any stage runs: Hydra copies the overrides and the
composed config into `<run dir>/.hydra/`, a sweep names job directories after the overrides, and
`job.json`, manifests and logs repeat them. So a secret is refused before Hydra writes anything
(`eagle3.config.callbacks.RefuseSecrets`, and `scripts/run.py` for the command line), and whatever
slips through (a notebook, a library caller) is redacted where eagle3 writes records.

A value is a secret when
* its key names one, in any spelling, and the value is not empty (`is_secret_key`):
  - a name that, lower-cased with `_`/`-` dropped (so `dbPassword`, `client-secret`,
    `MY_SECRET_NAME` alike), contains `password`, `passwd`, `secret`, `credential`, `apikey`,
    `apitoken`, `privatekey`, `accesskey`, `authtoken` or `accesstoken`; or one of `SECRET_KEY_RE`
    (`token`, `api_key`, `hf_token`, `authorization`, ...);
  - an upper-case environment-variable name one of whose `_`-separated words is KEY, TOKEN,
    SECRET, PASSWORD, PASSWD, PWD, PASS, CREDENTIAL(S), APIKEY or AUTH (`NGC_CLI_KEY`,
    `AZURE_OPENAI_KEY`, `AWS_ACCESS_KEY_ID`, `HF_TOKEN`), or that ends in `TOKEN`; not `PWD`
    itself, the shell's working directory;
  - any key directly under an environment dict (`server.env.*`, `hydra.job.env_set.*`), judged
    by the environment-variable rule on its upper-cased name: it becomes a server's environment,
    so `server.env.ngc_cli_key` is `NGC_CLI_KEY`.
  A lower-case `*_key` / `*_token` elsewhere is not: configs have `text_config_key`, `sort_key`,
  `bos_token`, `max_new_tokens` (schema keys, which redaction must not blank in records);
* it has the shape of a known token under any key (`_TOKEN_SHAPES`: Hugging Face `hf_...`,
  `sk-...`, GitHub `ghp_...`, NVIDIA NGC `nvapi-...`, AWS key ids `AKIA...`/`ASIA...`, GitLab
  `glpat-...`, Slack `xox?-...`, Google `AIza...`); never a plain hex string, which is what
  eagle3's fingerprints and sha256 values look like (a hex key is caught by its name instead);
* it is a URL with credentials: `user:password@` (or `token@` on http/https), or a query
  parameter named like a secret (`?token=`, `?api_key=`, `?sig=`);
* it follows a secret-named flag in an argument list (`--api-key X`, `--api-key=X`, `--token X`).

Only this module decides; it imports nothing from eagle3 so records can be redacted anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Optional

__all__ = ["REDACTED", "SECRET_KEY_RE", "Finding", "find_secrets", "find_secrets_in_overrides",
           "is_secret_key", "redact", "redact_overrides", "redact_text"]

REDACTED = "<redacted>"
# Key names (lower-cased) that hold credentials. Deliberately not every `*_token`: configs have
# `bos_token` / `pad_token` (special tokens of a tokenizer), which are not secrets.
SECRET_KEY_RE = re.compile(
    r"^(token|secret|password|passwd|authorization|credentials?)$"
    r"|(api_?key|access_token|auth_token|hf_token|hub_token|_password|_secret|secret_?key|private_?key|access_?key)$"
)
# An environment variable (upper case) ending in TOKEN is a credential (HF_TOKEN, GITHUB_TOKEN, ...).
_ENV_TOKEN_NAME_RE = re.compile(r"^[A-Z0-9_]*TOKEN$")
# Words that make a name a secret wherever they are inside it, once lower-cased and stripped of `_`/`-`
# (`dbPassword`, `client-secret`, `MY_SECRET_NAME`). None is a part of an eagle3 schema key: a bare
# `key` or `token` is not here because `text_config_key`, `sort_key`, `bos_token`, `max_new_tokens` are.
_SECRET_NAME_WORDS = ("password", "passwd", "secret", "credential", "apikey", "apitoken", "privatekey",
                      "accesskey", "authtoken", "accesstoken")
# An environment-variable style name (`NGC_CLI_KEY`) is a secret when one of its `_`-separated words is
# one of these: environment variables are where credentials live, and their names say so in one word.
_ENV_NAME_RE = re.compile(r"^[A-Z0-9_]+$")
_ENV_SECRET_WORDS = frozenset({"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PWD", "PASS", "CREDENTIAL",
                               "CREDENTIALS", "APIKEY", "AUTH"})
# `PWD` alone is the shell's working directory, not a password (and shows up in command lines).
_ENV_NOT_SECRET = frozenset({"PWD"})
# A key directly under one of these is an environment variable whatever its case (`server.env.ngc_cli_key`
# becomes NGC_CLI_KEY in the server's environment; Hydra's `hydra.job.env_set`).
_ENV_PARENTS = frozenset({"env", "env_set"})
# Query parameters that carry credentials besides the secret key names.
_SECRET_QUERY_NAMES = frozenset({"key", "sig", "signature", "auth", "apikey"})
# Known token shapes, found under any key. Each has a fixed prefix that no path, model name or hex
# digest has, so a match is a credential whatever its key; a bare hex string is never one (eagle3's
# fingerprints and sha256 values are hex).
_TOKEN_SHAPES = (
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")),
    ("an API key (sk-...)", re.compile(r"(?<![A-Za-z0-9-])sk-[A-Za-z0-9_-]{16,}")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9])(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("an NVIDIA NGC key", re.compile(r"(?<![A-Za-z0-9])nvapi-[A-Za-z0-9_-]{20,}")),
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a GitLab token", re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}")),
    ("a Google API key", re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
)
# scheme://userinfo@ -- group 2 is the userinfo.
_URL_USERINFO_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/\s@?#]+)@")
_QUERY_PARAM_RE = re.compile(r"([?&;])([A-Za-z0-9_.-]+)=([^&;#\s'\",\]]+)")
# --flag=value or --flag value inside free text (a shell command line, an error message).
_TEXT_FLAG_RE = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)(=|\s+)([^\s'\",\]]+)")
# NAME=value inside free text (`HF_TOKEN=... vllm serve`, an override string, `client-secret=...`).
_TEXT_ASSIGN_RE = re.compile(r"(?<![\w.-])([+~]{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=([^\s'\",\]]+)")

_ENV_HINT = ("export it in the environment eagle3 runs in (HF_TOKEN, WANDB_API_KEY, VLLM_API_KEY; "
             "servers inherit it)")
_FLAG_HINT = ("drop the flag and export the variable the server reads instead (vLLM: VLLM_API_KEY; "
              "servers inherit eagle3's environment)")
_URL_HINT = "the URL without credentials (http://HOST:PORT); a key the server needs goes in its environment"


class Finding(NamedTuple):
    """One secret: where it is, the value to show instead of it, why it is one, and what to do."""

    key: str
    shown: str
    why: str
    valid: str


def _has_secret_word(name: str) -> bool:
    """`dbPassword`, `client-secret`, `MY_SECRET_NAME`: a secret word however the name is spelt."""
    flat = name.lower().replace("_", "").replace("-", "")
    return any(word in flat for word in _SECRET_NAME_WORDS)


def _is_secret_env_name(name: str) -> bool:
    """`NGC_CLI_KEY`, `AWS_ACCESS_KEY_ID`, `HF_TOKEN`: an upper-case name with a credential word in it."""
    return (bool(_ENV_NAME_RE.match(name)) and name not in _ENV_NOT_SECRET
            and any(part in _ENV_SECRET_WORDS for part in name.split("_")))


def is_secret_key(name: Any) -> bool:
    """True for a key whose value is a credential (`HF_TOKEN`, `api_key`, `dbPassword`, `server.env.ngc_cli_key`).

    `name` may be dotted: its last segment is judged, and when the segment before it is an
    environment dict (`env`, `env_set`) it is judged as the environment variable it becomes too.
    """
    parts = str(name).lstrip("+~").rsplit(".", 2)
    last = parts[-1].lstrip("+~")
    if (SECRET_KEY_RE.search(last.lower()) or _ENV_TOKEN_NAME_RE.match(last) or _has_secret_word(last)
            or _is_secret_env_name(last)):
        return True
    return len(parts) > 1 and parts[-2] in _ENV_PARENTS and _is_secret_env_name(last.upper().replace("-", "_"))


def _flag_name(arg: str) -> Optional[str]:
    """`--api-key` -> `api_key`; None for a non-flag."""
    if not arg.startswith("-") or arg.lstrip("-")[:1].isdigit():
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("-", "_")


def _is_secret_flag(arg: str) -> bool:
    """`--api-key`, `--token`, `--db-password`: a flag whose value is a credential (flags are not env names)."""
    name = _flag_name(arg)
    return bool(name and (SECRET_KEY_RE.search(name.lower()) or _has_secret_word(name)))


def _redact_url(match: re.Match) -> str:
    scheme, userinfo = match.group(1), match.group(2)
    if ":" in userinfo or scheme.lower().rstrip(":/") in {"http", "https", "ws", "wss"}:
        return f"{scheme}{REDACTED}@"
    return match.group(0)


def _redact_query(match: re.Match) -> str:
    name = match.group(2)
    if is_secret_key(name) or name.lower() in _SECRET_QUERY_NAMES:
        return f"{match.group(1)}{name}={REDACTED}"
    return match.group(0)


def _redact_flag(match: re.Match) -> str:
    if _is_secret_flag(match.group(1)) and match.group(3) != REDACTED:
        return f"{match.group(1)}{match.group(2)}{REDACTED}"
    return match.group(0)


def _redact_assign(match: re.Match) -> str:
    if is_secret_key(match.group(1)) and match.group(2) not in (REDACTED, f"'{REDACTED}'"):
        return f"{match.group(1)}={REDACTED}"
    return match.group(0)


def redact_text(text: str) -> str:
    """`text` with every secret-shaped part replaced by `<redacted>` (the rest kept, to stay readable)."""
    out = str(text)
    for _, shape in _TOKEN_SHAPES:
        out = shape.sub(REDACTED, out)
    out = _URL_USERINFO_RE.sub(_redact_url, out)
    out = _QUERY_PARAM_RE.sub(_redact_query, out)
    out = _TEXT_FLAG_RE.sub(_redact_flag, out)
    return _TEXT_ASSIGN_RE.sub(_redact_assign, out)


def _value_finding(key: str, value: str) -> Optional[Finding]:
    """Why a string is a secret whatever its key (a flag's value, a URL's credentials, a token's shape), or None."""
    shown = redact_text(value)
    if shown == value:
        return None
    if _TEXT_FLAG_RE.sub(_redact_flag, value) != value:
        return Finding(key, shown, "a secret-named flag's value would be in the server's command line, its log "
                       "and manifests", _FLAG_HINT)
    if _URL_USERINFO_RE.sub(_redact_url, value) != value or _QUERY_PARAM_RE.sub(_redact_query, value) != value:
        return Finding(key, shown, "a URL with credentials would be written to job.json, manifests and logs",
                       _URL_HINT)
    for what, shape in _TOKEN_SHAPES:
        if shape.search(value):
            return Finding(key, REDACTED, f"looks like {what}; secrets must not be written in a config "
                           "(Hydra copies it into .hydra/, job.json and logs)", _ENV_HINT)
    return Finding(key, shown, "holds a secret-named variable; secrets must not be written in a config", _ENV_HINT)


def _walk(node: Any, key: str, name: Optional[str]) -> Iterator[Finding]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{key}.{k}" if key else str(k), str(k))
        return
    if isinstance(node, (list, tuple)):
        items = list(node)
        for i, v in enumerate(items):
            child = f"{key}[{i}]"
            if isinstance(v, str) and _is_secret_flag(v) and "=" in v and v.split("=", 1)[1]:
                yield Finding(child, v.split("=", 1)[0] + "=" + REDACTED,
                              f"a secret given to '{v.split('=', 1)[0]}' would be in the server's command line, "
                              "its log and manifests", _FLAG_HINT)
            elif (isinstance(v, str) and _is_secret_flag(v) and i + 1 < len(items)
                  and not str(items[i + 1]).startswith("-")):
                yield Finding(f"{key}[{i + 1}]", REDACTED, f"a secret given to '{v}' would be in the server's "
                              "command line, its log and manifests", _FLAG_HINT)
            elif i > 0 and isinstance(items[i - 1], str) and _is_secret_flag(items[i - 1]) \
                    and "=" not in items[i - 1] and not str(v).startswith("-"):
                continue  # reported with its flag
            else:
                yield from _walk(v, child, None)
        return
    if node is None or isinstance(node, bool) or node == "":
        return
    if name is not None and is_secret_key(key or name):  # the dotted key: `env.x_key` is an env var
        yield Finding(key, REDACTED, "secrets must not be written in a config (Hydra copies it into .hydra/, "
                      "job.json and logs)", _ENV_HINT)
        return
    if isinstance(node, str):
        found = _value_finding(key, node)
        if found:
            yield found


def find_secrets(data: Any, key: str = "") -> list[Finding]:
    """Every secret in plain config data (dicts, lists, scalars), each with its dotted key.

    Args:
        data: The data to search (`OmegaConf.to_container` of a config, a job record).
        key: The dotted key of `data` itself ("" for a whole config).
    """
    name = key.rsplit(".", 1)[-1] if key else None
    return list(_walk(data, key, name))


def _override_values(override: Any) -> list[Any]:
    """The value(s) an override sets: one, or each of a sweep's (a glob or a range: none worth checking)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if override.is_delete():
        return []
    if not override.is_sweep_override():
        return [override.value()]
    try:
        elements = list(override.sweep_string_iterator())
    except Exception:  # a glob needs Hydra's config loader; its names are config names, not secrets
        return []
    values: list[Any] = []
    parser = OverridesParser.create()
    for element in elements:
        try:
            (one,) = parser.parse_overrides([f"{override.key_or_group}={element}"])
            values.append(one.value())
        except Exception:
            values.append(element)
    return values


def find_secrets_in_overrides(overrides: Iterable[str]) -> list[Finding]:
    """Every secret in command-line style overrides (`key=value`, `+key=a,b` sweeps, `key=[a,b]`).

    Each is read with Hydra's own grammar, so a sweep's values are checked one by one; an override
    the grammar cannot read is checked as text.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    found: list[Finding] = []
    for item in overrides or []:
        text = str(item)
        try:
            (override,) = parser.parse_overrides([text])
        except Exception:  # Hydra refuses it anyway, after it logged it: check it as text
            key, _, value = text.partition("=")
            hit = _value_finding(key.lstrip("+~"), value) or _value_finding(key.lstrip("+~"), text)
            if hit:
                found.append(hit)
            continue
        key = override.key_or_group
        for value in _override_values(override):
            hits = find_secrets(value, key)
            found.extend(h for h in hits if h not in found)
            if hits:
                break  # one line per override: the user fixes the override, not each sweep value
    return found


def redact(obj: Any) -> Any:
    """A copy of plain data (a record, a manifest, a config) with every secret replaced by `<redacted>`."""
    return _redact(obj, "")


def _redact(obj: Any, parent: str) -> Any:
    """`redact` of `obj`, the value of key `parent` ("" for none): the keys of an `env` dict are env variables."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(f"{parent}.{k}" if parent else k) and _is_set_scalar(v)
                    else _redact(v, str(k))) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_redact(v, "") for v in obj]
        for i, v in enumerate(obj):
            if isinstance(v, str) and _is_secret_flag(v) and "=" not in v and i + 1 < len(items) \
                    and not str(obj[i + 1]).startswith("-"):
                items[i + 1] = REDACTED
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _is_set_scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, (bool, dict, list)) and value != ""


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Overrides as a record may show them: a secret override keeps its key, its value becomes `'<redacted>'`.

    The quotes keep the result readable by Hydra's grammar (`eagle3.sweeps.jobs.parse_overrides`).
    """
    shown: list[str] = []
    for item in overrides or []:
        text = str(item)
        if find_secrets_in_overrides([text]):
            key = text.split("=", 1)[0]
            shown.append(f"{key}='{REDACTED}'" if "=" in text else redact_text(text))
        else:
            shown.append(text)
    return shown
