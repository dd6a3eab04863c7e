"""The figures: pure functions from data (tables, fits, preregistrations, runs) to a matplotlib Figure.

Save with `delphi.plot.style.save_figure(fig, "out.png")` (PNG + SVG).
Power laws are drawn on log-log axes; every axis names its quantity and unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from delphi.plot import style as st


def _log_grid(lo: float, hi: float, n: int = 60) -> np.ndarray:
    return np.logspace(math.log10(lo), math.log10(hi), n)


def _bands(fit: Any, grid: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Pointwise 90% band of fit.predict(compute=c)[key] along the grid (None without bootstrap)."""
    edges = [fit.predict(compute=float(c)).get(f"{key}_interval_90") for c in grid]
    if any(e is None for e in edges):
        return None
    return np.array([e[0] for e in edges], float), np.array([e[1] for e in edges], float)


def _readable_log_axis(axis) -> None:
    """Ticks at 1, 2, 5 x 10^k with plain labels, so a short log axis is not a smear of minor labels."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    formatter = ScalarFormatter()
    formatter.set_scientific(True)
    formatter.set_powerlimits((-3, 4))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


# --------------------------------------------------------------------------- isoFLOP


def isoflop_figure(
    table: pd.DataFrame, optima: Sequence[dict] | None = None, title: str = "isoFLOP curves"
) -> plt.Figure:
    """Loss against N for each budget, a parabola in log N through each, and its optimum.

    The parabolas are drawn with a least-squares quadratic in log N (Approach 2's
    form); the optimum star is the fit's own (`optima`: {budget, params_opt, loss_opt}
    from an isoflop fit's JSON) when given, else the drawn parabola's vertex.
    """
    with st.style():
        fig, ax = plt.subplots()
        budgets = sorted(table["budget"].unique())
        by_budget = {float(o["budget"]): o for o in (optima or []) if "budget" in o}
        for color, budget in zip(st.budget_colors(len(budgets)), budgets):
            rows = table[table["budget"] == budget].sort_values("params")
            ax.scatter(rows["params"], rows["loss"], color=color, s=18, zorder=3)
            x = np.log10(rows["params"].to_numpy(float))
            o = by_budget.get(float(budget), {})
            coef = o.get("coefficients")
            if coef is None and len(rows) >= 3:
                coef = np.polyfit(x, rows["loss"].to_numpy(float), 2)
            label = f"C = {budget:.2g}"
            if coef is not None:
                grid = np.linspace(x.min() - 0.1, x.max() + 0.1, 100)
                ax.plot(10**grid, np.polyval(coef, grid), color=color, lw=1.2, label=label)
                label = None
                n_opt = o.get("params_opt") or (10 ** (-coef[1] / (2 * coef[0])) if coef[0] > 0 else None)
                if n_opt:
                    l_opt = o.get("loss_opt") or np.polyval(coef, math.log10(n_opt))
                    ax.scatter(
                        [n_opt], [l_opt], marker="*", s=90, color=color, edgecolor="black", linewidth=0.6, zorder=4
                    )
            if label:
                ax.plot([], [], color=color, label=label)
        ax.scatter([], [], marker="*", s=90, color="white", edgecolor="black", label="optimum N*")
        ax.set_xscale("log")
        ax.set_xlabel(st.LABEL_PARAMS)
        ax.set_ylabel(st.LABEL_LOSS)
        ax.set_title(title)
        ax.legend(ncol=2)
        return fig


# --------------------------------------------------------------------------- allocation N*(C), D*(C)


def allocation_figure(
    optima: pd.DataFrame,
    fit: Any | None = None,
    hero_compute: float | None = None,
    hero_params: float | None = None,
    hero_tokens: float | None = None,
) -> plt.Figure:
    """N*(C) and D*(C): per-budget optima, the fitted power law with its 90% band, the hero."""
    with st.style():
        fig, axes = plt.subplots(1, 2, figsize=st.FIGSIZE_WIDE)
        c_hi = max(float(optima["budget"].max()), hero_compute or 0) * 1.5
        grid = _log_grid(float(optima["budget"].min()) / 1.5, c_hi)
        pred = fit.predict(compute=grid) if fit is not None else None
        for ax, key, label, hero_val in (
            (axes[0], "params", st.LABEL_PARAMS, hero_params),
            (axes[1], "tokens", st.LABEL_TOKENS, hero_tokens),
        ):
            ax.scatter(optima["budget"], optima[key], color=st.DATA, zorder=3, label="per-budget optimum")
            if pred is not None and pred.get(key) is not None:
                ax.plot(grid, pred[key], color=st.FIT, label="fit")
                band = _bands(fit, grid, key)
                if band is not None:
                    ax.fill_between(grid, band[0], band[1], color=st.FIT, alpha=0.2, lw=0, label="90% interval")
                ax.axvspan(float(optima["budget"].max()), c_hi, color="grey", alpha=0.06, lw=0)
            if hero_compute and hero_val:
                ax.scatter([hero_compute], [hero_val], marker="D", color=st.HERO, zorder=4, label="hero")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(st.LABEL_FLOPS)
            ax.set_ylabel(label.replace("N: ", "N*: optimal ").replace("D: training", "D*: optimal training"))
            ax.legend()
        axes[0].set_title("compute-optimal model size")
        axes[1].set_title("compute-optimal data")
        return fig


# --------------------------------------------------------------------------- frontier L*(C)


def frontier_figure(
    table: pd.DataFrame,
    fit: Any | None = None,
    hero_compute: float | None = None,
    hero_interval: tuple[float, float, float] | None = None,
    hero_actual: float | None = None,
) -> plt.Figure:
    """Every run's (C, loss), the fitted frontier with its band, the hero's interval and actual point."""
    with st.style():
        fig, ax = plt.subplots()
        ax.scatter(table["flops"], table["loss"], color=st.DATA, s=12, alpha=0.6, label="ladder runs")
        best = table.loc[table.groupby("budget")["loss"].idxmin()] if "budget" in table else None
        if best is not None:
            ax.scatter(
                best["flops"], best["loss"], color=st.DATA, s=40, marker="s", facecolor="none", label="best per budget"
            )
        c_hi = max(float(table["flops"].max()), hero_compute or 0) * 1.5
        grid = _log_grid(float(table["flops"].min()) / 1.5, c_hi)
        if fit is not None:
            pred = fit.predict(compute=grid)
            ax.plot(grid, pred["loss"], color=st.FIT, label="fitted L*(C)")
            band = _bands(fit, grid, "loss")
            if band is not None:
                lo, hi = band
                ax.fill_between(grid, lo, hi, color=st.FIT, alpha=0.2, lw=0, label="90% interval")
        if hero_compute and hero_interval:
            med, lo, hi = hero_interval
            ax.errorbar(
                [hero_compute],
                [med],
                yerr=[[med - lo], [hi - med]],
                fmt="D",
                color=st.PREDICTION,
                capsize=4,
                label="hero: predicted (90%)",
            )
        if hero_compute and hero_actual is not None:
            ax.scatter([hero_compute], [hero_actual], marker="*", s=140, color=st.HERO, zorder=5, label="hero: actual")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _readable_log_axis(ax.yaxis)
        ax.set_xlabel(st.LABEL_FLOPS)
        ax.set_ylabel(st.LABEL_LOSS)
        ax.set_title("compute frontier")
        ax.legend()
        return fig


# --------------------------------------------------------------------------- prediction vs actual


def prediction_figure(
    prereg_doc: dict, run=None, verdict: str | None = None, seed_runs: dict | None = None
) -> plt.Figure:
    """The preregistered trajectory with 50%/90% bands against the hero's eval points, and the
    hero's final loss (its summary's, on the final evaluation set) beside the predicted final.

    `run`: the hero's `delphi.train.runlog.RunState` (its evals and final_loss), or None.
    `seed_runs` ({seed: RunState}, a multi-seed seal): each seed's curve, and the mean of their finals."""
    curves = {f"seed {s}": r for s, r in seed_runs.items()} if seed_runs else ({"hero": run} if run is not None else {})
    finals = [r.final_loss for r in curves.values()]
    actual_final = sum(finals) / len(finals) if finals and all(f is not None for f in finals) else None
    points = prereg_doc["prediction"]["trajectory"]["points"]
    t = np.array([p["tokens"] for p in points], float)
    col = lambda k: np.array([p[k] for p in points], float)  # noqa: E731
    final = prereg_doc["prediction"]["final"]
    with st.style():
        fig, ax = plt.subplots()
        if len(t) > 1:
            ax.fill_between(t, col("lo90"), col("hi90"), color=st.PREDICTION, alpha=0.18, lw=0, label="90% band")
            ax.fill_between(t, col("lo50"), col("hi50"), color=st.PREDICTION, alpha=0.35, lw=0, label="50% band")
            ax.plot(t, col("loss"), color=st.PREDICTION, label="preregistered median")
        if final.get("loss_90"):
            lo, hi = final["loss_90"]
            ax.errorbar(
                [t[-1] * 1.04],
                [final["loss"]],
                yerr=[[final["loss"] - lo], [hi - final["loss"]]],
                fmt="D",
                color=st.FIT,
                capsize=4,
                label="final loss (scaling law, 90%)",
            )
        actual_loss = []
        for k, (label, one) in enumerate(curves.items()):
            pts = [(e.tokens, e.loss) for e in one.evals if e.tokens]
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    "o-" if k == 0 else "s--",
                    color=st.HERO,
                    ms=3.5,
                    lw=1,
                    alpha=1.0 if k == 0 else 0.6,
                    label=f"{label}: actual eval loss",
                )
                actual_loss += [p[1] for p in pts]
        if actual_final is not None:
            what = (
                "hero: final loss (final eval set)" if len(curves) == 1 else f"mean final loss of {len(curves)} seeds"
            )
            ax.plot([t[-1] * 1.04], [actual_final], "*", color=st.HERO, ms=11, label=what)
            actual_loss = [*actual_loss, actual_final]
        ax.set_xscale("log")
        _readable_log_axis(ax.xaxis)
        ax.set_xlabel(st.LABEL_TOKENS)
        ax.set_ylabel(st.LABEL_LOSS)
        lo = min([*col("lo90"), *(actual_loss if len(actual_loss) else [])])
        hi = max([*col("hi90"), *(actual_loss if len(actual_loss) else [])])
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set_title(f"{prereg_doc['id']}: prediction vs actual" + (f" ({verdict})" if verdict else ""))
        ax.legend()
        return fig


