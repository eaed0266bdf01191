"""Which fields key a stage's output: declared on the schema (eagle3.config.slices), read by every stage."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest

from eagle3.config.fields import run_field, speed_field, use_field
from eagle3.config.slices import fingerprinted
from eagle3.stages.bench import BENCH
from eagle3.stages.generate import GENERATE
from eagle3.stages.prep import PREP
from eagle3.stages.train import TRAIN
from tests.conftest import compose_settings


@dataclass
class _Inner:
    kernel: str = speed_field("triton")
    width: int = 8


@dataclass
class _Node:
    lr: float = 0.1
    port: int = run_field(30000)
    weight: float = use_field(1.0)
    inner: _Inner = field(default_factory=_Inner)
    added_later: bool = False  # a new field with no mark: keyed


def test_marks_decide_what_is_keyed_and_speed_only_when_asked():
    node = _Node()
    assert fingerprinted(node) == {"lr": 0.1, "inner": {"width": 8}, "added_later": False}
    assert fingerprinted(node, speed=True) == {"lr": 0.1, "inner": {"kernel": "triton", "width": 8},
                                               "added_later": False}
    assert fingerprinted({"a": [node]}) == {"a": [fingerprinted(node)]}


BASE = ["dataset=demo_prompts", "generate.backend=vllm"]


@pytest.mark.parametrize(("stage", "unit", "override", "keyed"), [
    # Where a job runs and how it is watched never moves an output.
    (TRAIN, "demo", "train.progress_every_s=5", False),
    (TRAIN, "demo", "train.num_workers=2", False),
    (TRAIN, "demo", "train.logits_memory_gb=1", False),
    (TRAIN, "demo", "train.packing=true", True),
    (TRAIN, "demo", "train.optimizer.lr=0.001", True),
    (TRAIN, "demo", "model.draft.num_layers=2", True),
    # generate: the request fields and how the engine serves the target key it; the client does not.
    (GENERATE, "demo_prompts", "generate.http.request_timeout_s=5", False),
    (GENERATE, "demo_prompts", "generate.http.partitions=[{max_context:null,concurrency:4}]", False),
    (GENERATE, "demo_prompts", "generate.server.port=31000", False),
    (GENERATE, "demo_prompts", "generate.server.tp=2", False),
    (GENERATE, "demo_prompts", "generate.reuse_earlier=false", False),
    (GENERATE, "demo_prompts", "+generate.http.extra_body.top_k=5", True),
    (GENERATE, "demo_prompts", "generate.server.context_length=4096", True),
    (GENERATE, "demo_prompts", "generate.server.extra_args=[--quantization,fp8]", True),
    # prep: the source's identity, not what later stages do with it.
    (PREP, "demo_prompts", "dataset.sources.demo_prompts.weight=2", False),
    (PREP, "demo_prompts", "dataset.sources.demo_prompts.thinking=false", False),
    (PREP, "demo_prompts", "dataset.sources.demo_prompts.description=x", False),
    (PREP, "demo_prompts", "prep.dedupe=false", True),
    # bench measures speed: the engine's speed settings key it, its port does not.
    (BENCH, "demo", "server.port=31000", False),
    (BENCH, "demo", "bench.request_timeout_s=5", False),
    (BENCH, "demo", "server.tp=2", True),
    (BENCH, "demo", "server.speculative.draft_quantization=unquant", True),
])
def test_a_stage_slice_follows_the_schema_marks(stage, unit, override, keyed):
    extra = ("stage=bench", "server=vllm") if stage is BENCH else ()
    before = stage.unit_config(_base(extra), unit)
    after = stage.unit_config(compose_settings([*BASE, *extra, override]), unit)
    assert (after != before) is keyed, override


@functools.cache
def _base(extra: tuple[str, ...]):
    """The config every case of a stage changes one key of (composed once; stages only read it)."""
    return compose_settings([*BASE, *extra])
