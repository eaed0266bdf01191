"""What the project knows about a target model without loading it: its files, config and identity.

One module for the questions every stage asks of `model.path` (a hub id or a local directory):

* `resolve_dir`: where its files are (a local directory, or the hub snapshot of its json files);
* `read_config`: its language model's `config.json` as one dict (multimodal wrappers such as
  Kimi-K2.5 nest it under `text_config`; the nested keys win over the wrapper's);
* `target_config`: the same for a hub id too, with the file it came from, or a one-line
  `TargetConfigError` saying why it cannot be read (what `model=auto` derives its geometry from);
* `target_name`: a safe directory-name component naming the target after its path;
* `target_identity`: how every fingerprint names the target's weights (generated answers,
  hidden states, demo data, benchmarks): cheap at 600 GB, new whenever the weights change, blind
  to where the checkpoint lies;
* `tokenizer_identity`: what tokenized data depends on -- the tokenizer files alone, so
  retraining a model with the same tokenizer does not invalidate tokenized data.

Torch-free and cheap to import, and a leaf (it imports nothing of eagle3): config's `model=auto`
resolvers (`eagle3.config.registration`) and the model rules (`eagle3.draft.rules`) read configs through it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from eagle3.errors import Eagle3Error

__all__ = ["FULL_HASH_LIMIT", "HF_CONFIG_KEYS", "TargetConfig", "TargetConfigError", "read_config", "resolve_dir",
           "target_config", "target_identity", "target_name", "tokenizer_identity"]

CONFIG_FILE = "config.json"
DEFAULT_TEXT_CONFIG_KEY = "text_config"
#: `model.<key>` -> the config.json key that holds the same fact about the target.
HF_CONFIG_KEYS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "vocab_size": "vocab_size"}
# Local checkpoints up to this size are identified by a content hash of every file; larger
# ones (Kimi: ~600 GB) by file names and sizes plus the hash of their small json files.
FULL_HASH_LIMIT = 1 << 30
# Above FULL_HASH_LIMIT: files up to this size are still hashed whole (configs, tokenizer, index).
SMALL_FILE_BYTES = 64 << 20
SAMPLE_WINDOW = 4096  # bytes read from the middle of each tensor of a large checkpoint
FILE_SAMPLES = 64  # windows per large weights file that is not safetensors
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# `name` or `org/name` as the hub spells repo ids; anything else can only be a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # a subset of what artifact directory names allow
NAME_MAX = 64
# Names of the files that define a tokenizer besides `tokeniz*` (weights and model config are left
# out on purpose: retraining a model with the same tokenizer must not invalidate tokenized data).
_TOKENIZER_FILES = {"special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                    "chat_template.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model"}
_TOKENIZER_SUFFIXES = (".tiktoken", ".model")


def resolve_dir(path: str, revision: Optional[str] = None, cache_dir: Optional[str] = None,
                local_files_only: bool = False) -> Path:
    """A local directory as it is, or the hub snapshot of a hub id's json files (config, index).

    Args:
        local_files_only: Only the hub cache, never the network (raises when it does not hold them).
    """
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, revision=revision, cache_dir=cache_dir, allow_patterns=["*.json"],
                                  local_files_only=local_files_only))


def target_has_mla(target_cfg: dict[str, Any]) -> bool:
    """Whether a target config.json describes MLA attention (DeepSeek-V2/V3, Kimi-K2.x)."""
    return bool(target_cfg.get("kv_lora_rank")) and bool(target_cfg.get("qk_rope_head_dim"))


def read_config(path: str | Path, text_config_key: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The language model's config from `<path>/config.json`, or None when there is no such file.

    The wrapper's keys, updated with those of `config[text_config_key]` (default `text_config`)
    when it is there: layer counts and widths come from the model that is actually captured,
    while keys only the wrapper has (`auto_map`, `tie_word_embeddings`) stay visible.
    """
    config_file = Path(path).expanduser() / CONFIG_FILE
    if not config_file.is_file():
        return None
    outer = json.loads(config_file.read_text(encoding="utf-8"))
    if not isinstance(outer, dict):
        return None
    inner = outer.get(text_config_key or DEFAULT_TEXT_CONFIG_KEY)
    merged = dict(outer)
    if isinstance(inner, dict):
        merged.update(inner)
    return merged


class TargetConfigError(Eagle3Error, ValueError):
    """Why a target's config.json cannot be read, in one line that names the path (a ValueError too:
    the config rules catch it as a bad `model.path`)."""


