"""Server-side stages find the chain whose data another backend generated (eagle3.stages.chain)."""

from __future__ import annotations

import logging

import pytest

from eagle3.stages.base import MissingInput, StageContext, UnitStage, require
from eagle3.stages.chain import chain_config
from tests.conftest import compose_config


def _written(cfg, ctx, unit, out):
    out.count_in(1)
    out.count_out(1)
    return {"backend": cfg.server.backend}


# Keyed by the backend, as generate (and everything downstream of it) is.
GENERATED = UnitStage(name="generated", help="test", units=lambda cfg: [cfg.dataset.name],
                      unit_config=lambda cfg, unit: {"backend": str(cfg.server.backend)},
                      unit_inputs=lambda cfg, ctx, unit: {}, run_unit=_written)

# Downstream of it (as merge is): its own config holds no backend, its input's does.
DOWNSTREAM = UnitStage(name="downstream", help="test", units=lambda cfg: [cfg.dataset.name],
                       unit_config=lambda cfg, unit: {},
                       unit_inputs=lambda cfg, ctx, unit: {"up": require(GENERATED, cfg, ctx, unit)},
                       run_unit=_written)


def _ctx(tmp_path):
    return StageContext(root=tmp_path / "artifacts", run_dir=tmp_path / "run")


def test_the_served_backend_finds_a_chain_generated_in_process(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("eagle3.stages.chain._ANNOUNCED", set())
    ctx = _ctx(tmp_path)
    GENERATED(compose_config(["server=hf"]), ctx)
    [made] = DOWNSTREAM(compose_config(["server=hf"]), ctx)
    served = compose_config(["server=vllm"])
    with caplog.at_level(logging.INFO, logger="eagle3"):
        chain = chain_config(served, ctx, DOWNSTREAM, "demo")
    assert chain.server.backend == "hf" and served.server.backend == "vllm"  # the caller's config untouched
    assert DOWNSTREAM.locate(chain, ctx, "demo")[1].dir == made.dir
    assert "downstream: using the chain whose data was generated with server.backend=hf (none under vllm; " \
           "bench.data_backend=... chooses)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="eagle3"):
        assert chain_config(served, ctx, DOWNSTREAM, "demo").server.backend == "hf"
    assert "generated with" not in caplog.text  # said once, not at every lookup


def test_the_served_backends_own_chain_wins_and_an_explicit_backend_is_obeyed(tmp_path):
    ctx = _ctx(tmp_path)
    GENERATED(compose_config(["server=hf"]), ctx)
    GENERATED(compose_config(["server=vllm"]), ctx)
    served = compose_config(["server=vllm"])
    assert chain_config(served, ctx, GENERATED, "demo") is served
    assert chain_config(served, ctx, GENERATED, "demo", data_backend="hf").server.backend == "hf"


def test_several_foreign_chains_are_ambiguous_and_none_says_where_it_looked(tmp_path):
    ctx = _ctx(tmp_path)
    served = compose_config(["server=sglang"])
    with pytest.raises(MissingInput) as info:
        chain_config(served, ctx, GENERATED, "demo", key="serve.data_backend")
    assert "no complete generated output for 'demo'" in str(info.value)
    assert str(info.value).endswith("(looked under every generate backend: hf, sglang, vllm)")
    GENERATED(compose_config(["server=hf"]), ctx)
    GENERATED(compose_config(["server=vllm"]), ctx)
    with pytest.raises(MissingInput) as info:
        chain_config(served, ctx, GENERATED, "demo", key="serve.data_backend")
    assert str(info.value) == ("no complete generated output for 'demo' generated with server.backend=sglang, but "
                               "there are chains generated with hf, vllm: choose one with serve.data_backend=<hf|vllm>")


def test_data_backend_keys_are_checked_at_compose_time():
    from eagle3.stages import check_config

    lines = check_config(compose_config(["bench.data_backend=hff", "serve.data_backend=vllm"]))
    assert [line for line in lines if "data_backend" in line] == [
        "bench.data_backend: 'hff' -- not a known choice; valid: hf, sglang, vllm, null"]
