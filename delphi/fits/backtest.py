"""Backtest: fit on the lower budgets, predict the held-out higher ones.

The honest measure of extrapolation (DESIGN.md section 6). For each held-out
budget the truth is the lowest observed loss there (the best run); the
prediction is the fitted law's best achievable loss at that compute. For laws
in (N, D) every held-out run is also predicted from its own N and D. Relative
error = predicted / observed - 1; with a bootstrap, whether the 90% interval
covered the truth.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.results import FitResult


def split_by_budget(table: pd.DataFrame, cut: float | None = None, holdout: int = 1) -> tuple[pd.DataFrame, pd.DataFrame, float]:
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
        raise DelphiError(f"backtest: cut {cut:.4g} leaves {len(train)} training and {len(test)} held-out rows; both must be non-empty")
    train = train.reset_index(drop=True)
    train.attrs = dict(table.attrs)
    return train, test.reset_index(drop=True), float(cut)


def _covered(pred: dict[str, Any], truth: float) -> bool | None:
    lo_hi = pred.get("loss_interval_90")
    if lo_hi is None or lo_hi[0] is None:
        return None
    return bool(lo_hi[0] <= truth <= lo_hi[1])


def backtest(
    table: pd.DataFrame,
    fit_fn: Callable[[pd.DataFrame], FitResult],
    *,
    cut: float | None = None,
    holdout: int = 1,
) -> dict[str, Any]:
    train, test, cut = split_by_budget(table, cut, holdout)
    fit = fit_fn(train)
    budgets = []
    for budget, g in test.groupby("budget", sort=True):
        truth = float(g["loss"].min())
        pred = fit.predict(compute=float(budget))
        if pred["loss"] is None:  # e.g. A or B fitted to 0: the law has no compute-optimal point
            raise DelphiError(f"backtest: the {fit.kind} fit on budgets <= {cut:g} has no compute-optimal "
                              f"point (parameters {fit.params}); it cannot predict budget {budget:g}")
        budgets.append(
            {
                "budget": float(budget),
                "observed_best_loss": truth,
                "predicted_loss": pred["loss"],
                "rel_error": pred["loss"] / truth - 1,
                "loss_interval_90": pred.get("loss_interval_90"),
                "covered_90": _covered(pred, truth),
                "predicted_params": pred.get("params"),
                "observed_best_params": float(g.loc[g["loss"].idxmin(), "params"]),
            }
        )
    runs = []
    if fit.kind in ("parametric", "moe"):
        for _, row in test.iterrows():
            terms = {fit.extra["term"]: row[fit.extra["term"]]} if fit.kind == "moe" else {}
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
                    "covered_90": _covered(pred, float(row["loss"])),
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
        "budgets": budgets,
        "runs": runs,
        "mean_abs_rel_error": float(np.mean([abs(b["rel_error"]) for b in budgets])),
        "max_abs_rel_error": float(np.max([abs(b["rel_error"]) for b in budgets])),
        "coverage_90": (sum(covered) / len(covered)) if covered else None,
        "input_sha256": table.attrs.get("sha256"),
    }
    if runs:
        result["runs_mean_abs_rel_error"] = float(np.mean([abs(r["rel_error"]) for r in runs]))
    return result
