"""Stage `tokenize`: canonical conversations -> `tokenized_data.jsonl` with exact loss masks.

One unit per dataset source. Target-native sources are read from `prep`, prompt-only ones from
`generate` (their regenerated answers). Rendering and masks are :mod:`eagle3.data.render`; this
module decides *what* affects the output (the unit config slice) and runs the work over all
cores: a spawn-safe process pool whose workers load the tokenizer once, fed chunks of
conversations through an ordered, bounded window (output order is the input order whatever the
number of workers, and memory stays flat however long the input is). Resume is by id: ids an
earlier, killed run already wrote or rejected are skipped before dispatch.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput, progress, read_jsonl
from eagle3.data.render import Reject, RenderSettings, tokenize_conversation
from eagle3.stages.base import StageContext, UnitStage, require

CONVERSATIONS_FILE = "conversations.jsonl"
TOKENIZED_FILE = "tokenized_data.jsonl"
#: Bump when the record layout or the mask rule changes: old outputs must not be reused.
FORMAT_VERSION = 1
# Names of the files that define a tokenizer (weights and model config are left out on purpose:
# retraining a model with the same tokenizer must not invalidate tokenized data).
_TOKENIZER_FILES = {"special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                    "chat_template.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model"}
_TOKENIZER_SUFFIXES = (".tiktoken", ".model")


@dataclass(frozen=True)
class TokenizerSpec:
    """How a worker loads the tokenizer (picklable, so it crosses the spawn boundary)."""

    path: str
    revision: Optional[str] = None
    trust_remote_code: bool = False
    cache_dir: Optional[str] = None


def load_tokenizer(spec: TokenizerSpec) -> Any:
    """The target's tokenizer, imported lazily so config-only commands stay light."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.path, revision=spec.revision,
                                         trust_remote_code=spec.trust_remote_code, cache_dir=spec.cache_dir)


