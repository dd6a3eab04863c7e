"""Compute frontier L*(C) = E + A C^-gamma, with the asymptote E free, fixed or profiled.

Points: the best loss at each budget, either the lowest observed loss ("min", the
envelope) or the isoFLOP parabola vertex ("vertex", from Approach 2).

All three modes minimise the same least-squares objective on the loss:
- free: for fixed gamma the law is linear in (E, A) >= 0 (NNLS), so only gamma is
  searched (variable projection, as in VPNLS);
- fixed: E is given (e.g. pinned by hand as Marin did); A by non-negative least
  squares for each gamma, gamma searched;
- profiled: RSS(E) = min over (A, gamma) with E fixed, on a grid of E from 0 to just
  below the lowest loss. The estimate is the profile minimum and its 90% interval is
  the likelihood-ratio set n ln(RSS(E)/RSS_min) <= chi2_1(0.90).

Whatever the mode, the fit records how the prediction at the target compute moves
with E (`sensitivity`: prediction at every E of the profile grid, and dL/dE at the
estimate): free fits of the asymptote are known to be optimistic, so a reader must
see how much of the prediction E carries.

The asymptotic frontier law (`fit_asymptotic`, `delphi fit asymptotic`) is this law, exactly
L*(C) = E + A C^-alpha (alpha is stored as `gamma`, the frontier kind's name), with E free,
fitted to the isoFLOP parabola vertices ("vertex" points) by weighted least squares: each
vertex weighs 1 / sigma^2 with sigma^2 = its delta-method standard error (the analytic
counterpart of the vertex's bootstrap spread) + the seed variance of one cell mean (pooled
within-cell sd^2 / seeds, when the table has replicates). A vertex whose parabola passes
through its points (SE ~ 0, or NaN with exactly 3 points) gets the median sigma of the others,
so no budget takes all the weight.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar, nnls
from scipy.stats import chi2

from delphi.errors import DelphiError, quoted
from delphi.fits.bootstrap import bootstrap
from delphi.fits.data import cell_points, provenance
from delphi.fits.e_prior import REFIT_FREE, EPrior, check_below_loss, noise_scale, pinned_refits, record
from delphi.fits.isoflop import per_budget_optima
from delphi.fits.results import FitResult, fit_status, percentile_intervals, table_context

GAMMA_GRID = np.geomspace(1e-3, 2.0, 60)
E_PROFILE_POINTS = 41
E_MAX_FRACTION = 0.999  # E must stay below the lowest observed loss
PROFILE_LEVEL = 0.90
MIN_BUDGETS = 3


def vertex_sigma(
    optima: list[dict[str, Any]], seed_noise_nats: float | None, seeds_per_cell: float = 1.0
) -> np.ndarray:
    """Per vertex: sqrt(delta-method SE^2 + seed variance of one cell mean); a zero or missing SE
    takes the median of the others (see the module docstring)."""
    se = np.array([o.get("loss_opt_se", np.nan) for o in optima], float)
    ok = np.isfinite(se) & (se > 0)
    fill = float(np.median(se[ok])) if ok.any() else 0.0
    se = np.where(ok, se, fill)
    seed_var = (seed_noise_nats or 0.0) ** 2 / max(seeds_per_cell, 1.0)
    return np.sqrt(se**2 + seed_var)


def frontier_points(table: pd.DataFrame, points: str = "min", with_sigma: bool = False):
    """(compute, best loss) per budget; with `with_sigma`, (compute, loss, sigma) where sigma is the
    vertex's uncertainty (`vertex_sigma`; "vertex" points only)."""
    sigma = None
    if points == "vertex":
        optima, _ = per_budget_optima(table, method="frontier")
        compute = np.array([o["budget"] for o in optima])
        loss = np.array([o["loss_opt"] for o in optima])
        if with_sigma:
            info = cell_points(table)[1]
            sigma = vertex_sigma(optima, info.get("seed_noise_nats"), float(info.get("seeds_per_cell_max") or 1))
    elif points == "min":
        if "budget" not in table:
            raise DelphiError("frontier: the table has no budget column")
        best = cell_points(table)[0].groupby("budget", sort=True)["loss"].min()  # best seed-averaged cell
        compute, loss = best.index.to_numpy(float), best.to_numpy(float)
    else:
        raise DelphiError(f"frontier: points = {quoted(points)}, expected 'min' or 'vertex'")
    if len(compute) < MIN_BUDGETS:
        raise DelphiError(f"frontier: {len(compute)} budget(s), need at least {MIN_BUDGETS} for E + A C^-gamma")
    if with_sigma:
        if sigma is None or not np.all(sigma > 0):
            sigma = np.ones_like(loss)  # no vertex uncertainty: equal weights
        return compute, loss, sigma
    return compute, loss


