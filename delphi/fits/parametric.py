"""Parametric law L(N, D) = E + A/N^alpha + B/D^beta: Approach 3 and VPNLS.

Approach 3 (Hoffmann et al. 2022, as repaired by Besiroglu et al. 2024):
    log L = logsumexp(a - alpha log N, b - beta log D, e),  A = e^a, B = e^b, E = e^e,
    objective = SUM of Huber(delta = 1e-3) of the log-loss residuals (averaging makes
    L-BFGS-B stop early), minimised by L-BFGS-B with an analytic gradient from Epoch's
    grid of starts. The problem is badly conditioned, hence the grid. The objective is
    evaluated on the whole grid at once (one vectorised pass) and L-BFGS-B runs from the
    best `top_starts` grid points, which reach the full-grid search's minimum
    (`tests/test_fits_parametric.py::test_top_starts_match_full_grid`, marked slow).

Bootstrap refits (`bootstrap_starts="warm"`, the default) skip the grid: each resample is
refitted by L-BFGS-B from the full-data optimum and from `len(PERTURBED_STARTS)` starts
displaced from it along the E-exponent ridge, keeping the best, which reaches the
per-resample grid fit's minimum (`bootstrap_starts="grid"`; `benchmarks/fits.py --compare`).
All Approach 3 and VPNLS work runs with one BLAS thread (delphi.fits.blas): scipy's L-BFGS-B
calls BLAS on 5-vectors, where waking OpenBLAS's thread pool costs more than the work.

VPNLS (variable projection + non-negative least squares, delphi.fits.vpnls): for fixed
(alpha, beta) the law is linear in (E, A, B) >= 0, solved exactly by NNLS; only (alpha, beta)
is searched, on a grid then by Nelder-Mead. Least squares on the loss itself.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy.optimize import minimize

from delphi.errors import DelphiError, quoted
from delphi.fits.blas import BlasThreads
from delphi.fits.bootstrap import bootstrap
from delphi.fits.data import cell_points, check_points, provenance, with_anchors
from delphi.fits.e_prior import REFIT_FREE, EPrior, check_below_loss, noise_scale, pinned_refits, record
from delphi.fits.laws import derived_quantities
from delphi.fits.results import FitResult, fit_status, percentile_intervals, table_context
from delphi.fits.vpnls import EXPONENT_BOUNDS, vpnls_arrays, vpnls_prior_arrays

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, Appendix D.2; Besiroglu et al. 2024
# Epoch's grid of L-BFGS-B starts (Besiroglu et al. 2024; github.com/epoch-research/analyzing-chinchilla).
EPOCH_GRID = {
    "a": np.arange(0, 30, 5.0),
    "b": np.arange(0, 30, 5.0),
    "e": np.arange(-1, 1.5, 0.5),
    "alpha": np.arange(0, 2.5, 0.5),
    "beta": np.arange(0, 2.5, 0.5),
}
TOP_STARTS = 20
LBFGS_OPTIONS = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000}
# Bootstrap refits start at the full-data optimum; in the centred coordinates these looser
# tolerances reach the same minimum to ~6 digits in ~30% less time.
BOOTSTRAP_LBFGS_OPTIONS = {"ftol": 1e-12, "gtol": 1e-9, "maxiter": 10_000}
PARAM_NAMES = ("E", "A", "B", "alpha", "beta")
# Extra bootstrap starts, as offsets from the full-data optimum in centred coordinates
# (a_c, b_c, e, alpha, beta): the centred intercepts are kept, so each start predicts the
# data's centre as well as the optimum does, and moves along the ridge where a higher E trades
# against steeper exponents (the direction of the problem's local minima). The offsets are
# ~5 bootstrap standard errors of alpha and beta on the Epoch data (0.02, Besiroglu et al. 2024).
PERTURBED_STARTS = np.array([[0.0, 0.0, -0.1, -0.1, -0.1], [0.0, 0.0, 0.05, 0.1, 0.1]])
BOOTSTRAP_START_MODES = ("warm", "grid")


# --------------------------------------------------------------------------- Approach 3
def log_loss_prediction(theta: Float[np.ndarray, "*starts 5"], log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """logsumexp(a - alpha log N, b - beta log D, e); theta = (a, b, e, alpha, beta)."""
    theta = np.asarray(theta, float)
    a, b, e, alpha, beta = (theta[..., i, None] for i in range(5))
    terms = np.stack(np.broadcast_arrays(a - alpha * log_n, b - beta * log_d, e + 0 * log_n))
    return np.logaddexp.reduce(terms, axis=0)


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def stacked_design(log_n: Float[np.ndarray, " n"], log_d: Float[np.ndarray, " n"]) -> Float[np.ndarray, "3n 5"]:
    """Rows of the three logsumexp terms as linear maps of theta = (a, b, e, alpha, beta):
    design @ theta = [a - alpha log N; b - beta log D; e], one matrix-vector product."""
    n = len(log_n)
    design = np.zeros((3, n, 5))
    design[0, :, 0], design[0, :, 3] = 1.0, -log_n
    design[1, :, 1], design[1, :, 4] = 1.0, -log_d
    design[2, :, 2] = 1.0
    return design.reshape(3 * n, 5)


def _huber_on_design(
    theta: Float[np.ndarray, "5"],
    design: Float[np.ndarray, "3n 5"],
    log_loss: Float[np.ndarray, " n"],
    weights: Float[np.ndarray, " n"] | None = None,
) -> tuple[float, np.ndarray]:
    """Summed (optionally weighted) Huber of log residuals and its analytic gradient, in ~15
    vectorised numpy calls (the optimiser's inner loop: it is called ~40 times per refit)."""
    z = (design @ theta).reshape(3, -1)
    zmax = z.max(axis=0)
    w = np.exp(z - zmax)
    total = w.sum(axis=0)
    r = zmax + np.log(total) - log_loss
    abs_r = np.abs(r)
    clipped = np.minimum(abs_r, HUBER_DELTA)
    # Huber(r) = c (|r| - c / 2) with c = min(|r|, delta); its derivative is sign(r) c.
    value = clipped @ (abs_r - 0.5 * clipped) if weights is None else (weights * clipped) @ (abs_r - 0.5 * clipped)
    if weights is not None:
        clipped = clipped * weights
    # d prediction / d z_k = softmax weight w_k / total
    grad = (w * (np.copysign(clipped, r) / total)).ravel() @ design
    return float(value), grad


def huber_objective(
    theta: Float[np.ndarray, "5"],
    log_n: np.ndarray,
    log_d: np.ndarray,
    log_loss: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[float, np.ndarray]:
    """Summed (optionally weighted: seed-averaged points) Huber of log residuals and its analytic gradient."""
    return _huber_on_design(np.asarray(theta, float), stacked_design(log_n, log_d), log_loss, weights)


def epoch_grid() -> np.ndarray:
    g = EPOCH_GRID
    return np.array(list(itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])), float)


