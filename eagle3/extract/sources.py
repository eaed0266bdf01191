"""Where hidden states come from (`extract.backend`): the target in this process, or vLLM/SGLang servers.

A source answers `states(seqs)` for token sequences, in order, each with `(aux [T, C*H], final
[T, H])` -- the C capture layers side by side and the teacher, the output of the target's final
norm -- or with `(reason, detail)` when it has none for that sequence. Stage extract stores what
it answers; online training (`train.hidden_states=online`) trains on it directly. Every backend
uses the one capture convention (capture i = the residual stream entering decoder layer i = HF
`hidden_states[i]`), converted per engine where the engine numbers layers its own way.

* `hf`: transformers in this process, pre-hooks on the capture layers (`capture`), loaded on the
  first call (`extract.device_map` spreads a big target over GPUs);
* `vllm`: `extract.server` -- launched for the block with vLLM's `extract_hidden_states` method and
  eagle3's KV connector (ids through `eagle3.layer_ids`), or the running servers at
  `extract.server.urls` -- through `eagle3.extract.vllm_client`;
* `sglang`: `extract.server` -- launched for the block with eagle3's capture plugin
  (`eagle3.extract.sglang_plugin`, given the capture layers as they are), or running at its
  urls -- through `eagle3.extract.sglang_client`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union

import numpy as np
import torch

from eagle3.engines import IN_PROCESS, SGLANG, VLLM
from eagle3.extract.capture import LayerCapture, capture_samples
from eagle3.target.decoder import DecoderParts

if TYPE_CHECKING:
    from eagle3.config.schema import Eagle3Config, ExtractConfig, ModelConfig

__all__ = ["HFStates", "StateSource", "exchange_dir", "extraction_batch_tokens", "online_states", "open_states",
           "vllm_layer_ids"]

log = logging.getLogger("eagle3")
States = Union[tuple[torch.Tensor, torch.Tensor], tuple[str, str]]
PLUGIN_MODULE = "eagle3_vllm_connector"  # the connector's module name on the server's PYTHONPATH
SGLANG_PLUGIN_MODULE = "eagle3_sglang_capture"  # the capture plugin's module name there
INCOMING_DIR = ".incoming"
#: Padded tokens per extraction forward when `extract.batch_tokens` is null. On a CPU the hf backend runs
#: 1.05-1.31x faster at 2,048 than at 8,192 (chosen on the demo, SmolLM2 and gemma-3-270m; confirmed on
#: Qwen2.5-Coder-1.5B, 1.23x: BENCHMARKS.md "The batch budget on a CPU"): a batch's MLP
#: activations stay in the caches. A GPU, or a server batching the requests itself, wants big batches.
CPU_EXTRACT_BATCH_TOKENS, EXTRACT_BATCH_TOKENS = 2048, 8192


def extraction_batch_tokens(extract: ExtractConfig) -> int:
    """`extract.batch_tokens`, or its default for where the states are computed."""
    if extract.batch_tokens is not None:
        return extract.batch_tokens
    on_cpu = extract.backend == IN_PROCESS and not torch.cuda.is_available()
    return CPU_EXTRACT_BATCH_TOKENS if on_cpu else EXTRACT_BATCH_TOKENS


class StateSource(Protocol):
    name: str

    def states(self, seqs: Sequence[np.ndarray]) -> list[States]:
        """Per sequence: `(aux [T, C*H], final [T, H])`, or `(reject reason, detail)`."""
        ...

    def describe(self) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


class HFStates:
    """States from transformers in this process; the target loads on the first `states` call.

    Picklable before that call (a spawned DDP rank loads its own copy).
    """

    name = IN_PROCESS

    def __init__(self, load: Callable[[], DecoderParts], capture_layers: Sequence[int]) -> None:
        self._load = load
        self.capture_layers = [int(i) for i in capture_layers]
        self._capture: Optional[LayerCapture] = None
        self.counters = {"prompts": 0, "tokens": 0, "seconds": 0.0}

    def states(self, seqs: Sequence[np.ndarray]) -> list[States]:
        if self._capture is None:
            self._capture = LayerCapture(self._load(), self.capture_layers).__enter__()
        started = time.perf_counter()
        results = capture_samples(self._capture, seqs)
        self.counters["seconds"] += time.perf_counter() - started
        self.counters["prompts"] += len(seqs)
        self.counters["tokens"] += sum(len(s) for s in seqs)
        return list(results)  # as list[States]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, **self.counters}

    def close(self) -> None:
        if self._capture is not None:
            self._capture.__exit__(None, None, None)
            self._capture = None

    def __enter__(self) -> HFStates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        if self._capture is not None:
            raise TypeError("HFStates holds a loaded target: it crosses process boundaries only before first use")
        return dict(self.__dict__)


def load_hf_target(cfg: Eagle3Config) -> DecoderParts:
    """The configured target, loaded with transformers and checked against `model.*`."""
    from eagle3.target.decoder import check_geometry, load_target

    m = cfg.model
    parts = load_target(m.path, dtype=m.dtype, trust_remote_code=m.trust_remote_code,
                        revision=m.revision, device_map=cfg.extract.device_map,
                        cache_dir=cfg.paths.hf_cache, text_config_key=m.text_config_key)
    check_geometry(parts, m.num_layers, m.hidden_size)
    return parts


def vllm_layer_ids(model: ModelConfig) -> list[int]:
    """What vLLM is asked to capture: the capture layers in vLLM's numbering, then the final residual."""
    from eagle3.layer_ids import engine_aux_layer_ids

    return [*engine_aux_layer_ids(model.capture_layers, VLLM), model.num_layers]