def _fit_given_gamma(
    gamma: float, log_c: np.ndarray, loss: np.ndarray, E: float | None, w: np.ndarray | None = None
) -> tuple[float, float, float]:
    """(E, A, rss) for a fixed gamma; E solved by NNLS when None. `w`: per-point 1/sigma (the rss
    is then the weighted sum of squares)."""
    w = np.ones_like(loss) if w is None else w
    col = np.exp(-gamma * log_c)
    scale = np.linalg.norm(w * col)
    if E is None:
        coef, rnorm = nnls(np.column_stack([w, w * col / scale]), w * loss)
        return float(coef[0]), float(coef[1] / scale), float(rnorm**2)
    y = loss - E
    A = max(0.0, float((w * y) @ (w * col)) / float((w * col) @ (w * col)))
    return E, A, float(np.sum((w * (y - A * col)) ** 2))


def fit_frontier_arrays(
    compute: np.ndarray, loss: np.ndarray, E: float | None = None, sigma: np.ndarray | None = None
) -> dict[str, float]:
    """Least squares (weighted by 1/sigma^2 when given) of E + A C^-gamma."""
    log_c = np.log(compute)
    w = None if sigma is None else 1.0 / np.asarray(sigma, float)
    rss = lambda g: _fit_given_gamma(g, log_c, loss, E, w)[2]
    values = [rss(g) for g in GAMMA_GRID]
    i = int(np.argmin(values))
    lo, hi = GAMMA_GRID[max(i - 1, 0)], GAMMA_GRID[min(i + 1, len(GAMMA_GRID) - 1)]
    res = minimize_scalar(rss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
    gamma = float(res.x) if res.fun <= values[i] else float(GAMMA_GRID[i])
    E_fit, A, value = _fit_given_gamma(gamma, log_c, loss, E, w)
    return {"E": E_fit, "A": A, "gamma": gamma, "rss": value}


def e_profile(
    compute: np.ndarray, loss: np.ndarray, targets: np.ndarray, sigma: np.ndarray | None = None
) -> list[dict[str, Any]]:
    grid = np.linspace(0.0, E_MAX_FRACTION * loss.min(), E_PROFILE_POINTS)
    rows = []
    for E in grid:
        f = fit_frontier_arrays(compute, loss, E=float(E), sigma=sigma)
        pred = f["E"] + f["A"] * targets ** -f["gamma"]
        rows.append({"E": float(E), "A": f["A"], "gamma": f["gamma"], "rss": f["rss"], "predicted_loss": pred.tolist()})
    return rows


def fit_frontier_prior(
    compute: np.ndarray, loss: np.ndarray, prior: EPrior, scale: float, sigma: np.ndarray | None = None
) -> dict[str, float]:
    """The maximum a posteriori frontier under a Gaussian prior on E (delphi.fits.e_prior): RSS(E)
    profiled over (A, gamma), plus scale x ((E - mean) / sd)^2, minimised over E in [0, the lowest
    loss) on the profile grid, then between its grid neighbours."""
    objective = lambda e: fit_frontier_arrays(compute, loss, E=float(e), sigma=sigma)["rss"] + scale * prior.z2(e)  # noqa: E731
    grid = np.linspace(0.0, E_MAX_FRACTION * loss.min(), E_PROFILE_POINTS)
    values = [objective(e) for e in grid]
    i = int(np.argmin(values))
    res = minimize_scalar(
        objective,
        bounds=(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]),
        method="bounded",
        options={"xatol": 1e-10},
    )
    e = float(res.x) if res.fun <= values[i] else float(grid[i])
    fit = fit_frontier_arrays(compute, loss, E=e, sigma=sigma)
    return fit | {"objective": fit["rss"] + scale * prior.z2(e)}


def _frontier_refit(
    table: pd.DataFrame,
    points: str,
    E: float | None,
    weighted: bool = False,
    prior: EPrior | None = None,
    scale: float | None = None,
) -> dict[str, float]:
    if weighted:
        compute, loss, sigma = frontier_points(table, points, with_sigma=True)
    else:
        (compute, loss), sigma = frontier_points(table, points), None
    if prior is not None and not prior.pinned:
        f = fit_frontier_prior(compute, loss, prior, scale, sigma)
    else:
        f = fit_frontier_arrays(compute, loss, E=E, sigma=sigma)
    return {"E": f["E"], "A": f["A"], "gamma": f["gamma"]}


