"""MoE scaling law in active parameters with a granularity (or expert-count) term.

    L(N, D, X) = E + (G / X^gamma + A) / N^alpha + B / D^beta

N = active non-embedding parameters, D = tokens, X = granularity (d_ff / d_expert,
Krajewski et al. 2024, "Scaling Laws for Fine-Grained Mixture of Experts", eq. 4,
whose c, g, a, b are E, G, A, B here) or, with term="experts", the number of routed
experts.

Why this form:
- It contains D, so a compute-optimal allocation N*(C), D*(C) at a given X follows in
  closed form (it is the Chinchilla law with A_eff = G X^-gamma + A); an expert-count
  law at fixed tokens (Clark et al. 2022) cannot allocate compute.
- At G = 0, or at a single X, it reduces to the dense Chinchilla law, so a dense ladder
  and an MoE ladder are fitted by the same code and compared parameter by parameter.
- For fixed exponents (alpha, beta, gamma) it is linear in (E, G, A, B) >= 0, so the
  same variable projection as VPNLS applies: NNLS inside, a 3-D search outside
  (grid, then Nelder-Mead). The saturating X^-gamma term matches the observation that
  returns from finer granularity (or more experts) diminish.
Fitted by least squares on the loss, like VPNLS. Needs at least 2 distinct X values
(else gamma and G are not identifiable: use a parametric fit).
"""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pandas as pd
from scipy.optimize import minimize, nnls

from delphi.errors import DelphiError, quoted
from delphi.fits.bootstrap import bootstrap
from delphi.fits.data import cell_points, check_points, provenance, with_anchors
from delphi.fits.results import FitResult, fit_status, percentile_intervals, table_context

EXPONENT_BOUNDS = (0.01, 2.5)
GRID = {"alpha": np.linspace(0.05, 1.2, 16), "beta": np.linspace(0.05, 1.2, 16), "gamma": np.linspace(0.05, 1.5, 10)}
NELDER_MEAD_OPTIONS = {"xatol": 1e-10, "fatol": 1e-15, "maxiter": 10_000}
TERMS = ("granularity", "experts")


def _design(x: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    alpha, beta, gamma = x
    n_term = np.exp(-alpha * log_n)
    return np.column_stack([np.ones_like(log_n), np.exp(-gamma * log_x) * n_term, n_term, np.exp(-beta * log_d)])


def _solve(
    x: np.ndarray,
    log_n: np.ndarray,
    log_d: np.ndarray,
    log_x: np.ndarray,
    loss: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    design = _design(x, log_n, log_d, log_x)
    if weights is not None:  # weighted least squares (seed-averaged points)
        root = np.sqrt(weights)
        design, loss = design * root[:, None], loss * root
    scale = np.linalg.norm(design, axis=0)
    coef, rnorm = nnls(design / scale, loss)
    return coef / scale, float(rnorm**2)


def moe_arrays(log_n, log_d, log_x, loss, start=None, weights=None) -> dict[str, float]:
    def rss(x: np.ndarray) -> float:
        if not all(EXPONENT_BOUNDS[0] <= v <= EXPONENT_BOUNDS[1] for v in x):
            return np.inf
        return _solve(x, log_n, log_d, log_x, loss, weights)[1]

    if start is None:
        grid = list(itertools.product(GRID["alpha"], GRID["beta"], GRID["gamma"]))
        start = grid[int(np.argmin([rss(np.array(g)) for g in grid]))]
    res = minimize(rss, np.array(start, float), method="Nelder-Mead", options=NELDER_MEAD_OPTIONS)
    (E, G, A, B), value = _solve(res.x, log_n, log_d, log_x, loss, weights)
    alpha, beta, gamma = (float(v) for v in res.x)
    return {
        "E": float(E),
        "G": float(G),
        "A": float(A),
        "B": float(B),
        "alpha": alpha,
        "beta": beta,
        "gamma": gamma,
        "_rss": value,
        "_converged": bool(res.success),
    }


def _arrays(table: pd.DataFrame, term: str):
    return (
        np.log(table["params"].to_numpy(float)),
        np.log(table["tokens"].to_numpy(float)),
        np.log(table[term].to_numpy(float)),
        table["loss"].to_numpy(float),
    )


def _moe_refit(table: pd.DataFrame, term: str, start: tuple[float, float, float]) -> dict[str, float]:
    points, _ = cell_points(with_anchors(table))
    out = moe_arrays(*_arrays(points, term), start=start, weights=points["weight"].to_numpy(float))
    return {k: v for k, v in out.items() if not k.startswith("_")}


def fit_moe(
    table: pd.DataFrame, *, term: str = "granularity", n_bootstrap: int = 0, seed: int = 0, workers: int | None = None
) -> FitResult:
    if term not in TERMS:
        raise DelphiError(f"moe: term = {quoted(term)}, expected one of {TERMS}")
    if term not in table:
        raise DelphiError(f"moe: the table has no {quoted(term)} column (map one with --{term}-col)")
    points, seeds = cell_points(with_anchors(table))
    check_points(points, 8, "moe")
    if table[term].nunique() < 2:
        raise DelphiError(
            f"moe: every point has {term} = {table[term].iloc[0]:.4g}; need at least 2 distinct values "
            f"(with one, fit the dense law: delphi fit vpnls)"
        )
    out = moe_arrays(*_arrays(points, term), weights=points["weight"].to_numpy(float))
    params = {k: v for k, v in out.items() if not k.startswith("_")}
    n, d, x = (points[c].to_numpy(float) for c in ("params", "tokens", term))
    pred = (
        params["E"]
        + (params["G"] * x ** -params["gamma"] + params["A"]) * n ** -params["alpha"]
        + params["B"] * d ** -params["beta"]
    )
    loss = points["loss"].to_numpy(float)
    at_bound = [k for k in ("E", "G", "A", "B") if params[k] == 0.0]
    at_bound += [k for k in ("alpha", "beta", "gamma") if min(abs(params[k] - b) for b in EXPONENT_BOUNDS) < 1e-6]
    diagnostics = {
        "at_bound": at_bound,
        **seeds,
        "rss": out["_rss"],
        "converged": out["_converged"],
        "term": term,
        "rmse_log": float(np.sqrt(np.mean(np.log(pred / loss) ** 2))),
        "mean_abs_rel_error": float(np.mean(np.abs(pred / loss - 1))),
        **provenance(table),
    }
    fit = FitResult(
        kind="moe",
        method="vpnls-granularity" if term == "granularity" else "vpnls-experts",
        params=params,
        diagnostics=diagnostics,
        extra={"term": term},
        input_sha256=table.attrs.get("sha256"),
        n_points=len(points),
        seed=seed,
        status=fit_status(out["_converged"], at_bound),
        **table_context(table),
    )
    if n_bootstrap:
        refit = partial(_moe_refit, term=term, start=(params["alpha"], params["beta"], params["gamma"]))
        samples, info = bootstrap(refit, table, n_bootstrap, seed, workers=workers)
        fit.samples = samples
        fit.intervals = percentile_intervals(samples)
        fit.diagnostics = fit.diagnostics.merged(info)
    return fit
