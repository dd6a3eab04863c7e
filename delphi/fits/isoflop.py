"""Approach 1 (lower envelope) and Approach 2 (isoFLOP parabolas) of Hoffmann et al. 2022.

Approach 2: at each compute budget fit loss as a parabola in ln N (and separately in
ln D), take the vertex as that budget's optimum N*, D*, L* with a delta-method standard
error from the parabola's covariance, then fit N* = N0 C^a, D* = D0 C^b and
L* = L0 C^l by OLS in log10 space (statsmodels), with 90% confidence intervals.

Known bias (Open-Athena, scaling-law-analysis; docs/design.md §6.1): the loss along an
isoFLOP curve is not a parabola in ln N. With L = E + A N^-alpha + B D^-beta and
alpha != beta its third derivative at the optimum is K (beta^2 - alpha^2) against a
second derivative K (alpha + beta), so on a grid symmetric in ln N about the true
optimum the fitted vertex moves by a constant of sign (alpha - beta): N* is
overestimated when alpha > beta. The shift is the same at every budget when the grid
has the same width and number of points, so the exponent a survives and the intercept
N0 is biased; a grid whose centre drifts with budget biases a as well. Report
Approach 2 beside a parametric fit, do not rely on it alone.

Approach 1 (lower envelope): a point is on the envelope if no point with at most its
compute reached a lower loss. With intermediate checkpoints in the table this is
Hoffmann's Approach 1; with final losses only it is the running minimum of loss over
compute. N and D of the envelope points are fitted against C by OLS in log space.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm

from delphi.errors import DelphiError
from delphi.fits.allocation import PARAM_CONVENTIONS
from delphi.fits.bootstrap import bootstrap
from delphi.fits.data import TableOptions, cell_points, load_results, provenance
from delphi.fits.results import FitResult, percentile_intervals, table_context

MIN_POINTS_PER_BUDGET = 3  # a parabola has three coefficients
# What an isoFLOP fit's bootstrap resamples with seeds in the table (delphi.fits.bootstrap.RESAMPLE_MODES):
# cells within each budget, then seeds within each cell -- the resample whose 90% width matched the
# spread between ladders of one design (ratio 0.87 over the default study's 10 ladders); keeping the
# design and resampling seeds understated it 3.3x (benchmarks/default_study/bootstrap_ratio.csv).
ISOFLOP_RESAMPLE = "cells"
CI_LEVEL = 0.90


def budget_groups(table: pd.DataFrame, method: str) -> list[tuple[float, pd.DataFrame]]:
    if "budget" not in table:
        raise DelphiError(f"{method}: the table has no budget column and budgets were not derived")
    groups = [(float(b), g) for b, g in table.groupby("budget", sort=True)]
    for budget, g in groups:
        if len(g) < MIN_POINTS_PER_BUDGET:
            raise DelphiError(
                f"{method}: budget {budget:.4g} has {len(g)} point(s), need at least {MIN_POINTS_PER_BUDGET} "
                f"for a parabola (drop it with --query 'budget != {budget!r}')"  # repr: exactly this budget
            )
        if g["params"].nunique() < MIN_POINTS_PER_BUDGET:
            raise DelphiError(
                f"{method}: budget {budget:.4g} has only {g['params'].nunique()} distinct params value(s), "
                f"need at least {MIN_POINTS_PER_BUDGET}"
            )
    if len(groups) < 2:
        only = f" ({groups[0][0]:.4g})" if groups else ""
        raise DelphiError(f"{method}: {len(groups)} compute budget{only}, need at least 2 to fit N* ~ C^a")
    return groups


def parabola_vertex(
    x: np.ndarray, loss: np.ndarray, robust: bool = False, weights: np.ndarray | None = None
) -> dict[str, float]:
    """Fit loss = c0 + c1 u + c2 u^2 with u = x - mean(x); return the vertex and its SEs.

    SEs are by the delta method from the coefficient covariance. `robust` uses Huber's T
    (statsmodels RLM) instead of least squares; `weights` (seed-averaged points, 1 / SE^2 up
    to a constant) make it weighted least squares.
    """
    centre = float(x.mean())
    u = x - centre
    design = np.column_stack([np.ones_like(u), u, u * u])
    if robust:
        model = sm.RLM(loss, design, M=sm.robust.norms.HuberT())
    elif weights is not None and not np.all(weights == 1.0):
        model = sm.WLS(loss, design, weights=weights)
    else:
        model = sm.OLS(loss, design)
    res = model.fit()
    c0, c1, c2 = res.params
    if not c2 > 0:
        return {"convex": False}
    cov = np.asarray(res.cov_params()) if len(x) > 3 else np.full((3, 3), np.nan)
    u_star = -c1 / (2 * c2)
    l_star = c0 - c1 * c1 / (4 * c2)
    grad_u = np.array([0.0, -1 / (2 * c2), c1 / (2 * c2 * c2)])
    grad_l = np.array([1.0, -c1 / (2 * c2), c1 * c1 / (4 * c2 * c2)])
    return {
        "convex": True,
        "x": centre + u_star,
        "x_se": float(np.sqrt(grad_u @ cov @ grad_u)),
        "loss": float(l_star),
        "loss_se": float(np.sqrt(grad_l @ cov @ grad_l)),
        "inside": bool(x.min() <= centre + u_star <= x.max()),
        "curvature": float(c2),
    }


def near_optimum_cells(table: pd.DataFrame, factor: float) -> pd.DataFrame:
    """The cells (seed-averaged points, `cell_points`) within `factor` of their budget's optimal N:
    the vertex of the parabola in ln N over the cell means where it is convex and inside the sampled
    range, else the best cell. What the hero's depth is checked against (gate hero_depth)."""
    points, _ = cell_points(table)
    near = []
    for _, g in points.groupby("budget", sort=True):
        ln_n = np.log(g["params"].to_numpy(float))
        loss = g["loss"].to_numpy(float)
        optimum = ln_n[int(np.argmin(loss))]
        if g["params"].nunique() >= MIN_POINTS_PER_BUDGET:
            v = parabola_vertex(ln_n, loss)
            if v["convex"] and v["inside"]:
                optimum = float(v["x"])
        near.append(g[np.abs(ln_n - optimum) <= np.log(factor) + 1e-12])
    return pd.concat(near, ignore_index=True) if near else points.iloc[:0]