@dataclass(frozen=True)
class TargetConfig:
    """A target's language-model config (`read_config`'s merge) and the file it was read from."""

    values: dict[str, Any]
    file: Path


# Hub ids already looked up on the network in this process: a config is read on every access to a
# value derived from it, and an unreachable hub must cost its timeout once, not once per access.
_hub_dirs: dict[tuple, Path | TargetConfigError] = {}


def _hub_failure(exc: Exception) -> str:
    """Why a hub lookup failed, short: the hub's own messages run over several lines."""
    kind = type(exc).__name__
    if kind == "GatedRepoError":
        return "gated on the hub (accept its terms there and set HF_TOKEN)"
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError", "HFValidationError"):
        return f"not on the hub at that revision ({kind})"
    if kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
        return "not in the hub cache, and the hub cannot be reached (offline?)"
    return f"{kind}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _hub_dir(path: str, revision: Optional[str], cache_dir: Optional[str], local_files_only: bool) -> Path:
    key = (path, revision, cache_dir)
    found = _hub_dirs.get(key)
    if found is None:
        try:
            found = resolve_dir(path, revision, cache_dir, local_files_only=local_files_only)
        except Exception as exc:  # the hub client's errors have no common base but Exception
            found = TargetConfigError(f"{path} is no local directory, and as a hub id its {CONFIG_FILE} is "
                                      f"{_hub_failure(exc)}")
        if not local_files_only:  # a cache lookup is cheap, and a later download may fill the cache
            _hub_dirs[key] = found
    if isinstance(found, TargetConfigError):
        raise found
    return found


