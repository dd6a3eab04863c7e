"""Backtest: fit on the lower budgets, predict the held-out higher ones.

The honest measure of extrapolation (docs/design.md §6.2). For each held-out
budget the truth is the lowest observed loss there (the best cell, seeds
averaged); the prediction is the fitted law's best achievable loss at that
compute, allocated under the fit's FLOPs family (exact) when it has one, so the
predicted point costs the budget (`predicted_point_flops`). For laws in (N, D)
every held-out run is also predicted from its own N and D. Relative error =
predicted / observed - 1.

The 90% interval is predictive: the fit's bootstrap interval of L*(C) (which
carries seed noise when the table has seeds: the bootstrap is hierarchical)
widened, side by side in quadrature, by z_0.95 x the training residual scatter
(RMS of best observed minus predicted L* over the training budgets, 2 dof
removed). The residual term is there because the truth is one observed best
cell, not the law's mean: without it a point with no bootstrap, or a tight
bootstrap, gets an interval that cannot cover. `covered_90` says whether it did;
`all_holdouts` measures coverage over many held-out budgets.

`probe_holdouts` backtests a correction: the law's error at the first budgets
above the cut (the probes), linear in log C (`delphi.fits.probes.ProbeTrend`),
carried to the budgets beyond them. Imports run one way: this module imports
the probes' trend and the intervals (`delphi.fits.intervals`), neither imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.allocation import FlopsFamily, flops_of
from delphi.fits.data import cell_points
from delphi.fits.intervals import predictive_interval
from delphi.fits.probes import probe_trend
from delphi.fits.results import FitResult

LEVEL = 0.90
MIN_TRAIN_BUDGETS = 3  # all-holdouts: every budget above the third is held out in turn
RESIDUAL_DOF = 2  # the training residual scatter removes 2 dof (as for a 2-parameter L*(C) line)


def split_by_budget(
    table: pd.DataFrame, cut: float | None = None, holdout: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Train on budgets < cut (default: hold out the top `holdout` budgets)."""
    if "budget" not in table:
        raise DelphiError("backtest: the table has no budget column")
    budgets = np.sort(table["budget"].unique())
    if cut is None:
        if holdout < 1 or holdout >= len(budgets):
            raise DelphiError(f"backtest: holdout = {holdout} of {len(budgets)} budget(s); need 1 <= holdout < budgets")
        cut = float(budgets[-holdout])
    train, test = table[table["budget"] < cut], table[table["budget"] >= cut]
    if train.empty or test.empty:
        raise DelphiError(
            f"backtest: cut {cut:.4g} leaves {len(train)} training and {len(test)} held-out rows; both must be non-empty"
        )
    train = train.reset_index(drop=True)
    train.attrs = dict(table.attrs)
    # An anchor rung trained on more compute than the cut would tell the fit about the held-out budget.
    train.attrs["anchor_rows"] = [r for r in table.attrs.get("anchor_rows") or [] if r["flops"] < cut]
    return train, test.reset_index(drop=True), float(cut)


def _covered(interval: list[float] | tuple[float, float] | None, truth: float) -> bool | None:
    if interval is None or interval[0] is None or interval[1] is None:
        return None
    return bool(interval[0] <= truth <= interval[1])


def best_per_budget(table: pd.DataFrame) -> pd.DataFrame:
    """Per budget: the best cell (lowest seed-averaged loss), its params and seed count."""
    points, _ = cell_points(table)
    idx = points.groupby("budget", sort=True)["loss"].idxmin()
    return points.loc[idx, ["budget", "loss", "params", "n_seeds"]].reset_index(drop=True)


def residual_scatter(fit: FitResult, train: pd.DataFrame) -> float | None:
    """RMS (nats) of best observed minus predicted L* over the training budgets, RESIDUAL_DOF removed."""
    best = best_per_budget(train)
    residuals = []
    for budget, loss in zip(best["budget"], best["loss"]):
        try:
            pred = fit.predict(compute=float(budget))["loss"]
        except DelphiError:
            return None
        if pred is None or not np.isfinite(pred):
            return None
        residuals.append(loss - pred)
    r = np.asarray(residuals, float)
    return float(np.sqrt(np.sum(r**2) / max(len(r) - RESIDUAL_DOF, 1))) if len(r) else None


