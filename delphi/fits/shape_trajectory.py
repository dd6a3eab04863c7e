"""A hero's trajectory from a longer run's shape, with no law: the run's eval loss / final val_loss
at each fraction of training, scaled to a predicted final (`trajectory_from_shapes`, a study's
`hero.trajectory: probes`), and a running hero's finals projected from such a shape
(`project_finals`, `delphi prereg check --shape-run`). The law's own trajectory is
`delphi.fits.curves.predict_trajectory`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from delphi.errors import DelphiError, quoted
from delphi.fits.evals import eval_points, eval_steps
from delphi.fits.intervals import Z_50, Z_90
from delphi.train.config import load_train_config
from delphi.train.rundir import CONFIG_FILE, METRICS_FILE, read_metrics

# The optimizer keys that fix an LR schedule's shape as a function of the fraction of training.
SCHEDULE_SHAPE_KEYS = ("schedule", "warmup_frac", "decay_frac", "decay_shape", "min_lr_frac")


def normalised_curve(run_dir: str | Path) -> tuple[Float[np.ndarray, " points"], Float[np.ndarray, " points"]]:
    """(fraction of the run's steps, eval loss / final val_loss) of a finished run. The final is the
    summary's val_loss (the final eval), so a curve evaluated on fewer tokens keeps its offset from it."""
    run_dir = Path(run_dir)
    try:
        final = float(json.loads((run_dir / "summary.json").read_text())["val_loss"])
    except (OSError, ValueError, KeyError, TypeError):
        raise DelphiError(
            f"{run_dir}: no final val_loss in summary.json; a finished run is needed for its curve's shape"
        ) from None
    steps, _, loss = eval_points(read_metrics(run_dir))
    if steps.size < 2:
        raise DelphiError(f"{run_dir}: {steps.size} eval point(s) in {METRICS_FILE}; a curve's shape needs >= 2")
    return steps / steps.max(), loss / final


def same_schedule_shape(run_dir: str | Path, hero: Any) -> Any:
    """The run's TrainConfig, when its LR schedule has the hero's shape (SCHEDULE_SHAPE_KEYS); a
    DelphiError naming the key otherwise: a curve's shape transfers only between runs on one schedule."""
    cfg = load_train_config(Path(run_dir) / CONFIG_FILE)
    for key in SCHEDULE_SHAPE_KEYS:
        if getattr(cfg.optim, key) != getattr(hero.optim, key):
            raise DelphiError(
                f"{run_dir}: optim.{key} is {quoted(getattr(cfg.optim, key))} but the hero's is "
                f"{quoted(getattr(hero.optim, key))}; a curve's shape transfers only between runs on one schedule"
            )
    return cfg


def project_finals(points: Sequence[dict], shape_run: str | Path, hero: Any) -> list[dict[str, float]]:
    """Each eval point {step, actual} of a live run divided by `shape_run`'s normalised curve at the
    same fraction of training: the final loss the run is heading for if it keeps that shape, an early
    warning long before the run ends."""
    same_schedule_shape(shape_run, hero)
    fraction, ratio = normalised_curve(shape_run)
    out = []
    for p in points:
        f = int(p["step"]) / hero.steps
        out.append(
            {
                "step": int(p["step"]),
                "fraction": f,
                "projected_final": float(p["actual"]) / float(np.interp(f, fraction, ratio)),
            }
        )
    return out


def trajectory_from_shapes(shape_runs: Sequence[str | Path], hero: Any, final: dict) -> dict[str, Any]:
    """The hero's eval curve as its final prediction x the normalised curve (`normalised_curve`) of
    the longest of `shape_runs`, at the hero's fractions of training; every run must share the
    hero's schedule shape (SCHEDULE_SHAPE_KEYS). Bands: the final's 50%/90% intervals scaled by the
    same ratio, widened in quadrature by z x the RMS relative difference between the two longest
    runs' normalised curves before their end (the shape's own uncertainty; one run gives none).
    Why: a run beyond the ladder shares the hero's schedule and length scale, where the curve law
    fitted on the ladder's short runs extrapolates their shape (docs/notebook.md)."""
    if not shape_runs:
        raise DelphiError("trajectory from probes: no finished run beyond the ladder to take the curve's shape from")
    runs = []
    for run in map(Path, shape_runs):
        cfg = same_schedule_shape(run, hero)
        runs.append((float(cfg.tokens), run, *normalised_curve(run)))
    runs.sort(key=lambda r: r[0], reverse=True)
    steps = np.asarray(eval_steps(hero.steps, hero.eval_every))
    fraction = steps / hero.steps
    ratio = np.interp(fraction, runs[0][2], runs[0][3])
    spread = 0.0  # one relative sd for the whole curve: two runs' difference point by point is too noisy
    if len(runs) > 1:
        before_end = fraction < 1
        spread = float(
            np.sqrt(np.mean(((ratio - np.interp(fraction, runs[1][2], runs[1][3])) / ratio)[before_end] ** 2))
        )
    loss = float(final["loss"])
    points = []
    for k, step in enumerate(steps):
        point = {"step": int(step), "tokens": int(step * hero.tokens_per_step), "loss": loss * float(ratio[k])}
        for level, z in (("50", Z_50), ("90", Z_90)):
            lo, hi = final.get(f"loss_{level}") or (loss, loss)
            extra = z * spread * point["loss"]
            point[f"lo{level}"] = point["loss"] - math.hypot((loss - float(lo)) * ratio[k], extra)
            point[f"hi{level}"] = point["loss"] + math.hypot((float(hi) - loss) * ratio[k], extra)
        points.append(point)
    return {
        "model": {
            "kind": "shape",
            "runs": [str(r[1]) for r in runs],
            "shape_run": str(runs[0][1]),
            "spread_run": str(runs[1][1]) if len(runs) > 1 else None,
            "spread_rel": spread,
            "note": "the final prediction x the longest run's eval loss / final val_loss at the same fraction of "
            "training; bands: the final's intervals scaled alike, widened by the two longest runs' difference",
        },
        "points": points,
    }
