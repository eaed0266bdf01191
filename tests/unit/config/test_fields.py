"""Each field's own choices and range, declared on the schema (eagle3.config.fields) and checked from there."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from eagle3.cli import check_config
from eagle3.config.checks import ConfigErrors
from eagle3.config.fields import CONSTRAINT, check_fields, run_field, setting
from eagle3.config.server_schema import ServerConfig
from eagle3.serving.rules import server_errors
from tests.conftest import compose_config, compose_settings

Color = Literal["red", "green"]


@dataclass
class _Part:
    size: int = setting(4, gt=0)


@dataclass
class _Node:
    color: str = setting("red", Color)
    maybe: Optional[str] = setting(None, Color)
    share: float = setting(0.5, ge=0, le=1, why="a share")
    wait_s: float = run_field(1.0, ge=0, valid=">= 0 (0 = never)")
    limit: Optional[int] = setting(None, gt=0)
    parts: list[_Part] = field(default_factory=lambda: [_Part(), _Part()])
    named: dict[str, _Part] = field(default_factory=lambda: {"a": _Part()})


def _lines(node) -> list[str]:
    err = ConfigErrors()
    check_fields(node, err)
    return err.lines


def test_the_defaults_pass_and_null_passes_only_where_the_schema_allows_it():
    assert _lines(_Node()) == []
    assert _lines(_Node(color=None)) == ["color: null -- not a known choice; valid: red, green"]  # type: ignore[arg-type]


def test_every_bad_field_is_one_line_naming_its_full_key_with_what_is_valid():
    node = _Node(color="blue", maybe="blue", share=1.5, wait_s=-1, limit=0,
                 parts=[_Part(), _Part(size=0)], named={"a": _Part(size=-2)})
    assert _lines(node) == [
        "color: 'blue' -- not a known choice; valid: red, green",
        "maybe: 'blue' -- not a known choice; valid: red, green, null",
        "share: 1.5 -- a share; valid: [0, 1]",
        "wait_s: -1 -- cannot be negative; valid: >= 0 (0 = never)",
        "limit: 0 -- must be a positive number; valid: > 0",
        "parts[1].size: 0 -- must be a positive number; valid: > 0",
        "named.a.size: -2 -- must be a positive number; valid: > 0",
    ]


@pytest.mark.parametrize(("bounds", "value", "valid"), [
    ({"gt": 0, "le": 1}, 0, "(0, 1]"),
    ({"ge": 0, "lt": 10}, 10, "[0, 10)"),
    ({"gt": 1}, 1.0, "> 1"),
    ({"le": 5}, 6, "<= 5"),
])
def test_a_range_reads_as_its_interval(bounds, value, valid):
    @dataclass
    class Ranged:
        x: float = setting(value, why="out", **bounds)

    assert _lines(Ranged()) == [f"x: {value} -- out; valid: {valid}"]


def test_a_number_field_refuses_a_non_number_and_nan():
    assert _lines(_Part(size="4")) == ["size: '4' -- must be a positive number; valid: > 0"]  # type: ignore[arg-type]
    assert _lines(_Node(share=float("nan")))[0].startswith("share: NaN -- a share")


def test_every_choice_and_range_of_the_schema_holds_for_its_defaults_and_names_real_keys():
    constrained = []

    def visit(node, key):
        for f in dataclasses.fields(node):
            if CONSTRAINT in f.metadata:
                constrained.append(f"{key}{f.name}")
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                visit(value, f"{key}{f.name}.")

    settings = compose_settings([])
    visit(settings, "")
    # The checks the rules used to spell out one by one now come from the fields (a sample of them).
    assert {"train.loss", "train.ttt_decay", "extract.storage_format", "generate.http.endpoint_strategy",
            "server.port", "generate.server.profile", "bench.min_accept_length", "report.target_tau",
            "model.draft.attention", "cpu_threads"} <= set(constrained)
    assert len(constrained) > 80
    err = ConfigErrors()
    check_fields(settings, err)
    assert err.lines == []


def test_the_job_reports_every_bad_field_at_once_in_schema_order_then_the_rules_lines():
    errors = check_config(compose_config([
        "train.loss=ce", "train.ttt_decay=1.5", "extract.storage_format=int4", "generate.http.partitions="
        "[{max_context:1024,concurrency:0},{max_context:null,concurrency:4}]", "report.target_k=0",
        "prep.max_user_turns=0"]))
    assert errors == [
        "generate.http.partitions[0].concurrency: 0 -- must be a positive number; valid: > 0",
        "extract.storage_format: 'int4' -- not a known choice; valid: bf16, compact, fp8, fp32",
        "train.ttt_decay: 1.5 -- weights decay^k must shrink or stay; valid: (0, 1]",
        "train.loss: 'ce' -- not a known choice; valid: kl, tv, jsd, nla, lk",
        "report.target_k: 0 -- K counts draft tokens; valid: an evaluated K >= 1, or null (the largest)",
        "prep.max_user_turns: 0 -- below prep.min_user_turns; valid: >= 1",
    ]


def test_the_launcher_rechecks_a_server_nodes_fields_when_the_entrypoint_was_bypassed():
    model = compose_settings([]).model
    bad = dataclasses.replace(ServerConfig(), backend="tgi", port=0)
    assert server_errors(bad, model)[:2] == ["server.backend: 'tgi' -- not a known choice; valid: hf, sglang, vllm",
                                             "server.port: 0 -- not a TCP port; valid: 1-65535"]

