"""What the project knows about a target model without loading it: its files, config and identity.

One module for the questions every stage asks of `model.path` (a hub id or a local directory):

* `resolve_dir`: where its files are (a local directory, or the hub snapshot of its json files);
* `read_config`: its language model's `config.json` as one dict (multimodal wrappers such as
  Kimi-K2.5 nest it under `text_config`; the nested keys win over the wrapper's);
* how fingerprints name it, by what each output depends on: `weights_identity` (hidden states:
  content hash of a small checkpoint, names + sizes + json contents of a huge one),
  `files_signature` (regenerated answers: file names and sizes), `tokenizer_identity`
  (tokenized data: the tokenizer files' content), `weights_file_digest` (the demo target's
  answers in demo_native: its one weights file) and `location` (a benchmark: where the served
  model is). They differ because the outputs they key were fingerprinted that way, and changing
  any of them moves every existing output directory; one cheap identity that still changes
  with the weights, used everywhere, is the next step (a deliberate fingerprint change).

Torch-free and cheap to import (`eagle3.config.validate` reads configs through it).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

__all__ = ["FULL_HASH_LIMIT", "files_signature", "location", "read_config", "resolve_dir", "tokenizer_identity",
           "weights_file_digest", "weights_identity"]

CONFIG_FILE = "config.json"
DEFAULT_TEXT_CONFIG_KEY = "text_config"
# Local checkpoints up to this size are identified by a content hash of every file; larger
# ones (Kimi: ~600 GB) by file names and sizes plus the hash of their small json files.
FULL_HASH_LIMIT = 1 << 30
# Names of the files that define a tokenizer besides `tokeniz*` (weights and model config are left
# out on purpose: retraining a model with the same tokenizer must not invalidate tokenized data).
_TOKENIZER_FILES = {"special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                    "chat_template.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model"}
_TOKENIZER_SUFFIXES = (".tiktoken", ".model")


def resolve_dir(path: str, revision: Optional[str] = None, cache_dir: Optional[str] = None) -> Path:
    """A local directory as it is, or the hub snapshot of a hub id's json files (config, index)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, revision=revision, cache_dir=cache_dir, allow_patterns=["*.json"]))


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


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def files_signature(path: str | Path) -> Optional[str]:
    """Hash of the file names and sizes of a local checkpoint directory (None for a hub id).

    Names and sizes, not contents: it is computed on every config lookup of a generate output,
    where hashing many GB of weights would cost minutes.
    """
    directory = Path(path)
    if not directory.is_dir():
        return None
    entries = sorted(f"{p.name}:{p.stat().st_size}" for p in _files(directory))
    return hashlib.sha256("\n".join(entries).encode("utf-8")).hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def _local_weights_identity(path: str, stamp: tuple) -> dict[str, Any]:
    files = _files(Path(path))
    total = sum(p.stat().st_size for p in files)
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        if total <= FULL_HASH_LIMIT or p.suffix == ".json":
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return {"files": len(files), "bytes": total, "hash": digest.hexdigest()[:16],
            "hashed": "content" if total <= FULL_HASH_LIMIT else "names+sizes+json"}


def weights_identity(path: str, revision: Optional[str], dtype: str) -> dict[str, Any]:
    """What the target's hidden states are a function of, without loading it.

    A local directory is identified by its files (content hash when small, names + sizes +
    json contents when huge), so moving it keeps the identity and retraining changes it; a hub
    id by id and revision (pin `model.revision`: "main" moves).
    """
    local = Path(path).expanduser()
    ident: dict[str, Any] = {"dtype": dtype}
    if local.is_dir():
        stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(local.iterdir()))
        ident["weights"] = _local_weights_identity(str(local.resolve()), stamp)
    else:
        ident.update({"hub_id": path, "revision": revision or "main"})
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


def weights_file_digest(path: str | Path, weights_file: str = "model.safetensors") -> str:
    """Content hash (16 hex digits) of a checkpoint directory's single weights file."""
    digest = hashlib.sha256()
    with open(Path(path) / weights_file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def location(path: str, revision: Optional[str]) -> dict[str, Any]:
    """Where the target is, as configured (`model.path`, `model.revision`): what a server is asked to load."""
    return {"path": str(path), "revision": revision}