def law_alone_error_figure(old: Sequence[dict], new: Sequence[dict]) -> plt.Figure:
    """Each run beyond its ladder against its ladder's law alone: error (actual / predicted - 1)
    against the multiple of the ladder's top budget, for the old recipe and the new.

    `old`: `delphi.paper.beyond.law_alone_rows` (multiple, rel_error, run). `new`:
    `delphi.paper.beyond.sealed_run` rows (multiple, predicted, loss_90, tolerance_rel, and once
    scored rel_error and each seed's final loss): the sealed 90% interval is drawn as the span of
    errors it covers, each seed as a small mark, the seed mean as the large one."""
    pct = lambda v: 100.0 * v  # noqa: E731
    with st.style():
        fig, ax = plt.subplots()
        if old:
            ax.plot(
                [r["multiple"] for r in old],
                [pct(r["rel_error"]) for r in old],
                "o-",
                color=st.DATA,
                alpha=0.7,
                label="old recipe: its ladder's law alone",
            )
            for r in old:
                ax.annotate(
                    r["run"],
                    (r["multiple"], pct(r["rel_error"])),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                    color=st.DATA,
                )
        for k, r in enumerate(new):
            x = r["multiple"]
            if r.get("loss_90"):
                lo, hi = (pct(v / r["predicted"] - 1) for v in r["loss_90"])
                ax.plot(
                    [x, x],
                    [lo, hi],
                    color=st.PREDICTION,
                    lw=6,
                    alpha=0.3,
                    solid_capstyle="butt",
                    label="new recipe: sealed 90% interval" if k == 0 else None,
                )
            seeds = [v for _, v in r.get("seeds") or [] if v is not None]
            if r.get("rel_error") is None:
                ax.annotate(
                    "training" if r.get("status") not in (None, "sealed, not yet trained") else "not yet trained",
                    (x, 0),
                    textcoords="offset points",
                    xytext=(6, 0),
                    fontsize=7,
                    color=st.PREDICTION,
                )
                continue
            if len(seeds) > 1:
                ax.plot(
                    [x] * len(seeds),
                    [pct(v / r["predicted"] - 1) for v in seeds],
                    "o",
                    mfc="none",
                    color=st.HERO,
                    ms=5,
                    label="new recipe: each seed" if k == 0 else None,
                )
            ax.plot(
                [x],
                [pct(r["rel_error"])],
                "D",
                color=st.HERO,
                ms=7,
                label=("new recipe: sealed law alone, seed mean" if len(seeds) > 1 else "new recipe: sealed law alone")
                if k == 0
                else None,
            )
        tolerance = next((r["tolerance_rel"] for r in new if r.get("tolerance_rel")), None)
        if tolerance:
            for sign in (-1, 1):
                ax.axhline(
                    sign * pct(tolerance),
                    color=st.FIT,
                    ls="--",
                    lw=0.8,
                    label=f"preregistered tolerance ±{tolerance:.0%}" if sign > 0 else None,
                )
        ax.axhline(0.0, color=st.DATA, lw=0.6)
        ax.set_xscale("log")
        _readable_log_axis(ax.xaxis)
        ax.set_xlabel("compute / the ladder's top budget")
        ax.set_ylabel("law-alone error: actual / predicted - 1 (%)")
        ax.set_title("the law alone beyond the ladder: old recipe vs new")
        ax.legend()
        return fig