def exchange_dir(extract: ExtractConfig) -> Path:
    """Where an extraction server writes its files (`extract.http.exchange_dir`, default under the store root)."""
    configured = extract.http.exchange_dir
    where = Path(configured) if configured else Path(extract.store_root) / INCOMING_DIR
    return where.expanduser().resolve()


def extraction_command(cfg: Eagle3Config, run_dir: Path) -> Any:
    """The command of a server that hands out this config's hidden states (`extract.server`, `extract.backend`)."""
    if cfg.extract.backend == SGLANG:
        return _sglang_extraction_command(cfg, run_dir)
    return _vllm_extraction_command(cfg, run_dir)


def _server_context(cfg: Eagle3Config) -> int:
    """The extraction server's context: the longest prompt plus the one token it generates."""
    return max(cfg.extract.server.context_length or 0, cfg.data.max_len + 1)


def _sglang_extraction_command(cfg: Eagle3Config, run_dir: Path) -> Any:
    """SGLang with eagle3's capture plugin: the module and a `.dist-info` naming it as an SGLang plugin."""
    from eagle3.extract import sglang_plugin
    from eagle3.serving.capture_commands import SGLangCapture
    from eagle3.serving.commands import launch_config, sglang_command

    plugin_dir = Path(run_dir) / "sglang_plugin"
    info = plugin_dir / f"{sglang_plugin.DIST_NAME.replace('-', '_')}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sglang_plugin.__file__, plugin_dir / f"{SGLANG_PLUGIN_MODULE}.py")  # torch and SGLang only
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {sglang_plugin.DIST_NAME}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{sglang_plugin.ENTRY_POINT_GROUP}]\n"
                                           f"{sglang_plugin.ENTRY_POINT} = {SGLANG_PLUGIN_MODULE}:register\n")
    layers = ",".join(str(int(i)) for i in cfg.model.capture_layers)
    capture = SGLangCapture(plugin_dir=str(plugin_dir), context_length=_server_context(cfg),
                            plugin_env={sglang_plugin.CAPTURE_ENV: layers})
    return sglang_command(launch_config(cfg, "extract.server", speculative=False), hidden_states=capture)


def _vllm_extraction_command(cfg: Eagle3Config, run_dir: Path) -> Any:
    from eagle3.extract import vllm_connector
    from eagle3.serving.capture_commands import HiddenStateExport
    from eagle3.serving.commands import launch_config, vllm_command

    plugin_dir = Path(run_dir) / "vllm_plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vllm_connector.__file__, plugin_dir / f"{PLUGIN_MODULE}.py")  # self-contained: vLLM, torch only
    export = HiddenStateExport(layer_ids=tuple(vllm_layer_ids(cfg.model)),
                               exchange_dir=str(exchange_dir(cfg.extract)),
                               plugin_dir=str(plugin_dir), connector_module=PLUGIN_MODULE,
                               connector=vllm_connector.CONNECTOR_NAME, max_model_len=_server_context(cfg))
    # The launcher reads `server`; this server extracts, it does not draft.
    return vllm_command(launch_config(cfg, "extract.server", speculative=False), hidden_states=export)


