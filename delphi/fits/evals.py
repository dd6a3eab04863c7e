"""A run's evals as the fits read them: the points its metrics log recorded an eval at
(`eval_points`) and the steps at which the trainer evaluates (`eval_steps`).

Owned here, below both readers of a curve: the curve law (`delphi.fits.curves`) and a trajectory
from a run's shape (`delphi.fits.shape_trajectory`), so that neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def eval_points(rows: Iterable[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, tokens, val_loss) of the rows that carry an eval."""
    pts = [(r["step"], r["tokens"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    pts = [p for p in pts if math.isfinite(float(p[2]))]
    if not pts:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    a = np.asarray(pts, dtype=np.float64)
    return a[:, 0], a[:, 1], a[:, 2]


def eval_steps(steps: int, eval_every: int) -> list[int]:
    """Update counts at which the trainer evaluates: every eval_every and at the end."""
    out = list(range(eval_every, steps + 1, eval_every))
    if not out or out[-1] != steps:
        out.append(steps)
    return out
