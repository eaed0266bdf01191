"""An import-only ``torchvision`` for SGLang's CPU engine only.

SGLang 0.5.23 imports ``torchvision.transforms`` while it imports its model configs, for every
model (``sglang/srt/configs/__init__.py`` -> ``nano_nemotron_vl`` -> ``multimodal/internvl_utils``;
``configs/deepseek_ocr.py``), text-only ones included. PyPI's torchvision wheels are CUDA builds:
against ``torch+cpu`` their ``_C`` extension does not load and ``import torchvision`` fails
("operator torchvision::nms does not exist"). ``scripts/setup_sglang_cpu.sh`` copies this file into
the CPU server's own venv (``.sglang-venv``) as the package ``torchvision`` so those imports
succeed; nothing else imports it. A GPU install uses the real torchvision and never gets this file;
the setup script refuses to put it where a real torchvision is installed.

The modules SGLang imports by name exist (``transforms``, ``transforms.functional``,
``transforms.v2``, ``transforms.v2.functional``, ``io``) and ``InterpolationMode`` is the real enum
(its members are read when some processors are defined). Every other name is a placeholder that
raises ``RuntimeError`` when called: image and video inputs cannot be served from this venv.
"""

from __future__ import annotations

import sys
import types
from enum import Enum

__version__ = "0.0.0+eagle3.cpu.stand.in"

# Marks this stand-in; setup_sglang_cpu.sh and checks read it.
EAGLE3_CPU_STAND_IN = True

_SUBMODULES = ("transforms", "transforms.functional", "transforms.v2", "transforms.v2.functional", "io")


class InterpolationMode(Enum):
    """torchvision's names and values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _unavailable(qualname: str):
    def unavailable(*args, **kwargs):
        raise RuntimeError(
            f"{qualname}: torchvision is not installed in SGLang's CPU venv (an import-only stand-in "
            "from eagle3/serving/sglang_cpu_torchvision.py); this server serves text only"
        )

    unavailable.__qualname__ = unavailable.__name__ = qualname.rsplit(".", 1)[-1]
    return unavailable


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return _unavailable(f"{module_name}.{name}")

    return __getattr__


def _install_submodules() -> None:
    for rel in _SUBMODULES:
        name = f"{__name__}.{rel}"
        if name in sys.modules:
            continue
        module = types.ModuleType(name, f"Import-only stand-in for {name}.")
        vars(module).update(__getattr__=_module_getattr(name), InterpolationMode=InterpolationMode)
        sys.modules[name] = module
        parent_name, _, child = name.rpartition(".")
        setattr(sys.modules[parent_name], child, module)


__getattr__ = _module_getattr(__name__)
_install_submodules()
