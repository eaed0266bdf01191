"""What every report shares: one rule for a table cell, figures without pyplot, files written atomically.

A cell shows missing, NaN and yes/no the same way in every report (`fmt`); figures draw on the Agg
canvas directly (no pyplot state, no display); a report's JSON, markdown and PNGs are written
atomically where they belong and copied into the job's run directory.
"""

from __future__ import annotations

import io
import logging
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3.artifacts import atomic_write_bytes, atomic_write_json, atomic_write_text

MISSING = "–"


def fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    """`None` -> "–", floats to `digits` places (NaN as "nan"), bools as yes / NO, else str()."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else f"{value:.{digits}f}") + suffix
    return f"{value}{suffix}"


def md_cell(text: str) -> str:
    """`text` safe inside a markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


class _NoFontCacheNotice(logging.Filter):
    """matplotlib's one-time `Matplotlib is building the font cache` notice: install chatter, not the job's."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "building the font cache" not in record.getMessage()


def new_figure(width: float, height: float, dpi: int = 100) -> Any:
    """A figure on an Agg canvas, `width` x `height` inches."""
    fonts = logging.getLogger("matplotlib.font_manager")
    if not any(isinstance(f, _NoFontCacheNotice) for f in fonts.filters):
        fonts.addFilter(_NoFontCacheNotice())
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes (lay it out first: `fig.tight_layout()`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def label_bars(ax: Any, bars: Any, values: list[float], fmt: str) -> None:
    """Each bar's value above it, formatted with `fmt` (e.g. "{:.1f}")."""
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(fmt.format(value), (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")


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
