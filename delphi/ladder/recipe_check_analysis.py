"""The recipe check's analysis: per point, a quadratic in log2 LR (or batch) through the sweep around
its best value gives the optimum and the share of loss the recipe's value loses; the trends in width
and horizon are carried to the planned hero, and the LR optimum's drift is fitted over the points
(the method: docs/design.md and docs/notebook.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from delphi.fits.lr_optimum import fit_lr_drift, fit_quadratic
from delphi.io import read_json
from delphi.ladder.lr_calibration import completed_val_loss
from delphi.ladder.manifest import RUNS_DIR
from delphi.ladder.recipe_check import MAX_LOST_FRAC, PLAN_FILE, SAME_LR_REL, CheckRun, check_spec
from delphi.ladder.spec import LadderSpec

# The quadratic in log2 LR uses the best multiplier and two on each side (five points on the
# default grid); in log2 batch, the best and one on each side.
# The fit takes every x within that many grid steps (the check's own multipliers' median step in
# log2) of the best: on the check's grid exactly the neighbours above, and with priors, whose LRs
# fall between and beyond the grid, every sample in the same span of LR.
LR_FIT_NEIGHBOURS = 2
BATCH_FIT_NEIGHBOURS = 1


def _grid_step_log2(grid: Sequence[float]) -> float:
    """The median step of a multiplier grid in log2 (1 on the default factor-2 grids)."""
    logs = sorted({math.log2(m) for m in grid})
    return float(np.median(np.diff(logs))) if len(logs) >= 2 else 1.0


def _sweep(
    xs: list[float], losses: list[float], at: float, window_log2: float, own: list[bool] | None = None
) -> dict[str, Any]:
    """Quadratic in log2 x through every x within `window_log2` of the best finite x (seed means):
    the optimum, and the loss at `at` above it, from the runs flagged `own` (default: all)."""
    own = own if own is not None else [True] * len(xs)
    finite = [(x, y) for x, y in zip(xs, losses) if math.isfinite(y)]
    out: dict[str, Any] = {
        "x": xs,
        "losses": losses,
        "x_opt": None,
        "interior": False,
        "loss_opt": None,
        "loss_at_recipe": None,
        "loss_at_recipe_fit": None,
        "loss_opt_fit": None,
        "lost_frac": None,
        "lost_observed_frac": None,
        "lost_basis": None,
        "curvature": None,
        "best_x": None,
    }
    at_loss = [y for x, y, mine in zip(xs, losses, own) if mine and x == at and math.isfinite(y)]
    if at_loss:
        out["loss_at_recipe"] = float(np.mean(at_loss))
    if not finite:
        return out
    best_x, best_y = min(finite, key=lambda xy: xy[1])
    out["best_x"] = best_x
    loss_opt = best_y
    if len({x for x, _ in finite}) >= 3:
        # one loss per x (the seed mean) for the fit
        grouped: dict[float, list[float]] = {}
        for x, y in finite:
            grouped.setdefault(x, []).append(y)
        means = {x: float(np.mean(ys)) for x, ys in grouped.items()}
        centre = min(means, key=lambda x: means[x])
        gx = sorted(x for x in means if abs(math.log2(x / centre)) <= window_log2 + SAME_LR_REL)
        fit = fit_quadratic(np.array(gx), np.array([means[x] for x in gx]), len(gx))
        if fit.lr_opt is not None and fit.loss_opt is not None and fit.coef is not None:
            out.update(x_opt=fit.lr_opt, interior=bool(fit.interior), curvature=fit.coef[2])
            if fit.interior:
                loss_opt = min(loss_opt, fit.loss_opt)
                if gx[0] <= at <= gx[-1]:
                    a, b, c = fit.coef
                    out["loss_at_recipe_fit"] = a + b * math.log2(at) + c * math.log2(at) ** 2
                    out["loss_opt_fit"] = fit.loss_opt
    out["loss_opt"] = float(loss_opt)
    if out["loss_at_recipe"] is not None:
        out["lost_observed_frac"] = out["loss_at_recipe"] / loss_opt - 1
    # The gate's measure: the fitted curve at the recipe's value against its own minimum, so that
    # both sides carry the same seed noise; without an interior fit around the recipe's value, the
    # observed seed mean against the best run (a lower bound at the grid's edge).
    if out["loss_at_recipe_fit"] is not None:
        out.update(lost_frac=out["loss_at_recipe_fit"] / out["loss_opt_fit"] - 1, lost_basis="curve")
    elif out["lost_observed_frac"] is not None:
        out.update(lost_frac=out["lost_observed_frac"], lost_basis="observed")
    return out


def _trend(xs: list[float], ys: list[float | None], at: float) -> float | None:
    """Least-squares line of ys on log xs, evaluated at log `at` (None with < 2 distinct points)."""
    pairs = [(math.log(x), y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if len({p[0] for p in pairs}) < 2:
        return None
    slope, intercept = np.polyfit([p[0] for p in pairs], [p[1] for p in pairs], 1)
    return float(intercept + slope * math.log(at))


def analyse(spec: LadderSpec, out: str | Path) -> dict[str, Any]:
    """The report of the check planned in `out` (its plan file and the runs' summaries)."""
    out = Path(out)
    plan = read_json(out / PLAN_FILE, what="recipe-check plan")
    runs = [CheckRun(**r) for r in plan["check_runs"]]
    # a prior's run lives in its --prior directory (as given: relative to the working directory)
    loss = {
        (r.source, r.run_id): completed_val_loss((Path(r.source) if r.source else out) / RUNS_DIR / r.run_id)
        for r in runs
    }
    c = check_spec(spec)
    assert spec.recipe is not None
    lr_window = LR_FIT_NEIGHBOURS * _grid_step_log2(c.lr_multipliers)
    batch_window = BATCH_FIT_NEIGHBOURS * _grid_step_log2([1.0, *c.batch_multipliers])

    def key(r: CheckRun) -> tuple[str, str]:
        return r.source, r.run_id

    points = []
    for kind in ("width", "horizon"):
        by_point: dict[str, list[CheckRun]] = {}
        for r in runs:
            if r.kind == kind:
                by_point.setdefault(r.point, []).append(r)
        for name, rs in sorted(by_point.items(), key=lambda kv: (kv[1][0].d_model, kv[1][0].tokens)):
            xs = [r.lr_multiplier for r in rs]
            # the recipe's value (the gate's) is judged on this check's own seeds only
            sweep = _sweep(xs, [loss[key(r)] for r in rs], 1.0, lr_window, [not r.source for r in rs])
            seeds = [loss[key(r)] for r in rs if r.lr_multiplier == 1.0 and not r.source]
            finite_seeds = [s for s in seeds if math.isfinite(s)]
            points.append(
                {
                    "kind": kind,
                    "point": name,
                    "d_model": rs[0].d_model,
                    "tokens": rs[0].tokens,
                    "swept": "lr",
                    "m_opt": sweep["x_opt"],
                    **sweep,
                    "seed_sd": float(np.std(finite_seeds, ddof=1)) if len(finite_seeds) >= 2 else None,
                    "runs": len(rs),
                    "prior_runs": sum(bool(r.source) for r in rs),
                    "completed": sum(math.isfinite(loss[key(r)]) for r in rs),
                }
            )
    # batch sweeps: the batch runs plus the point's own seed-0 run at the recipe's batch and LR
    batch_points = sorted({r.point for r in runs if r.kind == "batch"})
    for name in batch_points:
        rs = [
            r
            for r in runs
            if r.point == name
            and (r.kind == "batch" or (not r.source and r.lr_multiplier == 1.0 and r.seed == c.seeds[0]))
        ]
        rs = list({key(r): r for r in rs}.values())
        sweep = _sweep(
            [r.batch_multiplier for r in rs], [loss[key(r)] for r in rs], 1.0, batch_window, [not r.source for r in rs]
        )
        points.append(
            {
                "kind": "batch",
                "point": name,
                "d_model": rs[0].d_model,
                "tokens": rs[0].tokens,
                "swept": "batch",
                "m_opt": None,
                **sweep,
                "seed_sd": None,
                "runs": len(rs),
                "prior_runs": sum(bool(r.source) for r in rs),
                "completed": sum(math.isfinite(loss[key(r)]) for r in rs),
            }
        )
    hero = plan["hero"]
    width_pts = [p for p in points if p["kind"] == "width"]
    horizon_pts = [p for p in points if p["kind"] == "horizon"]
    trend_width = _trend([p["d_model"] for p in width_pts], [p["lost_frac"] for p in width_pts], hero["d_model"])
    trend_horizon = _trend([p["tokens"] for p in horizon_pts], [p["lost_frac"] for p in horizon_pts], hero["tokens"])
    carried = max([t for t in (trend_width, trend_horizon) if t is not None], default=None)
    drift = _drift([p for p in points if p["swept"] == "lr"], c.horizon_width, spec.recipe.ref_tokens.value)
    r = spec.recipe
    suggested = None
    if drift["a"] is not None:
        # m* is the optimum in units of the recipe's LR, so each fitted slope adds to its exponent
        # (the horizon's with a minus sign: the recipe's horizon factor is (T0/T)^p).
        # The drift's width slope is about d_ref = horizon_width; moved to the recipe's own d0.
        width_slope = drift["b"] or 0.0
        suggested = {
            "lr": r.lr.value * math.exp(drift["a"]) * (r.ref_d_model.value / c.horizon_width) ** width_slope,
            "horizon_exponent": r.horizon_exponent.value - (drift["c"] or 0.0),
            "width_exponent": r.width_exponent.value + width_slope,
        }
    lost = [p["lost_frac"] for p in points if p["lost_frac"] is not None]
    return {
        "spec": spec.name,
        "optimizer": r.optimizer,
        "recipe_now": {
            "lr": r.lr.value,
            "horizon_exponent": r.horizon_exponent.value,
            "width_exponent": r.width_exponent.value,
            "ref_d_model": r.ref_d_model.value,
            "adam_lr": r.adam_lr.value,
            "ref_batch_tokens": r.ref_batch_tokens.value,
            "ref_tokens": r.ref_tokens.value,
        },
        "hero": hero,
        "reach": {"widest": max(c.widths), "longest": max(c.horizons)},
        "points": points,
        "worst_lost_frac": max(lost) if lost else None,
        "trend": {"width_at_hero": trend_width, "horizon_at_hero": trend_horizon, "carried_lost_frac": carried},
        "drift": drift,
        "recipe_suggested": suggested,
        "max_lost_frac": MAX_LOST_FRAC,
        "compute": {
            k: plan[k] for k in ("check_flops", "ladder_flops", "study_flops", "compute_ratio", "max_compute_ratio")
        },
        "priors": plan.get("priors", []),  # per --prior directory: runs reused, their FLOPs
        "complete": all(p["completed"] == p["runs"] for p in points),
    }


def _drift(points: list[dict], d_ref: int, t_ref: float) -> dict[str, float | None]:
    """log m* = a + b log(d / d_ref) + c log(T / t_ref) over the interior optima (`fit_lr_drift`)."""
    ok = [p for p in points if p["m_opt"] is not None and p["interior"]]
    fitted = (
        fit_lr_drift([p["m_opt"] for p in ok], [p["d_model"] / d_ref for p in ok], [p["tokens"] / t_ref for p in ok])
        if ok
        else None
    )
    a, b, c = fitted if fitted is not None else (None, None, None)
    return {"a": a, "b": b, "c": c, "points": float(len(ok))}
