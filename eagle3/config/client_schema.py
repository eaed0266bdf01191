"""The schema of the nodes of the two stages that talk to inference servers: `generate` (regeneration
through the target) and `extract` (its hidden states).

Part of the schema (`eagle3.config.schema`, whose docstring states the rule: every default lives
here, next to its type and constraint, and a YAML file sets only what its option changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from eagle3.config.choices import EndpointStrategy, ExtractBackend, LengthPolicy, StorageFormat
from eagle3.config.fields import run_field, setting, speed_field
from eagle3.config.server_schema import ServerConfig
from eagle3.engines import SERVER_BACKENDS


@dataclass
class GeneratePartitionConfig:
    """Requests whose estimated prompt fits `max_context` tokens share `concurrency` slots.

    A request goes to the first partition (smallest `max_context`) it fits; null = no limit.
    Long prompts hold more KV cache, so they run at a lower concurrency (docs/design.md, 'Facts:
    published numbers': the plan regenerated <= 10K-token prompts at concurrency 150-200, longer
    ones in their own partition).
    """

    max_context: Optional[int] = setting(None, gt=0)
    concurrency: int = setting(16, gt=0)


def _default_partitions() -> list[GeneratePartitionConfig]:
    return [GeneratePartitionConfig(max_context=10240, concurrency=192),
            GeneratePartitionConfig(max_context=None, concurrency=16)]


@dataclass
class GenerateHTTPConfig:
    """The client of OpenAI-compatible servers (generate.backend vllm | sglang) in stage generate.

    Only `chat_template_kwargs`, `thinking_keys` and `extra_body` change what is generated, so
    only they enter the output fingerprint; the rest says how fast and how stubbornly the client
    asks, and a resumed run may change it (more endpoints, another concurrency or timeout).
    """

    partitions: list[GeneratePartitionConfig] = speed_field(default_factory=_default_partitions)
    # false: a partition's concurrency is the total over all endpoints; true: per endpoint.
    concurrency_per_endpoint: bool = speed_field(False)
    endpoint_strategy: str = speed_field("least_busy", EndpointStrategy)
    # Prompt tokens are estimated as characters / chars_per_token (low = conservative).
    chars_per_token: float = speed_field(3.0, gt=0)
    request_timeout_s: float = run_field(1800.0, gt=0)  # whole request (non-streaming), attempts separately
    connect_timeout_s: float = run_field(30.0, gt=0)
    max_attempts: int = run_field(6, gt=0)  # per request; timeouts, connection loss, HTTP 429/5xx are retried
    backoff_s: float = run_field(1.0, ge=0)  # exponential backoff base (with jitter), capped at max_backoff_s
    max_backoff_s: float = run_field(60.0, ge=0)
    # Stop the run after this many requests in a row failed for good (the endpoints are down)
    # instead of sending the rest into a dead server. Failed conversations are never rejected:
    # they stay undone and the next run of the same command retries them. 0 = never stop.
    max_consecutive_failures: int = run_field(64, ge=0)
    connect_wait_s: float = run_field(60.0, gt=0)  # how long to wait at start for a first endpoint to answer
    # Batches regenerated at once (each advances turn by turn); null = enough to fill the
    # largest partition twice over.
    inflight_batches: Optional[int] = speed_field(None, gt=0)
    model: Optional[str] = run_field(None)  # served model name; null = the first of the server's /v1/models
    # Sent as chat_template_kwargs; the source's thinking mode is added under each thinking key
    # (Kimi-K2.5 reads `thinking`, Qwen3-style templates `enable_thinking`).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking_keys: list[str] = field(default_factory=lambda: ["thinking", "enable_thinking"])
    extra_body: dict[str, Any] = field(default_factory=dict)  # more request fields, engine-specific
    # Seconds between stage generate's progress lines when no terminal watches (any backend; batch jobs)
    log_every_s: float = run_field(30.0, gt=0)


@dataclass
class GenerateConfig:
    """Regeneration of prompt-only conversations through the target (stage generate)."""

    # hf = transformers in this process; vllm | sglang = an OpenAI-compatible server, `server` below.
    backend: str = setting("hf", SERVER_BACKENDS)
    max_new_tokens: int = setting(256, gt=0)
    temperature: float = setting(0.6, ge=0, valid=">= 0 (0 = greedy)")
    top_p: float = setting(0.95, gt=0, le=1, why="a probability mass")
    batch_size: int = setting(16, gt=0)
    max_user_turns: int = setting(8, gt=0)  # user turns answered per conversation
    # A response cut at max_new_tokens: keep it flagged (truncated=true) or drop the sample.
    length_policy: str = setting("keep_flagged", LengthPolicy)
    # Copy batches that an earlier generate output of the same source ran under the same config
    # (a smaller num_samples: its sample is a prefix) instead of generating them again.
    reuse_earlier: bool = speed_field(True)
    # Client of the vLLM/SGLang server (generate.backend=vllm|sglang), launched or at generate.server.urls.
    http: GenerateHTTPConfig = field(default_factory=GenerateHTTPConfig)
    # The server of generate.backend=vllm|sglang: launched for the stage, or running at its `urls`
    # (conf/config.yaml composes server/cpu.yaml here: the engine generate.backend names, on this CPU;
    # on GPUs e.g. server@generate.server=sglang_h200). Apart from `server`, the engine that serves the
    # draft: data generated in one place is served in another.
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class ExtractHTTPConfig:
    """The client of vLLM/SGLang servers that extract hidden states (extract.backend=vllm|sglang).

    Like generate's: requests concurrent, retried with exponential backoff on timeouts, lost
    connections and 429/5xx, a run stopped (resumable) once the server looks down.
    """

    concurrency: int = setting(8, gt=0)  # prompts in flight (the engine batches them itself)
    request_timeout_s: float = setting(600.0, gt=0)  # one prompt's prefill, per attempt
    max_attempts: int = setting(6, gt=0)
    backoff_s: float = setting(1.0, ge=0)
    max_backoff_s: float = setting(60.0, ge=0)
    # Stop the run after this many prompts in a row failed for good: the server is down (rerun resumes).
    max_consecutive_failures: int = setting(16, ge=0)
    connect_wait_s: float = setting(60.0, gt=0)  # how long to wait at start for the server to answer
    # vLLM: the server writes a prompt's states to a file right after answering: how long to wait for it.
    file_wait_s: float = setting(120.0, gt=0)
    # Where the server writes those files; null = `<store>/.incoming` (same filesystem as the store).
    # With extract.server.urls it must be a directory the server and this job both see.
    exchange_dir: Optional[str] = None


@dataclass
class ExtractConfig:
    """Hidden states of the target: where they come from, and the store they go to."""

    # hf = transformers in this process (hooks on the capture layers); vllm = a vLLM server's
    # extract_hidden_states method; sglang = an SGLang server with eagle3's capture plugin
    # (extract.server: launched for the job, or running at its urls).
    backend: str = setting("hf", ExtractBackend)
    storage_format: str = setting("bf16", StorageFormat)  # eagle3.states.formats (compact: int8, top-k teacher)
    # Padded tokens per forward; null = eagle3.extract.sources.extraction_batch_tokens (2,048 for the hf
    # backend on a CPU, where large batches leave the caches; 8,192 on a GPU or through a server).
    batch_tokens: Optional[int] = setting(None, gt=0)
    shard: int = 0
    num_shards: int = setting(1, gt=0)
    disk_margin_gb: float = setting(5.0, ge=0)
    device_map: Optional[str] = None  # e.g. "auto" for multi-GPU
    # Shared by every mix and data scale (content-keyed), so it lives outside the stage units.
    store_root: str = "${paths.root}/hidden_states"
    # Print the disk estimate of the plan (no data, no model) and stop.
    dry_run: bool = False
    # Mean sample length the dry run and stage=plan assume until tokenize has measured it: with bf16
    # at Kimi's H=7168 (57,348 B/token) 1,600 tokens give 91.8 GB per 1K samples, the ~92 GB per 1K
    # the original effort measured.
    assumed_tokens_per_sample: int = setting(1600, gt=0)
    # Free bytes to assume instead of measuring the store's filesystem (planning, tests).
    assume_free_bytes: Optional[int] = setting(None, ge=0, valid=">= 0 or null")
    http: ExtractHTTPConfig = field(default_factory=ExtractHTTPConfig)
    # The server of extract.backend=vllm|sglang (conf/config.yaml composes server/cpu.yaml here, whose
    # engine follows extract.backend; it can differ from generate.server and from `server`, the engine
    # that serves). It runs the target in model.dtype.
    server: ServerConfig = field(default_factory=ServerConfig)
