"""Where the project's own files live, independent of the working directory.

Every default path in the config is derived from these, so `python /abs/path/scripts/run.py`
behaves the same from any directory.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout that holds conf/ and scripts/ (the package is installed editable from it).
PROJECT_ROOT = PACKAGE_DIR.parent
CONF_DIR = PROJECT_ROOT / "conf"
ASSETS_DIR = PACKAGE_DIR / "assets"


def asset_path(name: str) -> Path:
    """Absolute path of a file or directory shipped in `eagle3/assets/`."""
    return ASSETS_DIR / name


#: The targets this repository trains and ships (`conf/model/demo.yaml`, `conf/model/demo_kimi.yaml`).
DEMO_TARGETS = ("demo_target", "demo_kimi_target")


def demo_answerer(model_path: str) -> str:
    """Which target answers the demo_native set: the configured one when it is a shipped demo target
    (its answers are then target-native), else the demo target (sampling a large target on a CPU
    is not a demo; such a run should bring its own target-native data)."""
    shipped = {str(asset_path(name)) for name in DEMO_TARGETS}
    resolved = str(Path(model_path).resolve()) if Path(model_path).is_dir() else model_path
    return resolved if resolved in shipped else str(asset_path(DEMO_TARGETS[0]))
