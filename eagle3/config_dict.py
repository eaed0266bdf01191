"""A mapping config node as the plain dict it converts to.

`OmegaConf.to_container` returns any container or scalar a node can hold; the config sections the
package reads (`cfg.train`, `cfg.model.draft`, ...) are mappings, and this says so once, checked.
"""

from __future__ import annotations

from typing import Any, cast

from omegaconf import OmegaConf

__all__ = ["config_dict"]


def config_dict(node: Any, *, resolve: bool) -> dict[str, Any]:
    """`OmegaConf.to_container(node, resolve=resolve)` of a mapping node.

    Raises:
        TypeError: The node is not a mapping (a list, or a None / missing section).
        ValueError: `node` is not an OmegaConf config at all (from `OmegaConf.to_container`).
    """
    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a mapping config section, got {type(plain).__name__}: {plain!r}")
    return cast(dict[str, Any], plain)  # config keys are str (to_container's type allows any DictKeyType)
