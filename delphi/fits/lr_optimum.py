"""The optimum of loss against learning rate on a grid: a quadratic in log2 LR around the best
point (`delphi mup lr-sweep`, `delphi ladder lr-calibrate`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from jaxtyping import Float

Z90 = 1.6448536269514722  # two-sided 90% normal quantile (delta-method interval)
DEFAULT_NEIGHBOURS = 2  # grid points each side of the best LR used by the quadratic


@dataclass
class QuadraticFit:
    """loss = a + b x + c x^2, x = log2(lr), fitted to `lrs`/`losses` (the points actually used)."""

    lrs: list[float]
    losses: list[float]
    coef: tuple[float, float, float] | None  # (a, b, c); None with fewer than 3 points
    lr_opt: float | None  # 2^(-b/2c) when c > 0, else None
    lr_opt_interval_90: tuple[float, float] | None  # delta method; None without residual dof
    loss_opt: float | None
    interior: bool  # the optimum lies inside the fitted LR range
    best_lr: float  # the grid point with the lowest loss

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_quadratic(
    lrs: Float[np.ndarray, " n"], losses: Float[np.ndarray, " n"], neighbours: int = DEFAULT_NEIGHBOURS
) -> QuadraticFit:
    """Quadratic in log2(LR) around the best finite point; diverged (non-finite) runs are left out."""
    import numpy as np

    lrs, losses = np.asarray(lrs, float), np.asarray(losses, float)
    order = np.argsort(lrs)
    lrs, losses = lrs[order], losses[order]
    ok = np.isfinite(losses)
    lrs, losses = lrs[ok], losses[ok]
    if lrs.size == 0:
        raise ValueError("no finite losses to fit")
    best = int(np.argmin(losses))
    lo, hi = max(0, best - neighbours), min(lrs.size, best + neighbours + 1)
    x, y = np.log2(lrs[lo:hi]), losses[lo:hi]
    fit = QuadraticFit(
        lrs=lrs[lo:hi].tolist(),
        losses=y.tolist(),
        coef=None,
        lr_opt=None,
        lr_opt_interval_90=None,
        loss_opt=None,
        interior=False,
        best_lr=float(lrs[best]),
    )
    if x.size < 3:
        return fit
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    a, b, c = (float(v) for v in coef)
    fit.coef = (a, b, c)
    if c <= 0:  # no minimum: the curve is flat or concave over the fitted points
        return fit
    x_opt = -b / (2 * c)
    fit.lr_opt = float(2.0**x_opt)
    fit.loss_opt = float(a + b * x_opt + c * x_opt**2)
    fit.interior = bool(x.min() <= x_opt <= x.max())
    dof = x.size - 3
    if dof > 0:
        resid = y - design @ coef
        cov = float(resid @ resid) / dof * np.linalg.inv(design.T @ design)
        grad = np.array([0.0, -1 / (2 * c), b / (2 * c * c)])  # d x_opt / d (a, b, c)
        sd = math.sqrt(max(float(grad @ cov @ grad), 0.0))
        fit.lr_opt_interval_90 = (float(2.0 ** (x_opt - Z90 * sd)), float(2.0 ** (x_opt + Z90 * sd)))
    return fit


def fit_lr_drift(
    m_opt: "Float[np.ndarray, ' n']", width_ratio: "Float[np.ndarray, ' n']", tokens_ratio: "Float[np.ndarray, ' n']"
) -> tuple[float, float | None, float | None] | None:
    """Least squares of log m* = intercept + width_exp log(width ratio) + horizon_exp log(tokens ratio):
    how far a rule's LR drifts from the measured optimum (m* = optimum / rule) with width and horizon.
    A term is fitted only where the points vary in it (None otherwise); None when there are fewer
    points than terms. Used by `ladder lr-calibrate` and `ladder recipe-check`."""
    import numpy as np

    y = np.log(np.asarray(m_opt, float))
    columns, fitted_terms = [np.ones(len(y))], [0]
    for term, ratio in ((1, width_ratio), (2, tokens_ratio)):
        values = np.log(np.asarray(ratio, float))
        if len(values) and np.ptp(values) > 0:
            columns.append(values)
            fitted_terms.append(term)
    design = np.stack(columns, axis=1)
    if len(y) < design.shape[1]:
        return None
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    out: list[float | None] = [None, None, None]
    for term, value in zip(fitted_terms, solution):
        out[term] = float(value)
    return out[0], out[1], out[2]
