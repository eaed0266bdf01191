"""Writing a report's files: atomically where they belong, copied into the job's run directory."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from eagle3.artifacts import atomic_write_bytes, atomic_write_json, atomic_write_text


def write_report_files(out_dir, names: Mapping[str, str], report: dict, markdown: str,
                       pngs: Mapping[str, bytes]) -> dict[str, Path]:
    """The JSON record, the markdown and the PNGs of a report, each written atomically.

    Args:
        out_dir: Directory to write into (created).
        names: File name by kind: `json`, `md`, and one per key of `pngs`.
        report: The plain data (the JSON file).
        markdown: The rendered markdown.
        pngs: PNG bytes by kind.

    Returns:
        The written paths by kind.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in names.items()}
    atomic_write_json(paths["json"], report)
    atomic_write_text(paths["md"], markdown)
    for kind, data in pngs.items():
        atomic_write_bytes(paths[kind], data)
    return paths


def copy_files(paths: Mapping[str, Path], *dirs) -> None:
    """Copy written report files into each of `dirs` (the run directory), skipping their own."""
    for directory in dirs:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for path in paths.values():
            if Path(path).parent.resolve() != directory.resolve():
                shutil.copy2(path, directory / Path(path).name)