def backtest(
    table: pd.DataFrame,
    fit_fn: Callable[[pd.DataFrame], FitResult],
    *,
    cut: float | None = None,
    holdout: int = 1,
    family: FlopsFamily | None = None,
    predict_budgets: list[float] | None = None,
) -> dict[str, Any]:
    """Fit on budgets below the cut, predict each held-out budget (or only `predict_budgets`).

    `family` (default: the table's, from load_results) is attached to the fit, so held-out
    budgets are scored at their real cost."""
    family = family if family is not None else table.attrs.get("flops_family")
    train, test, cut = split_by_budget(table, cut, holdout)
    fit = fit_fn(train)
    if family is not None:
        fit = fit.with_family(family)
    scatter = residual_scatter(fit, train)
    budgets = []
    best = best_per_budget(test)
    train_top = float(train["budget"].max())
    for budget, truth, best_params, n_seeds in best.itertuples(index=False):
        if predict_budgets is not None and not any(np.isclose(budget, b, rtol=1e-9) for b in predict_budgets):
            continue
        pred = fit.predict(compute=float(budget))
        if pred["loss"] is None:  # e.g. A or B fitted to 0: the law has no compute-optimal point
            raise DelphiError(
                f"backtest: the {fit.kind} fit on budgets <= {cut:g} has no compute-optimal "
                f"point (parameters {fit.params}); it cannot predict budget {budget:g}"
            )
        interval = predictive_interval(pred["loss"], pred.get("loss_interval_90"), scatter)
        n_star, d_star = pred.get("params"), pred.get("tokens")
        cost = float(flops_of(family, n_star, d_star)) if n_star is not None and d_star is not None else None
        budgets.append(
            {
                "budget": float(budget),
                "extrapolation": float(budget) / train_top,
                "observed_best_loss": float(truth),
                "observed_best_seeds": int(n_seeds),
                "predicted_loss": pred["loss"],
                "rel_error": pred["loss"] / truth - 1,
                "loss_interval_90": list(interval) if interval else None,
                "fit_interval_90": pred.get("loss_interval_90"),
                "covered_90": _covered(interval, truth),
                "predicted_params": n_star,
                "predicted_tokens": d_star,
                "predicted_point_flops": cost,
                "predicted_point_cost_rel": None if cost is None else cost / float(budget) - 1,
                "allocation": pred.get("allocation"),
                "observed_best_params": float(best_params),
            }
        )
    runs = []
    if fit.law_in_nd:
        for _, row in test.iterrows():
            terms = {term: row[term] for term in fit.law_terms}
            pred = fit.predict(params=row["params"], tokens=row["tokens"], **terms)
            runs.append(
                {
                    "run_id": row.get("run_id"),
                    "budget": float(row["budget"]),
                    "params": float(row["params"]),
                    "tokens": float(row["tokens"]),
                    "observed_loss": float(row["loss"]),
                    "predicted_loss": float(pred["loss"]),
                    "rel_error": float(pred["loss"] / row["loss"] - 1),
                    "covered_90": _covered(pred.get("loss_interval_90"), float(row["loss"])),
                }
            )
    covered = [b["covered_90"] for b in budgets if b["covered_90"] is not None]
    result = {
        "kind": "backtest",
        "method": fit.method,
        "cut": cut,
        "train_budgets": sorted(float(b) for b in train["budget"].unique()),
        "n_train_points": len(train),
        "fit_params": fit.params,
        "fit_status": str(fit.status),  # the plain string (a str enum on the fit)
        "at_bound": list(fit.diagnostics.at_bound),
        "allocation": fit.allocation,
        "flops_family_source": None if family is None else family.source,
        "residual_scatter_nats": scatter,
        "seed_noise_nats": fit.diagnostics.seed_noise_nats,
        "interval": "bootstrap 90% of L*(C) widened in quadrature by z_0.95 x training residual scatter"
        if fit.samples
        else "L*(C) +- z_0.95 x training residual scatter (no bootstrap)",
        "budgets": budgets,
        "runs": runs,
        "mean_abs_rel_error": float(np.mean([abs(b["rel_error"]) for b in budgets])) if budgets else None,
        "max_abs_rel_error": float(np.max([abs(b["rel_error"]) for b in budgets])) if budgets else None,
        "coverage_90": (sum(covered) / len(covered)) if covered else None,
        "input_sha256": table.attrs.get("sha256"),
    }
    if runs:
        result["runs_mean_abs_rel_error"] = float(np.mean([abs(r["rel_error"]) for r in runs]))
    return result