def target_config(path: str, revision: Optional[str] = None, text_config_key: Optional[str] = None,
                  cache_dir: Optional[str] = None, local_files_only: bool = False) -> TargetConfig:
    """The target's config from a local directory or a hub id, wherever it can be had.

    A hub id's json files come from the hub cache or the network (`resolve_dir`; HF_HUB_OFFLINE=1
    keeps it off the network); each hub id is looked up once per process, failures included.

    Args:
        local_files_only: For a hub id, only what the hub cache holds.

    Raises:
        TargetConfigError: No directory, no config.json, or one that is not a JSON object.
    """
    path = str(path)
    local = Path(path).expanduser()
    if local.is_dir():
        directory = local
    elif _HUB_ID.match(path) and ".." not in path:
        directory = _hub_dir(path, revision, cache_dir, local_files_only)
    else:
        raise TargetConfigError(f"{path} is no directory (nor a hub id)")
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise TargetConfigError(f"{directory} has no {CONFIG_FILE}")
    try:
        values = read_config(directory, text_config_key)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TargetConfigError(f"{file} cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    if values is None:
        raise TargetConfigError(f"{file} is not a JSON object")
    return TargetConfig(values, file)


def target_name(path: str) -> str:
    """A short name for the target at `path`, safe as a directory-name component (stores are named by it).

    The last component of the path or hub id (a hub snapshot directory: the repository's name);
    characters a directory name should not carry become `_`.
    """
    local = Path(str(path)).expanduser()
    parts = (local.resolve() if local.is_dir() else local).parts
    base = parts[-1] if parts else ""
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        base = parts[-3].split("--")[-1]
    return _NAME_UNSAFE.sub("_", base).lstrip(".-")[:NAME_MAX] or "target"


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def _hash_whole(digest: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)


def _hash_safetensors_sample(digest: Any, path: Path) -> bool:
    """Header plus a window from the middle of every tensor; False when the file is not safetensors.

    The header names every tensor with its dtype, shape and byte range, so a re-shaped or
    re-typed checkpoint changes it; training changes (nearly) every element of every tensor it
    touches, so one window per tensor notices a retrained or partly fine-tuned checkpoint of the
    same shape while reading a few hundred MB of a 600 GB one.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return False
        header_len = int.from_bytes(head, "little")
        if header_len <= 0 or 8 + header_len > size:
            return False
        header_bytes = fh.read(header_len)
        try:
            header = json.loads(header_bytes)
        except ValueError:
            return False
        if not isinstance(header, dict):
            return False
        digest.update(header_bytes)
        base = 8 + header_len
        for name in sorted(k for k in header if k != "__metadata__"):
            offsets = header[name].get("data_offsets") if isinstance(header[name], dict) else None
            if not (isinstance(offsets, list) and len(offsets) == 2):
                continue
            begin, end = int(offsets[0]), int(offsets[1])
            width = min(SAMPLE_WINDOW, end - begin)
            fh.seek(base + begin + (end - begin - width) // 2)
            digest.update(fh.read(width))
    return True


def _hash_sampled(digest: Any, path: Path) -> None:
    """Evenly spaced windows of a large file that is not safetensors (.bin, .pt, .gguf)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        for i in range(FILE_SAMPLES):
            fh.seek(max(0, (size - SAMPLE_WINDOW) * i // max(FILE_SAMPLES - 1, 1)))
            digest.update(fh.read(SAMPLE_WINDOW))


def _hub_commit(directory: Path) -> Optional[str]:
    """The commit of a hub snapshot directory (`.../models--org--name/snapshots/<sha>`), else None."""
    resolved = directory.resolve()
    if resolved.parent.name == "snapshots" and _COMMIT.match(resolved.name):
        return resolved.name
    return None


@functools.lru_cache(maxsize=32)
def _local_identity(path: str, stamp: tuple) -> dict[str, Any]:
    directory = Path(path)
    files = _files(directory)
    total = sum(p.stat().st_size for p in files)
    commit = _hub_commit(directory)
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        if commit is not None:
            continue  # a snapshot's files are named by the commit already
        if total <= FULL_HASH_LIMIT or p.stat().st_size <= SMALL_FILE_BYTES:
            _hash_whole(digest, p)
        elif not (p.suffix == ".safetensors" and _hash_safetensors_sample(digest, p)):
            _hash_sampled(digest, p)
    if commit is not None:
        how = "hub commit + names+sizes"
    else:
        how = "content" if total <= FULL_HASH_LIMIT else "small files + safetensors headers + a window per tensor"
    ident: dict[str, Any] = {"files": len(files), "bytes": total, "hash": digest.hexdigest()[:16], "hashed": how}
    if commit is not None:
        ident["commit"] = commit
    return ident


def _cached_hub_commit(hub_id: str, revision: Optional[str], cache_dir: Optional[str]) -> Optional[str]:
    """The commit a hub id's revision points to in the local hub cache (no network), else None."""
    if revision is not None and _COMMIT.match(revision):
        return revision
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return None
    repo_dir = Path(cache_dir or HF_HUB_CACHE).expanduser() / ("models--" + hub_id.replace("/", "--"))
    ref = repo_dir / "refs" / (revision or "main")
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if _COMMIT.match(commit) else None


def target_identity(path: str, revision: Optional[str] = None, cache_dir: Optional[str] = None) -> dict[str, Any]:
    """The one identity of a target checkpoint in every fingerprint: cheap at 600 GB, new when the weights are.

    * A local directory: file names and sizes, plus content -- every byte of a checkpoint up
      to FULL_HASH_LIMIT; of a larger one, every small file (configs, tokenizer, index), each
      safetensors header and one SAMPLE_WINDOW from the middle of every tensor (other weight
      formats: FILE_SAMPLES windows per file). A hub snapshot directory is named by its commit.
      Where the directory is does not count: moving it, or naming it by another path, keeps
      the identity. Cached per process by file names, sizes and mtimes.
    * A hub id: the id and the commit its revision points to in the local hub cache, read
      without network (pin `model.revision` to a commit to be independent of the cache); when
      the cache does not know it, the revision as configured ("main" moves: pin it).

    Returns:
        Plain data for a fingerprint.
    """
    local = Path(str(path)).expanduser()
    if local.is_dir():
        stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in _files(local))
        return {"weights": _local_identity(str(local.resolve()), stamp)}
    commit = _cached_hub_commit(str(path), revision, cache_dir)
    ident: dict[str, Any] = {"hub_id": str(path), "revision": revision or "main"}
    if commit is not None:
        ident["commit"] = commit
    return ident


def _tokenizer_files_sha256(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        name = path.name
        if path.is_file() and (name.startswith("tokeniz") or name in _TOKENIZER_FILES
                               or name.endswith(_TOKENIZER_SUFFIXES)):
            digest.update(name.encode("utf-8") + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def tokenizer_identity(path: str, revision: Optional[str]) -> dict[str, Any]:
    """What names the tokenizer: its files' content for a local directory, hub id + revision otherwise.

    By content, not by absolute path, so moving a checkout or sharing an artifact root between
    machines does not invalidate tokenized data.
    """
    directory = Path(str(path)).expanduser()
    if directory.is_dir():
        return {"local_files_sha256": _tokenizer_files_sha256(directory)}
    return {"hub_id": str(path), "revision": revision}
