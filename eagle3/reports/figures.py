"""Matplotlib figures for reports: the Agg canvas directly (no pyplot state, no display)."""

from __future__ import annotations

import io
from typing import Any


def new_figure(width: float, height: float, dpi: int = 100) -> Any:
    """A figure on an Agg canvas, `width` x `height` inches."""
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