def fit_frontier(
    table: pd.DataFrame,
    *,
    E: str | float = "free",
    points: str = "min",
    target_compute: list[float] | None = None,
    n_bootstrap: int = 0,
    seed: int = 0,
    workers: int | None = None,
    weighted: bool = False,
    with_sensitivity: bool = True,
    E_prior: EPrior | None = None,
) -> FitResult:
    """`E`: "free", "profile", or a number (fixed asymptote). `weighted`: weigh each point by
    1/sigma^2 of its vertex (`vertex_sigma`; needs points="vertex"). `with_sensitivity=False` skips
    the E profile and the sensitivity table (41 refits; a backtest needs neither). `E_prior`
    (delphi.fits.e_prior.EPrior): E pinned (as a number `E`), or the maximum a posteriori fit under
    a Gaussian prior on E (method "frontier-prior"); either way the fit records the prior and the
    law refitted with E free (and, for a prior, at E = mean -+ sd) in `extra["E_prior"]`."""
    if weighted and points != "vertex":
        raise DelphiError(
            f"frontier: weighted fits need points = 'vertex' (the vertices carry an uncertainty), got {points!r}"
        )
    compute, loss, sigma = frontier_points(table, points, with_sigma=True)
    sigma = sigma if weighted else None
    targets = np.asarray(target_compute if target_compute else [10 * compute.max()], float)
    if isinstance(E, str) and E not in ("free", "profile"):
        try:
            E = float(E)
        except ValueError:
            raise DelphiError(f"frontier: E = {quoted(E)}, expected 'free', 'profile' or a number") from None
    if not isinstance(E, str) and not 0 <= E < loss.min():
        raise DelphiError(f"frontier: fixed E = {E} must be in [0, lowest loss {loss.min():.4g})")
    if E_prior is not None:
        if E != "free":
            raise DelphiError(
                f"frontier: E = {quoted(E)} and an E prior ({E_prior.describe()}) contradict each other; give one"
            )
        check_below_loss(E_prior, float(loss.min()), "frontier")
        if E_prior.pinned:
            E = float(E_prior.mean)
    elif not isinstance(E, str):
        E_prior = EPrior(float(E))

    profile = e_profile(compute, loss, targets, sigma) if (with_sensitivity or E == "profile") else []
    scale = None  # s2 of a prior's objective (delphi.fits.e_prior)
    n = len(compute)
    if E == "profile":
        # Refine the profile minimum between its grid neighbours.
        i = int(np.argmin([r["rss"] for r in profile]))
        lo, hi = profile[max(i - 1, 0)]["E"], profile[min(i + 1, len(profile) - 1)]["E"]
        res = minimize_scalar(
            lambda e: fit_frontier_arrays(compute, loss, E=e, sigma=sigma)["rss"],
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-10},
        )
        fit = fit_frontier_arrays(compute, loss, E=float(res.x), sigma=sigma)
        mode, fixed_E = "profile", float(res.x)
    elif E == "free" and E_prior is not None:  # a Gaussian prior on E: the maximum a posteriori fit
        scale = noise_scale(
            fit_frontier_arrays(compute, loss, sigma=sigma)["rss"], len(compute), 3, "frontier --E-prior"
        )
        fit = fit_frontier_prior(compute, loss, E_prior, scale, sigma)
        mode, fixed_E = "prior", None
    elif E == "free":
        fit = fit_frontier_arrays(compute, loss, sigma=sigma)
        mode, fixed_E = "free", None
    else:
        fit = fit_frontier_arrays(compute, loss, E=float(E), sigma=sigma)
        mode, fixed_E = "fixed", float(E)
    params = {"E": fit["E"], "A": fit["A"], "gamma": fit["gamma"]}

    sensitivity: dict[str, Any] | None = None
    e_interval = (float("nan"), float("nan"))
    if profile:  # skipped on request (backtests need only the point and its scatter)
        # Likelihood-ratio set for E from the profile (Gaussian errors, one parameter).
        rss_min = min(min(r["rss"] for r in profile), fit["rss"]) if mode != "fixed" else min(r["rss"] for r in profile)
        cut = chi2.ppf(PROFILE_LEVEL, 1)
        inside = [r["E"] for r in profile if n * np.log(max(r["rss"], 1e-300) / max(rss_min, 1e-300)) <= cut]
        if mode != "fixed":
            inside.append(params["E"])  # the estimate is in its own interval (matters when RSS -> 0)
        e_interval = (min(inside), max(inside)) if inside else (float("nan"), float("nan"))
        preds = np.array([r["predicted_loss"] for r in profile])  # (E grid, targets)
        in_set = np.array([r["E"] in inside for r in profile])
        point_pred = params["E"] + params["A"] * targets ** -params["gamma"]
        # dL/dE at the estimate from the profile (finite difference over the nearest grid points)
        grid_E = np.array([r["E"] for r in profile])
        j = int(np.clip(np.searchsorted(grid_E, params["E"]), 1, len(grid_E) - 1))
        slope = (preds[j] - preds[j - 1]) / (grid_E[j] - grid_E[j - 1])
        sensitivity = {
            "target_compute": targets.tolist(),
            "predicted_loss": point_pred.tolist(),
            "dloss_dE": slope.tolist(),
            "E_interval_profile_90": list(e_interval),
            "predicted_loss_range_over_E_interval": [
                [float(preds[in_set, k].min()), float(preds[in_set, k].max())] if in_set.any() else [None, None]
                for k in range(len(targets))
            ],
        }
    resid = loss - (params["E"] + params["A"] * compute ** -params["gamma"])
    weights_note = (
        {"weights": "1/sigma^2 of the vertices (delta-method SE + seed noise)", "vertex_sigma_nats": sigma.tolist()}
        if sigma is not None
        else {}
    )
    at_bound = []
    if mode in ("free", "prior") and params["E"] <= 0:
        at_bound.append("E")
    if params["A"] <= 0:
        at_bound.append("A")
    if min(abs(params["gamma"] - GAMMA_GRID[0]), abs(params["gamma"] - GAMMA_GRID[-1])) < 1e-9 * GAMMA_GRID[-1]:
        at_bound.append("gamma")
    diagnostics = {
        "at_bound": at_bound,
        **cell_points(table)[1],
        "e_mode": mode,
        "points": points,
        "n_budgets": n,
        "rss": fit["rss"],
        "max_abs_rel_residual": float(np.abs(resid / loss).max()),
        **weights_note,
        **provenance(table),
    }
    intervals = {"E": e_interval} if mode == "profile" else {}
    result = FitResult(
        kind="frontier",
        method=f"frontier-{mode}" + ("-weighted" if sigma is not None else ""),
        params=params,
        intervals=intervals,
        diagnostics=diagnostics,
        extra={
            "e_mode": mode,
            "frontier_points": [
                {"flops": float(c), "loss": float(l)} | ({} if sigma is None else {"sigma": float(s)})
                for c, l, s in zip(compute, loss, sigma if sigma is not None else loss)
            ],
            "E_profile": profile,
            "sensitivity": sensitivity,
            **({"E_prior": _prior_record(E_prior, scale, compute, loss, sigma)} if E_prior is not None else {}),
        },
        input_sha256=table.attrs.get("sha256"),
        n_points=len(table),
        seed=seed,
        status=fit_status(True, at_bound),
        **table_context(table),
    )
    if n_bootstrap:
        refit = partial(
            _frontier_refit,
            points=points,
            E=fixed_E if mode == "fixed" else None,
            weighted=sigma is not None,
            prior=E_prior,
            scale=scale,
        )
        samples, info = bootstrap(refit, table, n_bootstrap, seed, strata="budget", workers=workers)
        result.samples = samples
        boot = percentile_intervals(samples)
        if mode == "profile":
            boot["E"] = e_interval  # the profile interval is the one this mode is for
        result.intervals = boot
        result.diagnostics = result.diagnostics.merged(info)
    return result


