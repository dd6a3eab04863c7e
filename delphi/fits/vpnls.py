"""VPNLS (variable projection + non-negative least squares) on arrays: for fixed exponents the law is
linear in its coefficients (all >= 0), solved exactly by NNLS; only the exponents are searched, on a
grid then by Nelder-Mead. Least squares on the loss itself. The fits on a table: delphi.fits.parametric.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import minimize, nnls

from delphi.fits.blas import BlasThreads
from delphi.fits.e_prior import EPrior

# VPNLS search range and grid for the exponents.
EXPONENT_BOUNDS = (0.01, 2.5)
VPNLS_GRID = np.linspace(0.05, 1.5, 30)
# Converged when the simplex is within 1e-10 in the exponents and 1e-15 in RSS (Open-Athena's settings).
NELDER_MEAD_OPTIONS = {"xatol": 1e-10, "fatol": 1e-15, "maxiter": 5_000}


def nnls_coefficients(
    exponents: tuple[float, ...],
    columns_log: list[np.ndarray],
    loss: np.ndarray,
    weights: np.ndarray | None = None,
    intercept: float | None = None,
) -> tuple[np.ndarray, float]:
    """For fixed exponents, the law is linear in its coefficients (all >= 0): solve by NNLS.

    columns_log[i] is log of the variable the i-th exponent applies to; the design is
    [1, exp(-e_i * log x_i) ...]. Columns are scaled to unit norm for conditioning.
    `intercept` (E pinned): held at that value, the other coefficients fitted to loss - E.
    Returns (coefficients, the intercept first, and the residual sum of squares).
    """
    powers = [np.exp(-e * lx) for e, lx in zip(exponents, columns_log)]
    design = np.column_stack(([np.ones_like(loss)] if intercept is None else []) + powers)
    target = loss if intercept is None else loss - intercept
    if weights is not None:  # weighted least squares: rows scaled by sqrt(weight)
        root = np.sqrt(weights)
        design, target = design * root[:, None], target * root
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    coef, rnorm = nnls(design / scale, target)
    coef = coef / scale
    return (coef if intercept is None else np.concatenate([[intercept], coef])), float(rnorm**2)


def vpnls_arrays(
    log_n: np.ndarray,
    log_d: np.ndarray,
    loss: np.ndarray,
    start: tuple[float, float] | None = None,
    weights: np.ndarray | None = None,
    E: float | None = None,
) -> dict[str, Any]:
    """VPNLS: (alpha, beta) searched, (E, A, B) >= 0 by NNLS; `E` given: held there (pinned)."""
    cols = [log_n, log_d]

    def rss(x: np.ndarray) -> float:
        if not (EXPONENT_BOUNDS[0] <= x[0] <= EXPONENT_BOUNDS[1] and EXPONENT_BOUNDS[0] <= x[1] <= EXPONENT_BOUNDS[1]):
            return np.inf
        return nnls_coefficients(tuple(x), cols, loss, weights, intercept=E)[1]

    with BlasThreads(1):  # NNLS on 240 x 3: BLAS threads only add wake-up latency
        if start is None:
            grid = [(al, be) for al in VPNLS_GRID for be in VPNLS_GRID]
            start = grid[int(np.argmin([rss(np.array(g)) for g in grid]))]
        res = minimize(
            rss,
            np.array(start, float),
            method="Nelder-Mead",
            options=NELDER_MEAD_OPTIONS,
        )
    alpha, beta = (float(v) for v in res.x)
    (E, A, B), value = nnls_coefficients((alpha, beta), cols, loss, weights, intercept=E)
    return {
        "params": {"E": float(E), "A": float(A), "B": float(B), "alpha": alpha, "beta": beta},
        "rss": value,
        "converged": bool(res.success),
        "n_evaluations": int(res.nfev),
    }


def vpnls_prior_arrays(
    log_n: np.ndarray,
    log_d: np.ndarray,
    loss: np.ndarray,
    prior: EPrior,
    scale: float,
    starts: list[tuple[float, float, float]],
    weights: np.ndarray | None = None,
) -> dict[str, Any]:
    """The maximum a posteriori VPNLS fit under a Gaussian prior on E (delphi.fits.e_prior):
    (alpha, beta, E) searched by Nelder-Mead from each start, (A, B) >= 0 by NNLS on loss - E,
    objective RSS + scale x ((E - mean) / sd)^2; the best start kept."""
    cols, upper = [log_n, log_d], float(loss.min())

    def objective(x: np.ndarray) -> float:
        if not (
            EXPONENT_BOUNDS[0] <= x[0] <= EXPONENT_BOUNDS[1]
            and EXPONENT_BOUNDS[0] <= x[1] <= EXPONENT_BOUNDS[1]
            and 0.0 <= x[2] < upper
        ):
            return np.inf
        return nnls_coefficients(tuple(x[:2]), cols, loss, weights, intercept=float(x[2]))[1] + scale * prior.z2(x[2])

    with BlasThreads(1):
        best = min(
            (
                minimize(objective, np.array(x0, float), method="Nelder-Mead", options=NELDER_MEAD_OPTIONS)
                for x0 in starts
            ),
            key=lambda r: r.fun,
        )
    alpha, beta, e = (float(v) for v in best.x)
    (E, A, B), value = nnls_coefficients((alpha, beta), cols, loss, weights, intercept=e)
    return {
        "params": {"E": float(E), "A": float(A), "B": float(B), "alpha": alpha, "beta": beta},
        "rss": value,
        "objective": float(best.fun),
        "converged": bool(best.success),
        "n_evaluations": int(best.nfev),
    }
