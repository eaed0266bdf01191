"""Serving stages (serve, bench) read the config's own chain, whatever engine `server` names.

The chain's data is generated with `generate.backend` (and its server `generate.server`), so no
unit of the chain is keyed by `server`: the demo chain generated in-process is the chain that
`stage=bench server=vllm` benchmarks and `stage=serve server=vllm` serves, without a search over
backends.
"""

from __future__ import annotations

from eagle3.stages import CHAIN
from eagle3.stages.generate import GENERATE
from tests.conftest import compose_settings


def test_serving_with_vllm_reads_the_chain_generated_in_process():
    built = compose_settings([])  # stage=all at its defaults: generate.backend=hf, server=hf
    for served in (compose_settings(["stage=bench", "server=vllm"]), compose_settings(["stage=serve", "server=vllm"])):
        for entry in CHAIN:
            stage = entry.load()
            for unit in stage.units(built):
                assert stage.unit_config(served, unit) == stage.unit_config(built, unit), (entry.name, unit)
    # What keys the chain is the backend that generated its data: another one is another chain.
    through_vllm = compose_settings(["generate.backend=vllm"])
    assert GENERATE.unit_config(through_vllm, "demo_prompts")["generate"]["backend"] == "vllm"
    assert GENERATE.unit_config(built, "demo_prompts")["generate"]["backend"] == "hf"

