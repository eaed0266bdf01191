"""The config rule of the demo's generated sources: `dataset.sources.<name>.generator`.

Run for every config after `eagle3.data.rules.check_dataset` (`eagle3.stages.CONFIG_RULES`): the
data package reads sources of any origin and knows nothing of the demo's generators, which sit above it.
"""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import Eagle3Config
from eagle3.demo.datasets import GENERATORS


def check_generators(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """Each generated source names one of the demo's generators."""
    for name, src in cfg.dataset.sources.items():
        if src.generator is not None:
            err.choice(f"dataset.sources.{name}.generator", src.generator, GENERATORS)