def per_budget_optima(
    table: pd.DataFrame, robust: bool = False, method: str = "approach2"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Parabola vertices per budget, on the seed-averaged points (one per cell) of `table`."""
    optima, skipped = [], []
    points, _ = cell_points(table)
    for budget, g in budget_groups(points, method):
        ln_n = np.log(g["params"].to_numpy(float))
        ln_d = np.log(g["tokens"].to_numpy(float))
        loss = g["loss"].to_numpy(float)
        weights = g["weight"].to_numpy(float)
        vn = parabola_vertex(ln_n, loss, robust, weights)
        vd = parabola_vertex(ln_d, loss, robust, weights)
        if not (vn["convex"] and vd["convex"]):
            skipped.append({"budget": budget, "reason": "parabola not convex (no interior minimum)"})
            continue
        optima.append(
            {
                "budget": budget,
                "flops": float(np.exp(np.log(g["flops"].to_numpy(float)).mean())),
                "n_points": len(g),
                "params_opt": float(np.exp(vn["x"])),
                "params_opt_se_ln": vn["x_se"],
                "tokens_opt": float(np.exp(vd["x"])),
                "tokens_opt_se_ln": vd["x_se"],
                "loss_opt": vn["loss"],
                "loss_opt_se": vn["loss_se"],
                "curvature_ln_n": vn["curvature"],
                "vertex_inside_sampled_range": vn["inside"] and vd["inside"],
                "best_observed_loss": float(loss.min()),
            }
        )
    if len(optima) < 2:
        raise DelphiError(
            f"{method}: only {len(optima)} budget(s) with a convex parabola "
            f"(skipped: {[s['budget'] for s in skipped]}); need at least 2"
        )
    return optima, skipped


def power_law_ols(log10_c: np.ndarray, log10_y: np.ndarray) -> dict[str, Any]:
    """log10 y = intercept + slope log10 C by OLS; 90% intervals when there are spare points."""
    res = sm.OLS(log10_y, sm.add_constant(log10_c)).fit()
    intercept, slope = (float(v) for v in res.params)
    if len(log10_c) > 2:
        ci = np.asarray(res.conf_int(alpha=1 - CI_LEVEL))
        intervals = {"intercept": (float(ci[0, 0]), float(ci[0, 1])), "slope": (float(ci[1, 0]), float(ci[1, 1]))}
        r2 = float(res.rsquared)
    else:
        intervals, r2 = {}, float("nan")
    return {"intercept": intercept, "slope": slope, "intervals": intervals, "r2": r2}


def _laws_from_points(
    flops: np.ndarray, n_opt: np.ndarray, d_opt: np.ndarray, l_opt: np.ndarray
) -> tuple[dict[str, float], dict[str, tuple[float, float]], dict[str, float]]:
    lc = np.log10(flops)
    fits = {
        "N": power_law_ols(lc, np.log10(n_opt)),
        "D": power_law_ols(lc, np.log10(d_opt)),
        "L": power_law_ols(lc, np.log10(l_opt)),
    }
    params = {
        "a": fits["N"]["slope"],
        "b": fits["D"]["slope"],
        "loss_exponent": fits["L"]["slope"],
        "log10_N0": fits["N"]["intercept"],
        "log10_D0": fits["D"]["intercept"],
        "log10_L0": fits["L"]["intercept"],
    }
    names = {"N": ("a", "log10_N0"), "D": ("b", "log10_D0"), "L": ("loss_exponent", "log10_L0")}
    intervals: dict[str, tuple[float, float]] = {}
    for key, (slope_name, intercept_name) in names.items():
        if fits[key]["intervals"]:
            intervals[slope_name] = fits[key]["intervals"]["slope"]
            intervals[intercept_name] = fits[key]["intervals"]["intercept"]
    r2 = {f"r2_{k}": fits[k]["r2"] for k in fits}
    return params, intervals, r2


def _approach2_params(table: pd.DataFrame, robust: bool) -> dict[str, float]:
    optima, _ = per_budget_optima(table, robust)
    return _laws_from_points(*_optima_arrays(optima))[0]


def _optima_arrays(optima: list[dict[str, Any]]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([o[k] for o in optima]) for k in ("budget", "params_opt", "tokens_opt", "loss_opt"))


def curvature_law(optima: list[dict[str, Any]]) -> dict[str, float] | None:
    """The isoFLOP parabolas' curvature in ln N (nats per (ln N)^2) as a power law in C, K(C) =
    10^log10_K0 C^exponent, by OLS over the budgets; None with fewer than 2 budgets that have one.

    Why a law and not the top budget's value: the curvature falls with C, so a run off N* beyond the
    ladder costs less than the top budget's parabola says."""
    known = [o for o in optima if o.get("curvature_ln_n", 0) > 0]
    if len(known) < 2:
        return None
    law = power_law_ols(np.log10([o["flops"] for o in known]), np.log10([o["curvature_ln_n"] for o in known]))
    return {"log10_K0": law["intercept"], "exponent": law["slope"], "n_budgets": len(known)}


def fit_approach2(
    table: pd.DataFrame,
    *,
    robust: bool = False,
    n_bootstrap: int = 0,
    seed: int = 0,
    workers: int | None = None,
    resample: str = ISOFLOP_RESAMPLE,
) -> FitResult:
    optima, skipped = per_budget_optima(table, robust)
    params, ols_intervals, r2 = _laws_from_points(*_optima_arrays(optima))
    points, seeds = cell_points(table)
    diagnostics = {
        "at_bound": [],
        **seeds,
        "n_budgets": len(optima),
        "n_budgets_skipped": len(skipped),
        "parabola_loss": "huber" if robust else "least_squares",
        "vertices_outside_sampled_range": sum(not o["vertex_inside_sampled_range"] for o in optima),
        "interval": "OLS 90% confidence interval (statsmodels)",
        **r2,
        **provenance(table),
    }
    fit = FitResult(
        kind="isoflop",
        method="approach2",
        params=params,
        intervals=ols_intervals,
        diagnostics=diagnostics,
        extra={
            "optima": optima,
            "skipped_budgets": skipped,
            "ols_intervals": ols_intervals,
            "curvature_law": curvature_law(optima),
        },
        input_sha256=table.attrs.get("sha256"),
        n_points=len(points),
        seed=seed,
        **table_context(table),
    )
    if n_bootstrap:
        samples, info = bootstrap(
            partial(_approach2_params, robust=robust),
            table,
            n_bootstrap,
            seed,
            strata="budget",
            resample=resample,
            workers=workers,
        )
        fit.samples = samples
        fit.intervals = percentile_intervals(samples)
        fit.diagnostics = fit.diagnostics.merged(info)
    return fit


def envelope_points(table: pd.DataFrame) -> pd.DataFrame:
    """Cells (seed-averaged) not beaten by any cell with at most their compute (running minimum of loss over C)."""
    ordered = cell_points(table)[0].sort_values(["flops", "loss"], kind="stable")
    running = np.minimum.accumulate(ordered["loss"].to_numpy())
    keep = ordered["loss"].to_numpy() <= running
    # a point equal to an earlier minimum adds nothing
    keep &= np.concatenate([[True], np.diff(running) < 0])
    return ordered[keep]


def _approach1_params(table: pd.DataFrame) -> dict[str, float]:
    env = envelope_points(table)
    if len(env) < 3:
        raise DelphiError(f"approach1: only {len(env)} point(s) on the lower envelope, need at least 3")
    return _laws_from_points(*(env[k].to_numpy(float) for k in ("flops", "params", "tokens", "loss")))[0]


def fit_approach1(table: pd.DataFrame, *, n_bootstrap: int = 0, seed: int = 0, workers: int | None = None) -> FitResult:
    env = envelope_points(table)
    if len(env) < 3:
        raise DelphiError(f"approach1: only {len(env)} point(s) on the lower envelope, need at least 3")
    if env["params"].nunique() < 2:
        raise DelphiError("approach1: every envelope point has the same params; N* ~ C^a is not identifiable")
    params, intervals, r2 = _laws_from_points(*(env[k].to_numpy(float) for k in ("flops", "params", "tokens", "loss")))
    diagnostics = {
        "n_envelope_points": len(env),
        "at_bound": [],
        **cell_points(table)[1],
        "interval": "OLS 90% confidence interval (statsmodels)",
        **r2,
        **provenance(table),
    }
    fit = FitResult(
        kind="envelope",
        method="approach1",
        params=params,
        intervals=intervals,
        diagnostics=diagnostics,
        extra={"frontier_points": env[["flops", "params", "tokens", "loss"]].to_dict(orient="records")},
        input_sha256=table.attrs.get("sha256"),
        n_points=len(table),
        seed=seed,
        **table_context(table),
    )
    if n_bootstrap:
        samples, info = bootstrap(_approach1_params, table, n_bootstrap, seed, workers=workers)
        fit.samples = samples
        fit.intervals = percentile_intervals(samples)
        fit.diagnostics = fit.diagnostics.merged(info)
    return fit


def isoflop_exponent_by_convention(
    raw: pd.DataFrame, conventions: tuple[str, ...] = PARAM_CONVENTIONS, options: TableOptions | None = None
) -> dict[str, dict[str, Any]]:
    """The isoFLOP (Approach 2) exponent a of N* ~ C^a under each parameter-count convention.

    `raw` is a ladder results table (with params_nonembedding, params_active and flops/tokens
    columns). Returns {convention: {"a": ..., "a_interval_90": (lo, hi), "n_budgets": ...}};
    a convention the table cannot express gets {"error": message}.
    """
    out: dict[str, dict[str, Any]] = {}
    for convention in conventions:
        try:
            table = load_results(raw, options, params_convention=convention)
            fit = fit_approach2(table)
        except DelphiError as e:
            out[convention] = {"error": str(e)}
            continue
        out[convention] = {
            "a": fit.params["a"],
            "a_interval_90": fit.intervals.get("a"),
            "n_budgets": fit.diagnostics.n_budgets,
            "mapped": bool(table.attrs.get("params_mapped")),
        }
    return out
