"""One look for every Delphi figure: sizes, fonts, colours, and how figures are saved.

Every figure is saved as PNG (for reading) and SVG (for the paper) side by side,
atomically. Colours: data in black, fits in blue, predictions in orange, the
hero in red, so a reader learns the code once.
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window
import matplotlib.pyplot as plt  # noqa: E402

from delphi.io import atomic_write_bytes  # noqa: E402
from delphi.path_policy import refuse_directory_name  # noqa: E402

DATA = "#222222"
FIT = "#1f5fa8"
PREDICTION = "#e07b00"
HERO = "#c0262d"
BUDGET_CMAP = "viridis"  # one colour per compute budget, ordered
FIGSIZE = (6.4, 4.4)
FIGSIZE_WIDE = (11.0, 4.4)
DPI = 150

RC = {
    "figure.figsize": FIGSIZE,
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "svg.hashsalt": "delphi",  # reproducible SVG ids
    "svg.fonttype": "none",
}

# savefig metadata per format: matplotlib writes the creation time into an SVG unless told not to.
REPRODUCIBLE_METADATA = {".png": None, ".svg": {"Date": None}}

# Axis labels with units, shared so every figure names quantities the same way.
LABEL_PARAMS = "N: non-embedding active parameters"
LABEL_TOKENS = "D: training tokens"
LABEL_FLOPS = "C: training compute (FLOPs)"
LABEL_LOSS = "validation loss (nats/token)"


@contextmanager
def style():
    with plt.rc_context(RC):
        yield


def budget_colors(n: int):
    cmap = plt.get_cmap(BUDGET_CMAP)
    return [cmap(0.1 + 0.8 * i / max(n - 1, 1)) for i in range(n)]


def save_figure(fig, out: str | Path, written_by: str | None = None) -> list[str]:
    """Write OUT as given (.png or .svg) and its sibling in the other format; return both paths.
    `written_by`: the command, which both files then name (delphi.path_policy)."""
    refuse_directory_name(out)  # `figs/` is a directory, never figs.png
    out = Path(out)
    stem = out.with_suffix("") if out.suffix.lower() in (".png", ".svg") else out
    written = []
    for ext in (".png", ".svg"):
        buf = io.BytesIO()
        # Byte-identical files for identical figures: no creation date in the SVG, and its element
        # ids salted with the style's fixed salt (RC applies only inside style(), not at save time).
        with plt.rc_context({"svg.hashsalt": RC["svg.hashsalt"]}):
            fig.savefig(buf, format=ext[1:], metadata=REPRODUCIBLE_METADATA[ext])
        atomic_write_bytes(stem.with_suffix(ext), buf.getvalue(), written_by=written_by)
        written.append(str(stem.with_suffix(ext)))
    plt.close(fig)
    return written


def write_png(fig, out: str | Path, *, dpi: int, written_by: str | None = None) -> str:
    """Write `fig` as one PNG at `dpi` (a report's own figure, no SVG sibling); return the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue(), written_by=written_by)
    return str(out)