def _prior_record(
    prior: EPrior, scale: float | None, compute: np.ndarray, loss: np.ndarray, sigma: np.ndarray | None
) -> dict[str, Any]:
    """extra["E_prior"] of a frontier fit: the prior, its scale and the law refitted with E free and
    at E = mean -+ sd (delphi.fits.e_prior)."""
    keep = lambda f: {"E": f["E"], "A": f["A"], "gamma": f["gamma"]}  # noqa: E731
    refits = {REFIT_FREE: keep(fit_frontier_arrays(compute, loss, sigma=sigma))}
    for name, e in pinned_refits(prior, E_MAX_FRACTION * float(loss.min())).items():
        refits[name] = keep(fit_frontier_arrays(compute, loss, E=e, sigma=sigma))
    return record(prior, scale, refits)


def fit_asymptotic(
    table: pd.DataFrame,
    *,
    target_compute: list[float] | None = None,
    n_bootstrap: int = 0,
    seed: int = 0,
    workers: int | None = None,
    with_sensitivity: bool = True,
    E_prior: EPrior | None = None,
) -> FitResult:
    """The asymptotic frontier law L*(C) = E + A C^-alpha through the isoFLOP vertices, E free,
    weighted by the vertices' uncertainty (module docstring). A frontier fit, method
    "frontier-free-weighted"; its bootstrap resamples within budgets (seed noise included when the
    table has replicates: the bootstrap is hierarchical). `E_prior`: E pinned ("frontier-fixed-weighted")
    or a Gaussian prior on it ("frontier-prior-weighted"), as `fit_frontier`."""
    return fit_frontier(
        table,
        E="free",
        points="vertex",
        weighted=True,
        target_compute=target_compute,
        n_bootstrap=n_bootstrap,
        seed=seed,
        workers=workers,
        with_sensitivity=with_sensitivity,
        E_prior=E_prior,
    )