@contextlib.contextmanager
def extraction_servers(cfg: Eagle3Config, run_dir: Path) -> Iterator[list[str]]:
    """Base URLs of the extraction servers: `extract.server.urls`, or one launched for the block."""
    from eagle3.serving.health import check_health
    from eagle3.serving.process import ServerProcess, records_dir

    server = cfg.extract.server
    if server.urls:
        yield check_health(list(server.urls), str(server.backend), timeout_s=cfg.extract.http.connect_wait_s)
        return
    command = extraction_command(cfg, run_dir)
    if command.backend == VLLM:
        exchange_dir(cfg.extract).mkdir(parents=True, exist_ok=True)
    log_path = Path(run_dir) / f"extract-{command.log_name}"
    log.info("extract: starting the %s server that hands out hidden states: %s (log %s)", command.backend,
             command.shell(), log_path)
    with ServerProcess(command, log_path, startup_timeout_s=server.startup_timeout_s,
                       records_dir=records_dir(cfg.paths)) as proc:
        yield [proc.url]


@contextlib.contextmanager
def open_states(cfg: Eagle3Config, run_dir: Path) -> Iterator[StateSource]:
    """The source `extract.backend` names, open for the block (a launched server is stopped after)."""
    with online_states(cfg, run_dir) as make_source:
        source = make_source()
        try:
            yield source
        finally:
            source.close()


@contextlib.contextmanager
def online_states(cfg: Eagle3Config, run_dir: Path, urls_file: Optional[Path] = None,
                  wait_for_urls: bool = False) -> Iterator[Callable[[], StateSource]]:
    """A picklable maker of this config's state source, valid for the block (online training; extract
    makes one source through `open_states`).

    Each process that trains calls it once and gets its own source: `hf` loads the target there;
    `vllm` and `sglang` connect to the servers -- `extract.server.urls`, or one launched for the block, whose
    URLs go to `urls_file` so that the ranks a launcher starts separately (torchrun, Lightning's
    ddp) use it too (`wait_for_urls`: such a rank waits for the file instead of launching).
    """
    from eagle3.extract import BACKENDS

    backend = cfg.extract.backend
    if backend not in BACKENDS:
        raise ValueError(f"extract.backend={backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == IN_PROCESS:
        yield functools.partial(HFStates, functools.partial(load_hf_target, cfg), list(cfg.model.capture_layers))
        return
    client = _server_client(cfg)
    if wait_for_urls and urls_file is not None and not cfg.extract.server.urls:
        yield functools.partial(client, _await_urls(urls_file, cfg.extract.server.startup_timeout_s))
        return
    with extraction_servers(cfg, run_dir) as urls:
        if urls_file is not None:
            from eagle3.artifacts import atomic_write_json

            atomic_write_json(urls_file, {"urls": urls})
        try:
            yield functools.partial(client, urls)
        finally:
            if urls_file is not None:
                urls_file.unlink(missing_ok=True)


def _server_client(cfg: Eagle3Config) -> Callable[[list[str]], StateSource]:
    """The client of `extract.backend`'s servers, all but the URLs given (picklable)."""
    m, settings = cfg.model, cfg.extract.http
    if cfg.extract.backend == SGLANG:
        from eagle3.extract.sglang_client import SGLangStates

        return functools.partial(SGLangStates, settings=settings, n_capture=len(m.capture_layers),
                                 hidden_size=int(m.hidden_size))
    from eagle3.extract.vllm_client import VLLMStates
    from eagle3.target.weights import load_final_norm

    norm = load_final_norm(m.path, revision=m.revision, cache_dir=cfg.paths.hf_cache, text_config_key=m.text_config_key)
    return functools.partial(VLLMStates, settings=settings, n_capture=len(m.capture_layers), final_norm=norm)


def _await_urls(urls_file: Path, timeout_s: float) -> list[str]:
    import json

    deadline = time.monotonic() + timeout_s
    while not urls_file.is_file():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{urls_file}: rank 0 did not publish its vLLM server within {timeout_s:g} s")
        time.sleep(0.5)
    return list(json.loads(urls_file.read_text())["urls"])