def tokenizer_files_sha256(directory: Path) -> str:
    """Hash of the tokenizer-defining files of a local model directory (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        name = path.name
        if path.is_file() and (name.startswith("tokeniz") or name in _TOKENIZER_FILES
                               or name.endswith(_TOKENIZER_SUFFIXES)):
            digest.update(name.encode("utf-8") + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def tokenizer_identity(model: DictConfig) -> dict[str, Any]:
    """What names the tokenizer: file hash for a local directory, hub id + revision otherwise.

    A local directory is identified by content, not by its absolute path, so moving a checkout or
    sharing an artifact root between machines does not invalidate tokenized data.
    """
    path = Path(str(model.path)).expanduser()
    if path.is_dir():
        return {"local_files_sha256": tokenizer_files_sha256(path)}
    return {"hub_id": str(model.path), "revision": model.revision}


def _template_text(cfg: DictConfig) -> Optional[str]:
    template = cfg.model.training_chat_template
    return None if template is None else Path(str(template)).read_text(encoding="utf-8")


def render_settings(cfg: DictConfig, unit: str) -> RenderSettings:
    """The render settings of one source (template, its thinking mode, length policy)."""
    return RenderSettings(template=_template_text(cfg), thinking=bool(cfg.dataset.sources[unit].thinking),
                          max_len=int(cfg.data.max_len), overlength=str(cfg.tokenize.overlength))


def _tokenizer_spec(cfg: DictConfig) -> TokenizerSpec:
    return TokenizerSpec(path=str(cfg.model.path), revision=cfg.model.revision,
                         trust_remote_code=bool(cfg.model.trust_remote_code), cache_dir=cfg.paths.hf_cache)


# ---------------------------------------------------------------------------------- workers
_WORKER: dict[str, Any] = {}


def _init_worker(spec: TokenizerSpec, settings: RenderSettings) -> None:
    # One process per core already; the tokenizer's own thread pool would oversubscribe them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["tokenizer"] = load_tokenizer(spec)
    _WORKER["settings"] = settings


def tokenize_chunk(tokenizer: Any, settings: RenderSettings, chunk: list[dict]) -> list[tuple]:
    """Outcomes of a chunk: ``("ok", record)`` or ``("reject", id, reason, detail, source)``.

    Any exception is a reject of that one conversation (never a crash of the job); an exception
    that is not a :class:`Reject` is labelled ``tokenize_error`` so it stays visible as a bug.
    """
    outcomes = []
    for conv in chunk:
        try:
            outcomes.append(("ok", tokenize_conversation(tokenizer, conv, settings)))
        except Reject as rej:
            outcomes.append(("reject", conv["id"], rej.reason, rej.detail, conv.get("source")))
        except Exception as exc:  # noqa: BLE001 - reported per sample, see docstring
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            outcomes.append(("reject", conv["id"], "tokenize_error", detail[:500], conv.get("source")))
    return outcomes


def _work(chunk: list[dict]) -> list[tuple]:
    return tokenize_chunk(_WORKER["tokenizer"], _WORKER["settings"], chunk)


def run_pool(chunks: Iterable[list[dict]], spec: TokenizerSpec, settings: RenderSettings,
             workers: int) -> Iterator[tuple]:
    """Outcomes in input order, computed by ``workers`` processes (1 = in this process).

    At most ``2 * workers`` chunks are in flight: unlike ``Pool.imap``, whose feeder thread reads
    the whole input ahead, this keeps memory independent of the input size.
    """
    if workers <= 1:
        tokenizer = load_tokenizer(spec)
        for chunk in chunks:
            yield from tokenize_chunk(tokenizer, settings, chunk)
        return
    with mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(spec, settings)) as pool:
        window: deque = deque()
        for chunk in chunks:
            window.append(pool.apply_async(_work, (chunk,)))
            if len(window) >= 2 * workers:
                yield from window.popleft().get()
        while window:
            yield from window.popleft().get()


def resolve_workers(requested: int, pending: Optional[int], chunk_size: int) -> int:
    """Worker count: ``0`` = one per core, never more than there are chunks to do."""
    workers = requested or os.cpu_count() or 1
    if pending is not None:
        workers = min(workers, max(1, math.ceil(pending / chunk_size)))
    return max(1, workers)


# ---------------------------------------------------------------------------------- the stage
def _units(cfg: DictConfig) -> list[str]:
    return list(cfg.dataset.sources)


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    settings = render_settings(cfg, unit)
    return {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(cfg.model),
        # None = the tokenizer's own template, already covered by the tokenizer identity.
        "template_sha256": settings.template_sha256,
        "thinking": settings.thinking,
        "max_len": settings.max_len,
        "overlength": settings.overlength,
    }


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    # Imported here: the upstream stages import heavier modules and may import this one.
    if cfg.dataset.sources[unit].track == "prompt_only":
        from eagle3.stages.generate import GENERATE as upstream
    else:
        from eagle3.stages.prep import PREP as upstream
    return {"conversations": require(upstream, cfg, ctx, unit)}


def _record_stats(records: Iterable[dict]) -> dict[str, int]:
    """Manifest counters: tokens, generated tokens, samples cut at data.max_len (``truncated``)
    and samples whose last answer generate cut at max_new_tokens (``generation_truncated``)."""
    stats = {"tokens": 0, "response_tokens": 0, "truncated": 0, "generation_truncated": 0}
    for rec in records:
        stats["tokens"] += rec["seq_len"]
        stats["response_tokens"] += rec["n_response_tokens"]
        stats["truncated"] += int(rec["truncated_max_len"])
        stats["generation_truncated"] += int(rec["truncated_generation"])
    return stats


def _pending(conversations: Iterable[dict], out: StageOutput, unit: str, chunk_size: int) -> Iterator[list[dict]]:
    """Chunks of conversations not done yet; counts every input (done or not) as `in`."""
    chunk: list[dict] = []
    for conv in conversations:
        out.count_in()
        if out.is_done(conv["id"]):
            continue
        conv.setdefault("source", unit)
        chunk.append(conv)
        if len(chunk) >= chunk_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_unit(out: StageOutput, upstream: Manifest, unit: str, settings: RenderSettings,
                  spec: TokenizerSpec, num_workers: int = 0, chunk_size: int = 64) -> dict[str, Any]:
    """Tokenize the conversations of one complete upstream output into ``out``.

    Separate from the stage wiring so tests and benchmarks can drive it on an upstream output
    they built themselves.

    Returns:
        The manifest ``extra`` (file name, template hash, thinking, length policy, workers).
    """
    records = out.records(TOKENIZED_FILE)
    # Statistics of records an earlier, killed run wrote, so a resumed manifest equals a clean one.
    stats = _record_stats(read_jsonl(records.partial_path) if len(records) else [])
    total = upstream.counts.get("out")
    pending = None if total is None else max(0, total - len(out.done_ids))
    workers = resolve_workers(num_workers, pending, chunk_size)
    chunks = _pending(read_jsonl(upstream.dir / CONVERSATIONS_FILE), out, unit, chunk_size)
    for outcome in progress(run_pool(chunks, spec, settings, workers), total=pending, desc=f"tokenize {unit}"):
        if outcome[0] == "ok":
            records.write(outcome[1])
            for key, value in _record_stats([outcome[1]]).items():
                stats[key] += value
        else:
            _, rid, reason, detail, source = outcome
            out.reject(rid, reason, detail, source=source)
    for key, value in stats.items():
        out.count(key, value)
    return {"file": TOKENIZED_FILE, "template_sha256": settings.template_sha256, "thinking": settings.thinking,
            "max_len": settings.max_len, "overlength": settings.overlength, "workers": workers}


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    extra = tokenize_unit(out, _unit_inputs(cfg, ctx, unit)["conversations"], unit, render_settings(cfg, unit),
                          _tokenizer_spec(cfg), int(cfg.tokenize.num_workers), int(cfg.tokenize.chunk_size))
    return {**extra, "template": cfg.model.training_chat_template}


TOKENIZE = UnitStage(
    name="tokenize",
    help="render conversations with the training chat template; exact loss masks from render boundaries",
    units=_units,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