def approach3_arrays(
    log_n: np.ndarray,
    log_d: np.ndarray,
    log_loss: np.ndarray,
    starts: np.ndarray | None = None,
    top_starts: int | None = TOP_STARTS,
    options: dict[str, Any] = LBFGS_OPTIONS,
    weights: np.ndarray | None = None,
    prior: EPrior | None = None,
    scale: float | None = None,
) -> dict[str, Any]:
    """Fit theta = (a, b, e, alpha, beta). `starts` defaults to Epoch's grid; L-BFGS-B runs
    from the `top_starts` starts with the lowest objective (all of them if None). `prior`
    (delphi.fits.e_prior.EPrior): E pinned (e held at log E), or the Huber sum plus
    `scale` x ((E - mean) / sd)^2, the maximum a posteriori fit under a Gaussian prior on E."""
    starts = epoch_grid() if starts is None else np.atleast_2d(np.asarray(starts, float))
    pinned = prior is not None and prior.pinned
    penalised = prior is not None and not prior.pinned
    if pinned:
        starts = starts.copy()
        starts[:, 2] = np.log(prior.mean)

    def penalty(e: np.ndarray) -> np.ndarray:
        return scale * ((np.exp(e) - prior.mean) / prior.sd) ** 2 if penalised else 0.0 * e

    if top_starts is not None and len(starts) > top_starts:
        # One vectorised pass over every start, in chunks to bound memory.
        values = np.concatenate(
            [
                (
                    huber(log_loss_prediction(chunk, log_n, log_d) - log_loss) * (1.0 if weights is None else weights)
                ).sum(axis=-1)
                + penalty(chunk[:, 2])
                for chunk in np.array_split(starts, max(1, len(starts) // 500))
            ]
        )
        starts = starts[np.argsort(values, kind="stable")[:top_starts]]
    # Optimise in centred coordinates: a - alpha log N = (a - alpha mean) - alpha (log N - mean).
    # Same objective and minimum, but it removes most of the a-alpha and b-beta correlation
    # that makes the problem ill-conditioned: L-BFGS-B then converges in ~40 iterations
    # instead of ~100 (and does not stop short of the minimum). e is the same coordinate in both.
    shift = centring(log_n, log_d)
    design = stacked_design(log_n - log_n.mean(), log_d - log_d.mean())

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = _huber_on_design(x, design, log_loss, weights)
        if penalised:
            e = float(np.exp(x[2]))
            value += scale * prior.z2(e)
            grad = grad.copy()
            grad[2] += scale * 2.0 * (e - prior.mean) / prior.sd**2 * e
        return value, grad

    bounds = [(None, None)] * 5
    if pinned:
        bounds[2] = (float(np.log(prior.mean)),) * 2
    best, objectives = None, []
    with BlasThreads(1):
        for x0 in starts @ shift.T:  # each start in centred coordinates
            res = minimize(
                objective, x0, jac=True, method="L-BFGS-B", options=options, bounds=bounds if pinned else None
            )
            objectives.append(res.fun)
            if best is None or res.fun < best.fun:
                best = res
    objectives = np.array(objectives)
    return {
        "theta": np.linalg.solve(shift, best.x),
        "objective": float(best.fun),
        "converged": bool(best.success),
        "n_starts": len(starts),
        # how many starts reached the best objective: a low count means a fragile optimum
        "n_starts_at_best": int((objectives <= best.fun * (1 + 1e-6) + 1e-300).sum()),
    }


def theta_to_params(theta: np.ndarray) -> dict[str, float]:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return {"E": float(np.exp(e)), "A": float(np.exp(a)), "B": float(np.exp(b)), "alpha": alpha, "beta": beta}


def params_to_theta(p: dict[str, float]) -> np.ndarray:
    return np.array([np.log(p["A"]), np.log(p["B"]), np.log(p["E"]), p["alpha"], p["beta"]])


def centring(log_n: np.ndarray, log_d: np.ndarray) -> Float[np.ndarray, "5 5"]:
    """theta -> centred coordinates (a - alpha mean log N, b - beta mean log D, e, alpha, beta)."""
    mean_n, mean_d = float(log_n.mean()), float(log_d.mean())
    return np.array(
        [[1, 0, 0, -mean_n, 0], [0, 1, 0, 0, -mean_d], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]], float
    )


def warm_starts(theta: Float[np.ndarray, "5"], log_n: np.ndarray, log_d: np.ndarray) -> Float[np.ndarray, "starts 5"]:
    """`theta` and the PERTURBED_STARTS around it (offsets applied in this data's centred coordinates)."""
    shift = centring(log_n, log_d)
    centred = shift @ np.asarray(theta, float)
    return np.linalg.solve(shift, np.vstack([centred, centred + PERTURBED_STARTS]).T).T


def _approach3_refit(
    table: pd.DataFrame,
    start: np.ndarray,
    starts: str = "warm",
    prior: EPrior | None = None,
    scale: float | None = None,
) -> dict[str, float]:
    """Bootstrap refit. "warm": L-BFGS-B from the full-data optimum `start` and the perturbed
    starts around it; "grid": the full fit's procedure (Epoch's grid, best TOP_STARTS), the slow
    reference the warm refit is checked against. `prior`, `scale`: the full fit's E prior."""
    points, _ = cell_points(with_anchors(table))
    log_n, log_d, log_loss = _log_arrays(points)
    if starts == "grid":
        out = approach3_arrays(log_n, log_d, log_loss, weights=_weights(points), prior=prior, scale=scale)
    else:
        out = approach3_arrays(
            log_n,
            log_d,
            log_loss,
            starts=warm_starts(start, log_n, log_d),
            top_starts=None,
            options=BOOTSTRAP_LBFGS_OPTIONS,
            weights=_weights(points),
            prior=prior,
            scale=scale,
        )
    return theta_to_params(out["theta"])


# --------------------------------------------------------------------------- VPNLS
def _vpnls_refit(
    table: pd.DataFrame, start: tuple[float, ...], prior: EPrior | None = None, scale: float | None = None
) -> dict[str, float]:
    points, _ = cell_points(with_anchors(table))
    log_n, log_d, _ = _log_arrays(points)
    loss = points["loss"].to_numpy(float)
    if prior is not None and not prior.pinned:
        return vpnls_prior_arrays(log_n, log_d, loss, prior, scale, [tuple(start)], _weights(points))["params"]
    return vpnls_arrays(
        log_n, log_d, loss, start=tuple(start[:2]), weights=_weights(points), E=None if prior is None else prior.mean
    )["params"]


def _weights(points: pd.DataFrame) -> np.ndarray | None:
    """Per-point weights of seed-averaged points; None when all are 1 (the unweighted fit)."""
    w = points["weight"].to_numpy(float) if "weight" in points else None
    return None if w is None or np.all(w == 1.0) else w


# E this small next to the lowest loss is E = 0 in effect: the asymptote sits on its lower bound.
E_AT_ZERO_REL = 1e-3


# --------------------------------------------------------------------------- public fits
def _log_arrays(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.log(table["params"].to_numpy(float)),
        np.log(table["tokens"].to_numpy(float)),
        np.log(table["loss"].to_numpy(float)),
    )


def residual_diagnostics(table: pd.DataFrame, p: dict[str, float]) -> dict[str, float]:
    pred = (
        p["E"]
        + p["A"] * table["params"].to_numpy(float) ** -p["alpha"]
        + p["B"] * table["tokens"].to_numpy(float) ** -p["beta"]
    )
    loss = table["loss"].to_numpy(float)
    log_r = np.log(pred) - np.log(loss)
    rel = pred / loss - 1
    return {
        "rmse_log": float(np.sqrt(np.mean(log_r**2))),
        "max_abs_log_residual": float(np.abs(log_r).max()),
        "mean_abs_rel_error": float(np.abs(rel).mean()),
        "r2": float(1 - np.sum((loss - pred) ** 2) / np.sum((loss - loss.mean()) ** 2)),
        # scatter of the points about the law (nats, per free parameter dof): the predictive term of backtest intervals
        "residual_std_nats": float(np.sqrt(np.sum((loss - pred) ** 2) / max(len(loss) - len(p), 1))),
    }


def _jacobian_condition(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> float:
    """Condition number of J^T J of the log-prediction in theta (Gauss-Newton Hessian)."""
    a, b, e, alpha, beta = theta
    z = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    w = np.exp(z - z.max(axis=0))
    w /= w.sum(axis=0)
    jac = np.column_stack([w[0], w[1], w[2], -w[0] * log_n, -w[1] * log_d])
    return float(np.linalg.cond(jac.T @ jac))


def _with_bootstrap(
    fit: FitResult, refit, table: pd.DataFrame, n_bootstrap: int, seed: int, workers: int | None
) -> FitResult:
    if n_bootstrap:
        samples, info = bootstrap(refit, table, n_bootstrap, seed, workers=workers)
        fit.samples = samples
        derived = [derived_quantities(fit.kind, dict(zip(samples, row))) for row in zip(*samples.values())]
        all_draws = dict(samples)
        for key in fit.derived:
            # a draw whose law has no optimum (alpha + beta <= 0) implies no exponent: left out of that interval
            all_draws[key] = [d[key] for d in derived if key in d]
            if len(all_draws[key]) < len(derived):
                info[f"bootstrap_draws_without_{key}"] = len(derived) - len(all_draws[key])
        fit.intervals = percentile_intervals({k: v for k, v in all_draws.items() if v}, 0.9)
        fit.diagnostics = fit.diagnostics.merged(info)
    return fit


def _check_prior(prior: EPrior | None, points: pd.DataFrame, method: str) -> None:
    if prior is None:
        return
    check_below_loss(prior, float(points["loss"].min()), method)
    if method == "approach3" and prior.pinned and prior.mean <= 0:
        raise DelphiError(
            "approach3: E pinned at 0; Approach 3 fits log E, so a pinned E must be > 0 "
            "(fit vpnls for a law with no asymptote)"
        )


def _at_bound(params: dict[str, float], points: pd.DataFrame, prior: EPrior | None, exponents: bool) -> list[str]:
    """Parameters on a bound of the search: an exponent at EXPONENT_BOUNDS (VPNLS) or a coefficient at 0;
    a pinned E is the lab's value, not a bound the fit ran into."""
    held = {"E"} if prior is not None and prior.pinned else set()
    out = [k for k in ("alpha", "beta") if exponents and min(abs(params[k] - b) for b in EXPONENT_BOUNDS) < 1e-6]
    return out + [
        k for k in ("E", "A", "B") if k not in held and params[k] < E_AT_ZERO_REL * float(points["loss"].min())
    ]


def fit_approach3(
    table: pd.DataFrame,
    *,
    n_bootstrap: int = 0,
    seed: int = 0,
    top_starts: int | None = TOP_STARTS,
    workers: int | None = None,
    bootstrap_starts: str = "warm",
    E_prior: EPrior | None = None,
) -> FitResult:
    """Approach 3 (see module docstring). `top_starts=None` runs L-BFGS-B from the full grid.
    `bootstrap_starts`: "warm" (default, fast) or "grid" (each resample fitted like the full data).
    `E_prior` (delphi.fits.e_prior.EPrior): E pinned (method "approach3-E-pinned") or a Gaussian
    prior on it ("approach3-E-prior"); recorded with the law refitted with E free and at E = mean -+ sd."""
    if bootstrap_starts not in BOOTSTRAP_START_MODES:
        raise DelphiError(
            f"fit_approach3: bootstrap_starts = {quoted(bootstrap_starts)}, expected one of {BOOTSTRAP_START_MODES}"
        )
    points, seeds = cell_points(with_anchors(table))
    check_points(points, 6, "approach3")
    _check_prior(E_prior, points, "approach3")
    log_n, log_d, log_loss = _log_arrays(points)
    weights = _weights(points)
    fit_at = lambda prior, scale=None: approach3_arrays(
        log_n,
        log_d,
        log_loss,
        top_starts=top_starts,  # noqa: E731
        weights=weights,
        prior=prior,
        scale=scale,
    )
    free = fit_at(None)
    scale = None
    if E_prior is not None and not E_prior.pinned:
        scale = noise_scale(free["objective"], len(points), len(PARAM_NAMES), "approach3 --E-prior")
    out = free if E_prior is None else fit_at(E_prior, scale)
    params = theta_to_params(out["theta"])
    at_bound = _at_bound(params, points, E_prior, exponents=False)
    diagnostics = {
        "at_bound": at_bound,
        **seeds,
        "objective_huber_sum": out["objective"],
        "huber_delta": HUBER_DELTA,
        "converged": out["converged"],
        "n_starts": out["n_starts"],
        "n_starts_at_best": out["n_starts_at_best"],
        "condition_number": _jacobian_condition(out["theta"], log_n, log_d),
        **residual_diagnostics(points, params),
        **provenance(table),
    }
    extra = {}
    if E_prior is not None:
        refits = {REFIT_FREE: theta_to_params(free["theta"])}
        for name, e in pinned_refits(E_prior, float(points["loss"].min())).items():
            if e > 0:
                refits[name] = theta_to_params(fit_at(EPrior(e))["theta"])
        extra["E_prior"] = record(E_prior, scale, refits)
    fit = FitResult(
        kind="parametric",
        method="approach3" + _prior_suffix(E_prior),
        params=params,
        diagnostics=diagnostics,
        extra=extra,
        input_sha256=table.attrs.get("sha256"),
        n_points=len(points),
        seed=seed,
        status=fit_status(out["converged"], at_bound),
        **table_context(table),
    )
    refit = partial(_approach3_refit, start=out["theta"], starts=bootstrap_starts, prior=E_prior, scale=scale)
    fit = _with_bootstrap(fit, refit, table, n_bootstrap, seed, workers)
    if n_bootstrap:
        starts = (
            f"warm: full-data optimum + {len(PERTURBED_STARTS)} perturbed"
            if bootstrap_starts == "warm"
            else f"grid: Epoch grid, best {top_starts}"
        )
        fit.diagnostics = fit.diagnostics.merged({"bootstrap_starts": starts})
    return fit


def _prior_suffix(prior: EPrior | None) -> str:
    """A fit with an E prior is another method ("vpnls-E-prior"): the public calibration, fitted on the
    laws with E free, has no entry for it."""
    return "" if prior is None else f"-E-{prior.mode}"


def fit_vpnls(
    table: pd.DataFrame,
    *,
    n_bootstrap: int = 0,
    seed: int = 0,
    workers: int | None = None,
    E_prior: EPrior | None = None,
) -> FitResult:
    """VPNLS (module docstring). `E_prior` (delphi.fits.e_prior.EPrior): E pinned (NNLS on loss - E,
    method "vpnls-E-pinned") or the maximum a posteriori fit under a Gaussian prior on E
    ("vpnls-E-prior", `vpnls_prior_arrays`); recorded with the law refitted with E free and at E = mean -+ sd."""
    points, seeds = cell_points(with_anchors(table))
    check_points(points, 6, "vpnls")
    _check_prior(E_prior, points, "vpnls")
    log_n, log_d, _ = _log_arrays(points)
    loss, weights = points["loss"].to_numpy(float), _weights(points)
    free = vpnls_arrays(log_n, log_d, loss, weights=weights)
    scale, out = None, free
    if E_prior is not None and E_prior.pinned:
        out = vpnls_arrays(log_n, log_d, loss, weights=weights, E=E_prior.mean)
    elif E_prior is not None:
        scale = noise_scale(free["rss"], len(points), len(PARAM_NAMES), "vpnls --E-prior")
        at_mean = vpnls_arrays(log_n, log_d, loss, weights=weights, E=E_prior.mean)["params"]
        starts = [
            (at_mean["alpha"], at_mean["beta"], E_prior.mean),
            (free["params"]["alpha"], free["params"]["beta"], free["params"]["E"]),
        ]
        out = vpnls_prior_arrays(log_n, log_d, loss, E_prior, scale, starts, weights)
    params = out["params"]
    at_bound = _at_bound(params, points, E_prior, exponents=True)
    diagnostics = {
        "rss": out["rss"],
        "converged": out["converged"],
        "n_evaluations": out["n_evaluations"],
        "at_bound": at_bound,
        **seeds,
        **residual_diagnostics(points, params),
        **provenance(table),
    }
    extra = {}
    if E_prior is not None:
        refits = {REFIT_FREE: free["params"]}
        for name, e in pinned_refits(E_prior, float(loss.min())).items():
            refits[name] = vpnls_arrays(log_n, log_d, loss, weights=weights, E=e)["params"]
        extra["E_prior"] = record(E_prior, scale, refits)
    fit = FitResult(
        kind="parametric",
        method="vpnls" + _prior_suffix(E_prior),
        params=params,
        diagnostics=diagnostics,
        extra=extra,
        input_sha256=table.attrs.get("sha256"),
        n_points=len(points),
        seed=seed,
        status=fit_status(out["converged"], at_bound),
        **table_context(table),
    )
    start = (params["alpha"], params["beta"], params["E"])
    refit = partial(_vpnls_refit, start=start, prior=E_prior, scale=scale)
    return _with_bootstrap(fit, refit, table, n_bootstrap, seed, workers)