def all_holdouts(
    table: pd.DataFrame,
    fit_fns: dict[str, Callable[[pd.DataFrame], FitResult]],
    *,
    min_train_budgets: int = MIN_TRAIN_BUDGETS,
    family: FlopsFamily | None = None,
    one_step: bool = False,
) -> dict[str, Any]:
    """Every budget above the `min_train_budgets`-th held out in turn, for every method.

    For each cut k >= min_train_budgets the fit uses budgets[:k] and predicts every higher
    budget (`one_step=True`: only budgets[k]). A fit that fails at a cut is recorded as an
    error row. Returns {"rows": [...], "summary": {method: {n, mean_abs_rel_error, coverage_90,
    ...}}}."""
    if "budget" not in table:
        raise DelphiError("backtest: the table has no budget column")
    budgets = np.sort(table["budget"].unique())
    if len(budgets) <= min_train_budgets:
        raise DelphiError(f"backtest --all-holdouts: {len(budgets)} budget(s); need more than {min_train_budgets}")
    rows: list[dict[str, Any]] = []
    for method, fit_fn in fit_fns.items():
        for k in range(min_train_budgets, len(budgets)):
            targets = [float(budgets[k])] if one_step else [float(b) for b in budgets[k:]]
            try:
                result = backtest(table, fit_fn, cut=float(budgets[k]), family=family, predict_budgets=targets)
            except (DelphiError, ValueError, ArithmeticError, np.linalg.LinAlgError) as e:
                rows.append({"method": method, "cut": float(budgets[k]), "error": f"{type(e).__name__}: {e}"})
                continue
            for b in result["budgets"]:
                rows.append(
                    {
                        "method": method,
                        "cut": float(budgets[k]),
                        "n_train_budgets": k,
                        "budget": b["budget"],
                        "extrapolation": b["extrapolation"],
                        "observed_best_loss": b["observed_best_loss"],
                        "predicted_loss": b["predicted_loss"],
                        "rel_error": b["rel_error"],
                        "lo_90": None if b["loss_interval_90"] is None else b["loss_interval_90"][0],
                        "hi_90": None if b["loss_interval_90"] is None else b["loss_interval_90"][1],
                        "covered_90": b["covered_90"],
                        "allocation": b["allocation"],
                        "predicted_point_cost_rel": b["predicted_point_cost_rel"],
                        "fit_status": result["fit_status"],
                    }
                )
    return {
        "kind": "backtest_all_holdouts",
        "rows": rows,
        "summary": summarise(rows),
        "budgets": [float(b) for b in budgets],
        "min_train_budgets": min_train_budgets,
        "input_sha256": table.attrs.get("sha256"),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: points scored, mean and median |error|, 90% coverage, and the same one step ahead."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method and "error" not in r]
        failed = sum(1 for r in rows if r["method"] == method and "error" in r)
        entry: dict[str, Any] = {"n": len(mine), "failed_fits": failed}
        for label, subset in (("", mine), ("one_step_", [r for r in mine if r["budget"] == _next_budget(r, mine)])):
            err = np.array([abs(r["rel_error"]) for r in subset], float)
            cov = [r["covered_90"] for r in subset if r["covered_90"] is not None]
            entry[f"{label}n"] = len(subset)
            entry[f"{label}mean_abs_rel_error"] = float(err.mean()) if len(err) else None
            entry[f"{label}median_abs_rel_error"] = float(np.median(err)) if len(err) else None
            entry[f"{label}coverage_90"] = float(np.mean(cov)) if cov else None
        out[method] = entry
    return out


def _next_budget(row: dict[str, Any], rows: list[dict[str, Any]]) -> float:
    """The lowest held-out budget predicted from this row's cut."""
    return min(r["budget"] for r in rows if r["method"] == row["method"] and r["cut"] == row["cut"])


# --------------------------------------------------------------------------- the probes' correction, backtested


def probe_holdouts(
    table: pd.DataFrame,
    fit_fn: Callable[[pd.DataFrame], FitResult],
    *,
    probes: int = 3,
    min_train_budgets: int = MIN_TRAIN_BUDGETS,
    tolerance: float = 0.03,
    family: FlopsFamily | None = None,
    carry: str = "linear",
) -> dict[str, Any]:
    """Backtest the probe-trend correction: for each cut with `probes` budgets above it and at least
    one more, fit below the cut, score the law at the first `probes` budgets above it (their best
    observed loss, as `backtest` scores a budget) and predict every budget beyond them, by the law
    alone and by the law corrected by its trend at the probes (`ProbeTrend.correct`; each probe's
    noise is the training residual scatter). Errors are predicted / observed - 1, as in `backtest`.
    "tested": `ProbeTrend.untested` finds nothing at that budget (gate probes' test of a corrected
    prediction); the summary scores all rows and the tested ones."""
    budgets = np.sort(table["budget"].unique())
    if probes < 2 or len(budgets) < min_train_budgets + probes + 1:
        raise DelphiError(
            f"backtest --probes {probes}: {len(budgets)} budget(s); need >= 2 probes and "
            f"{min_train_budgets} training budgets + the probes + 1"
        )
    rows: list[dict[str, Any]] = []
    for k in range(min_train_budgets, len(budgets) - probes):
        try:
            result = backtest(table, fit_fn, cut=float(budgets[k]), family=family)
        except (DelphiError, ValueError, ArithmeticError, np.linalg.LinAlgError) as e:
            rows.append({"cut": float(budgets[k]), "error": f"{type(e).__name__}: {e}"})
            continue
        scored = sorted(result["budgets"], key=lambda b: b["budget"])
        at_probes, targets = scored[:probes], scored[probes:]
        top = float(budgets[k - 1])
        trend = probe_trend(
            {
                f"{b['budget']:.4g}": {
                    "compute": b["budget"],
                    "rel_error": b["observed_best_loss"] / b["predicted_loss"] - 1,
                }
                for b in at_probes
            },
            top,
            carry,
        )
        noise_rel = (result["residual_scatter_nats"] or 0.0) / float(
            np.mean([b["observed_best_loss"] for b in at_probes])
        )
        tested = trend.leave_last_out()
        for b in targets:
            truth = b["observed_best_loss"]
            loss, interval = trend.correct(b["predicted_loss"], b["loss_interval_90"], b["budget"], noise_rel)
            rows.append(
                {
                    "cut": float(budgets[k]),
                    "n_train_budgets": k,
                    "budget": b["budget"],
                    "extrapolation": b["extrapolation"],
                    "beyond_last_probe": b["budget"] / at_probes[-1]["budget"],
                    "probe_budgets": [float(p["budget"]) for p in at_probes],
                    "probe_span": at_probes[-1]["budget"] / at_probes[0]["budget"],
                    "probe_errors": [float(e) for e in trend.errors],
                    "carried_rel": trend.at(b["budget"]),
                    "leave_last_out_rel_error": None if tested is None else tested[1],
                    "tested": not trend.untested(tolerance, b["budget"]),
                    "observed_best_loss": truth,
                    "law_loss": b["predicted_loss"],
                    "law_rel_error": b["rel_error"],
                    "law_covered_90": b["covered_90"],
                    "law_half_width_rel": _half_width_rel(b["loss_interval_90"], b["predicted_loss"]),
                    "corrected_loss": loss,
                    "corrected_rel_error": loss / truth - 1,
                    "corrected_half_width_rel": _half_width_rel(interval, loss),
                    "corrected_interval_90": None if interval is None else list(interval),
                    "corrected_covered_90": _covered(interval, truth),
                }
            )
    scored_rows = [r for r in rows if "error" not in r]
    summary = {
        label: _trend_summary(part)
        for label, part in (("all", scored_rows), ("tested", [r for r in scored_rows if r["tested"]]))
    }
    return {
        "kind": "backtest_probe_trend",
        "probes": probes,
        "carry": carry,
        "tolerance": tolerance,
        "rows": rows,
        "summary": summary,
        "failed_fits": len(rows) - len(scored_rows),
        "input_sha256": table.attrs.get("sha256"),
    }


def _half_width_rel(interval: Sequence[float] | None, loss: float) -> float | None:
    return None if interval is None else (float(interval[1]) - float(interval[0])) / 2 / loss


def _trend_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(values)) if values else None

    out: dict[str, Any] = {"n": len(rows)}
    for which in ("law", "corrected"):
        out[f"{which}_mean_abs_rel_error"] = (
            float(np.mean([abs(r[f"{which}_rel_error"]) for r in rows])) if rows else None
        )
        out[f"{which}_coverage_90"] = mean(f"{which}_covered_90")
        out[f"{which}_mean_half_width_rel"] = mean(f"{which}_half_width_rel")
    out["corrected_better"] = (
        float(np.mean([abs(r["corrected_rel_error"]) < abs(r["law_rel_error"]) for r in rows])) if rows else None
    )
    return out
