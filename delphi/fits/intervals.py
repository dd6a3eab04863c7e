"""Predictive intervals: the normal quantiles of the central 50% and 90% intervals, and a fit's
bootstrap interval widened in quadrature by z x a scatter (`predictive_interval`).

Owned here so that every module that widens an interval (the backtest, the probes' correction, a
trajectory from a run's shape, the calibration) imports it from one place below them all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Z_90 = 1.6448536269514722  # standard normal quantile at 0.95: a central 90% interval
Z_50 = 0.6744897501960817  # ... at 0.75: a central 50% interval


def predictive_interval(point: float, fit_interval: Any, scatter: float | None, z: float = Z_90) -> tuple[float, float] | None:
    """Bootstrap interval widened by z x the residual scatter, each side in quadrature (normal
    approx); z = Z_90 for a central 90% interval."""
    extra = z * scatter if scatter is not None else 0.0
    if fit_interval is not None and fit_interval[0] is not None and fit_interval[1] is not None:
        lo, hi = point - float(fit_interval[0]), float(fit_interval[1]) - point
    elif scatter is not None:
        lo = hi = 0.0
    else:
        return None
    return (point - float(np.hypot(max(lo, 0.0), extra)), point + float(np.hypot(max(hi, 0.0), extra)))
