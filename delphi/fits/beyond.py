"""Backtests beyond the ladder: fit on the first k budgets, predict every higher budget's best loss.

`delphi fit backtest --beyond` (docs/design.md §6.2). For each k with at least
MIN_FITTED_BUDGETS fitted budgets the law is fitted on budgets[:k] and predicts the best loss of
every budget above (the best seed-averaged cell, as `backtest` scores a budget). Each prediction
records its extrapolation factor (held-out budget / largest fitted budget), its bin
(EXTRAPOLATION_BINS), its relative error (predicted / observed - 1) and its fit-only predictive
sd: the training residual scatter (`backtest.residual_scatter`), the analytic interval of a fit
without a bootstrap, so that the eight public sweeps run in seconds. Intervals that know how far
they extrapolate are built on this sd by `delphi.fits.calibration`.

A table with several sources (`--source-col`) is split into one sweep per source; each must have
at least MIN_SOURCE_BUDGETS budgets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.backtest import all_holdouts
from delphi.fits.intervals import Z_50, Z_90
from delphi.fits.isoflop import MIN_POINTS_PER_BUDGET
from delphi.fits.results import FitResult

MIN_FITTED_BUDGETS = 3  # the smallest fit: three budgets (E + A C^-alpha has three parameters)
MIN_SOURCE_BUDGETS = 2  # a source with one budget has nothing to extrapolate to
# (label, lowest factor, highest factor): the bins of extrapolation factor, upper bound included.
EXTRAPOLATION_BINS: tuple[tuple[str, float, float], ...] = (
    ("1-3x", 1.0, 3.0),
    ("3-10x", 3.0, 10.0),
    ("10-30x", 10.0, 30.0),
    (">30x", 30.0, math.inf),
)
BEYOND_METHODS = ("isoflop", "vpnls", "parametric", "frontier", "asymptotic")
# Ensembles scored beside the laws: name -> members; the prediction is the geometric mean of the
# members' predictions, its fit-only sd their mean. Why this pair: on every public source the
# isoFLOP law's error beyond the fit is optimistic and the parametric law's pessimistic (before
# calibration, 1-3x: -0.53% and +0.94%; 3-10x: -1.67% and +1.61%), so their mean cancels most of
# both. Chosen after seeing the public leave-one-source-out tables: its scores there are not a
# clean out-of-sample test of the choice (the calibration file says so).
ENSEMBLES = {"isoflop+parametric": ("isoflop", "parametric")}


def extrapolation_bin(factor: float) -> str:
    """The bin label of an extrapolation factor (> 1)."""
    for label, lo, hi in EXTRAPOLATION_BINS:
        if lo < factor <= hi:
            return label
    raise DelphiError(
        f"backtest --beyond: extrapolation factor {factor:g} is not > 1 (a held-out budget must lie above the fit)"
    )


def fittable_budgets(table: pd.DataFrame) -> np.ndarray:
    """Budgets with at least MIN_POINTS_PER_BUDGET distinct model sizes (a parabola can be fitted)."""
    if "budget" not in table:
        raise DelphiError("backtest --beyond: the table has no 'budget' column")
    counts = table.groupby("budget")["params"].nunique()
    return np.sort(counts[counts >= MIN_POINTS_PER_BUDGET].index.to_numpy(float))


def check_beyond_table(table: pd.DataFrame, where: str = "backtest --beyond") -> pd.DataFrame:
    """The table restricted to its fittable budgets; DelphiError when fewer than MIN_FITTED_BUDGETS + 1
    (three to fit, one to predict)."""
    budgets = fittable_budgets(table)
    if len(budgets) < MIN_FITTED_BUDGETS + 1:
        raise DelphiError(
            f"{where}: column 'budget' has {len(budgets)} fittable budget(s) (>= {MIN_POINTS_PER_BUDGET} distinct "
            f"params each); need {MIN_FITTED_BUDGETS} to fit and 1 above them to predict"
        )
    kept = table[table["budget"].isin(budgets)].reset_index(drop=True)
    kept.attrs = dict(table.attrs)
    return kept


def split_sources(
    raw: pd.DataFrame, columns: Sequence[str], load: Callable[[pd.DataFrame], pd.DataFrame] = lambda g: g
) -> list[tuple[str, pd.DataFrame]]:
    """One sweep per source: the rows of `raw` with the same values of `columns` (name: the values
    joined by '/'), each read by `load` (e.g. `load_results`). A source with fewer than
    MIN_SOURCE_BUDGETS budgets is bad input."""
    missing = [c for c in columns if c not in raw]
    if missing:
        raise DelphiError(f"backtest --beyond: --source-col {missing[0]!r} is not a column of the table")
    out = []
    for key, g in raw.groupby(list(columns), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        name = "/".join(str(k) for k in key if not (isinstance(k, float) and math.isnan(k)))
        table = load(g.reset_index(drop=True))
        n_budgets = table["budget"].nunique() if "budget" in table else 0
        if n_budgets < MIN_SOURCE_BUDGETS:
            raise DelphiError(
                f"backtest --beyond: source {name!r} (column {'/'.join(columns)!r}) has {n_budgets} budget "
                f"in column 'budget'; need >= {MIN_SOURCE_BUDGETS}"
            )
        out.append((name, table))
    return out


def sweep_features(table: pd.DataFrame) -> dict[str, float]:
    """What makes sweeps alike for method choice: model sizes (log10 of the median params) and the
    number of fittable budgets."""
    return {
        "log10_median_params": float(np.log10(table["params"].median())),
        "n_budgets": int(len(fittable_budgets(table))),
        "min_budget": float(table["budget"].min()),
        "max_budget": float(table["budget"].max()),
    }


def record_features(record: dict[str, Any]) -> dict[str, float] | None:
    """`sweep_features` from what a fit records of its table (delphi.fits.data.table_record); None
    where it records none."""
    sizes = (record or {}).get("sizes_per_budget")
    if not sizes or record.get("log10_median_params") is None:
        return None
    budgets = [float(b) for b in sizes]
    return {
        "log10_median_params": float(record["log10_median_params"]),
        "n_budgets": int(sum(1 for n in sizes.values() if n >= MIN_POINTS_PER_BUDGET)),
        "min_budget": min(budgets),
        "max_budget": max(budgets),
    }


def beyond_rows(
    table: pd.DataFrame, fit_fns: dict[str, Callable[[pd.DataFrame], FitResult]], source: str = "table"
) -> list[dict[str, Any]]:
    """Every (method, k, held-out budget) of the table: factor, bin, error and fit-only sd (module
    docstring). Failed fits are rows with an "error" key."""
    table = check_beyond_table(table)
    result = all_holdouts(table, fit_fns, min_train_budgets=MIN_FITTED_BUDGETS)
    rows = []
    for r in result["rows"]:
        if "error" in r:
            rows.append({"source": source, **r})
            continue
        rows.append(
            beyond_row(
                source,
                r["method"],
                r["n_train_budgets"],
                r["cut"],
                r["budget"],
                r["extrapolation"],
                r["predicted_loss"],
                r["observed_best_loss"],
                r["lo_90"],
                r["hi_90"],
            )
        )
    for name, members in ENSEMBLES.items():
        if set(members) <= set(fit_fns):
            rows += ensemble_rows(rows, name, members)
    return rows


def ensemble_rows(rows: list[dict[str, Any]], name: str, members: Sequence[str]) -> list[dict[str, Any]]:
    """The ensemble's prediction (geometric mean of the members') wherever every member predicted."""
    by_point: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r and r["method"] in members:
            by_point.setdefault((r["source"], r["cut"], r["budget"]), {})[r["method"]] = r
    out = []
    for (source, cut, budget), found in by_point.items():
        if len(found) < len(members):
            continue
        parts = [found[m] for m in members]
        predicted = float(np.exp(np.mean([math.log(p["predicted_loss"]) for p in parts])))
        half = Z_90 * float(np.mean([p["base_sd_rel"] for p in parts])) * predicted
        first = parts[0]
        out.append(
            beyond_row(
                source,
                name,
                first["n_train_budgets"],
                cut,
                budget,
                first["factor"],
                predicted,
                first["observed_best_loss"],
                predicted - half,
                predicted + half,
            )
        )
    return out


def beyond_row(
    source: str,
    method: str,
    n_train_budgets: int,
    cut: float,
    budget: float,
    factor: float,
    predicted: float,
    observed: float,
    lo_90: float | None,
    hi_90: float | None,
) -> dict[str, Any]:
    """One scored prediction, with the fit-only 50% and 90% intervals (normal, from the 90% one)."""
    base_sd_rel = 0.0 if lo_90 is None or hi_90 is None else (hi_90 - lo_90) / 2 / Z_90 / predicted
    half50 = Z_50 * base_sd_rel * predicted
    return {
        "source": source,
        "method": method,
        "n_train_budgets": int(n_train_budgets),
        "cut": float(cut),
        "budget": float(budget),
        "factor": float(factor),
        "bin": extrapolation_bin(factor),
        "predicted_loss": float(predicted),
        "observed_best_loss": float(observed),
        "rel_error": float(predicted / observed - 1),
        "log_error": float(math.log(predicted / observed)),
        "base_sd_rel": float(base_sd_rel),
        "lo_50": predicted - half50,
        "hi_50": predicted + half50,
        "lo_90": lo_90,
        "hi_90": hi_90,
        "covered_50": bool(abs(predicted - observed) <= half50),
        "covered_90": None if lo_90 is None else bool(lo_90 <= observed <= hi_90),
    }


def bin_table(rows: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """Per method and bin (and "all"): points, mean |error|, mean error (bias), 50% and 90% coverage.
    `prefix` picks the columns scored ("" for the fit-only prediction, "cal_" for the calibrated one)."""
    scored = rows[rows[f"{prefix}rel_error"].notna()] if f"{prefix}rel_error" in rows else rows.iloc[:0]
    out = []
    for method, g in scored.groupby("method", sort=False):
        for label in [b[0] for b in EXTRAPOLATION_BINS] + ["all"]:
            part = g if label == "all" else g[g["bin"] == label]
            if part.empty:
                continue
            err = part[f"{prefix}rel_error"].astype(float)
            out.append(
                {
                    "method": method,
                    "bin": label,
                    "n": len(part),
                    "n_sources": part["source"].nunique(),
                    "mean_abs_rel_error": float(err.abs().mean()),
                    "mean_rel_error": float(err.mean()),
                    "coverage_50": float(part[f"{prefix}covered_50"].astype(float).mean()),
                    "coverage_90": float(part[f"{prefix}covered_90"].astype(float).mean()),
                }
            )
    return pd.DataFrame(out)


def markdown_table(table: pd.DataFrame) -> str:
    """The bin table as markdown (percentages)."""
    head = "| method | bin | n | sources | mean abs error | mean error | 50% coverage | 90% coverage |\n|---|---|---|---|---|---|---|---|"
    lines = [head] + [
        f"| {r.method} | {r.bin} | {r.n} | {r.n_sources} | {r.mean_abs_rel_error:.2%} | {r.mean_rel_error:+.2%} | "
        f"{r.coverage_50:.0%} | {r.coverage_90:.0%} |"
        for r in table.itertuples()
    ]
    return "\n".join(lines)
