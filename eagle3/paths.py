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