# --------------------------------------------------------------------------- residuals


def residuals_figure(table: pd.DataFrame, predicted: np.ndarray, title: str = "fit residuals") -> plt.Figure:
    """Relative residuals (observed - fitted) / fitted against N and against C."""
    rel = (table["loss"].to_numpy(float) - predicted) / predicted
    with st.style():
        fig, axes = plt.subplots(1, 2, figsize=st.FIGSIZE_WIDE, sharey=True)
        budgets = sorted(table["budget"].unique()) if "budget" in table else [None]
        colors = st.budget_colors(len(budgets))
        for ax, x, label in ((axes[0], "params", st.LABEL_PARAMS), (axes[1], "flops", st.LABEL_FLOPS)):
            for color, b in zip(colors, budgets):
                m = (table["budget"] == b).to_numpy() if b is not None else np.ones(len(table), bool)
                ax.scatter(table[x][m], 100 * rel[m], color=color, s=14, label=None if b is None else f"C = {b:.2g}")
            ax.axhline(0, color=st.DATA, lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel(label)
        axes[0].set_ylabel("relative residual (%)")
        axes[0].legend(ncol=2)
        fig.suptitle(f"{title}: rms {100 * np.sqrt(np.mean(rel**2)):.2f}%")
        return fig


# --------------------------------------------------------------------------- muP checks


def lrsweep_figure(records: pd.DataFrame) -> plt.Figure:
    """Final loss against base LR, one curve per width; the best LR of each marked. Columns: width, lr, loss."""
    widths = sorted(records["width"].unique())
    with st.style():
        fig, ax = plt.subplots()
        for color, w in zip(st.budget_colors(len(widths)), widths):
            r = records[records["width"] == w].sort_values("lr")
            ax.plot(r["lr"], r["loss"], marker="o", ms=3.5, color=color, label=f"width {w}")
            best = r.loc[r["loss"].idxmin()]
            ax.scatter(
                [best["lr"]], [best["loss"]], marker="*", s=110, color=color, edgecolor="black", linewidth=0.6, zorder=4
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("base learning rate (Adam, at the base width)")
        ax.set_ylabel(st.LABEL_LOSS)
        ax.set_title("LR sweep across widths (stars: best LR)")
        ax.legend()
        return fig


# The coordinate check's whole-model component (the logits), drawn as a solid line.
COORDCHECK_MODEL_COMPONENT = "logits"


def coordcheck_figure(results: Sequence[dict[str, Any]]) -> plt.Figure:
    """muP coordinate check: one panel per result (CoordCheckResult.to_json()), mean |activation|
    against width on log2 axes, a line per component labelled with its slope."""
    with st.style():
        fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.2), squeeze=False)
        for ax, res in zip(axes[0], results):
            widths = res["spec"]["widths"]
            for c, mags in res["magnitude"].items():
                line = (
                    "-"
                    if c == COORDCHECK_MODEL_COMPONENT
                    else ("--" if "residual" in c else ":" if c == "embedding" else "-.")
                )
                ax.plot(widths, mags, line, marker="o", ms=3, label=f"{c} ({res['slopes'][c]:+.2f})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("width d_model (log2)")
            ax.set_ylabel(f"mean |activation|, steps 1-{res['spec']['steps']} (log2)")
            ax.set_title(
                f"{res['label']}: {'PASS' if res['passed'] else 'FAIL'} (worst slope {res['worst_slope']:+.2f})"
            )
            ax.legend(fontsize=6, loc="best")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig


# --------------------------------------------------------------------------- curve law


def curves_figure(curves: Sequence[Any], fit: Any, backtest: dict | None = None) -> plt.Figure:
    """Each ladder curve with the fitted curve law (and the backtest target's prediction)."""
    with st.style():
        fig, ax = plt.subplots()
        sizes = sorted({c.params for c in curves})
        color_of = dict(zip(sizes, st.budget_colors(len(sizes))))
        labelled = set()
        for c in sorted(curves, key=lambda c: c.params):
            color = color_of[c.params]
            ax.scatter(c.tokens, c.loss, s=8, color=color)
            pred = fit.predict(c.params, c.s1, c.s2)
            ax.plot(
                c.tokens,
                pred["loss"],
                color=color,
                lw=1.1,
                label=None if c.params in labelled else f"N = {c.params:.2g}",
            )
            labelled.add(c.params)
        ax.plot([], [], color="grey", lw=1.1, label="curve law fit (dots: eval points)")
        if backtest:
            pts = backtest["points"]
            ax.scatter(
                [p["tokens"] for p in pts],
                [p["predicted"] for p in pts],
                marker="x",
                color=st.HERO,
                s=40,
                zorder=5,
                label=f"backtest of N = {backtest['target_params']:.2g} (max err {100 * backtest['max_abs_rel_error']:.2f}%)",
            )
        ax.set_xscale("log")
        ax.set_xlabel(st.LABEL_TOKENS)
        ax.set_ylabel(st.LABEL_LOSS)
        ax.set_title("LR-annealing curve law on the ladder's eval curves")
        ax.legend(loc="upper right")
        return fig
