"""Competing laws sealed beside the primary: every law's prediction for the same run, each
with its 50% and 90% intervals, so that the outcome says which law held with every number committed
before it. They decide nothing; the primary's `prediction.final` is the verdict.

Entries of `prediction.competing` (all for the same outcome, the mean of the seal's seeds):
- "<primary> calibrated": the primary law's point and interval calibrated for its extrapolation
  factor on the public sweeps (`delphi.fits.calibration.calibrate_final`);
- "<primary> alone": the primary law's own point and interval, where the sealed one is corrected by
  the design's measured bias (`delphi.fits.intervals.correct_by_design`) or is its calibrated centre
  (delphi.fits.best_point); ensembles use this one;
- each other law fitted by the study (isoflop, parametric, frontier, asymptotic, ...): its own point
  and predictive interval (bootstrap (+) the outcome's run noise, as the primary's), with its
  calibrated version beside it where the calibration covers the law;
- each ensemble of `delphi.fits.beyond.ENSEMBLES` whose members were predicted: the geometric mean
  of the members' points, its relative half-widths the mean of theirs (as `beyond.ensemble_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from delphi.errors import DelphiError
from delphi.fits.beyond import ENSEMBLES
from delphi.prereg.predict import predict_final

CALIBRATED_SUFFIX = " calibrated"
ALONE_SUFFIX = " alone"


def _entry(final: dict[str, Any]) -> dict[str, Any]:
    out = {k: final[k] for k in ("loss", "loss_50", "loss_90") if k in final}
    if final.get("source"):
        out["how"] = final["source"]
    cal = final.get("calibrated") or {}
    if cal.get("applied"):
        out["calibrated"] = {k: cal[k] for k in ("loss", "loss_50", "loss_90", "factor", "method") if k in cal}
    return out


def calibrated_entry(name: str, final: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"NAME calibrated": ...} from a prediction's applied calibration; empty without one."""
    cal = final.get("calibrated") or {}
    if not cal.get("applied"):
        return {}
    return {
        name + CALIBRATED_SUFFIX: {
            "loss": cal["loss"],
            "loss_50": cal["loss_50"],
            "loss_90": cal["loss_90"],
            "how": f"the {cal['method']} law's point calibrated {cal['factor']:.3g}x beyond "
            f"the ladder on the public sweeps ({cal.get('path', 'calibration')})",
        }
    }


def ensemble_entry(members: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The geometric mean of the members' points; each interval's relative half-widths (low and high
    sides apart) the mean of the members'."""
    points = [float(m["loss"]) for m in members.values()]
    loss = float(np.exp(np.mean(np.log(points))))
    out: dict[str, Any] = {
        "loss": loss,
        "how": f"geometric mean of {' and '.join(members)} (delphi.fits.beyond.ENSEMBLES)",
    }
    for key in ("loss_50", "loss_90"):
        if all(m.get(key) for m in members.values()):
            lo = np.mean([1 - float(m[key][0]) / float(m["loss"]) for m in members.values()])
            hi = np.mean([float(m[key][1]) / float(m["loss"]) - 1 for m in members.values()])
            out[key] = [loss * (1 - lo), loss * (1 + hi)]
    return out


def competing_predictions(
    fit_paths: Mapping[str, Path],
    primary: str,
    primary_final: dict[str, Any],
    hero,
    results: Path,
    noise_scope: str = "pooled",
    n_seeds: int = 1,
) -> dict[str, dict[str, Any]]:
    """Every competing prediction for `hero` (module docstring): `fit_paths` {law: fit file} beside the
    `primary` law, whose own prediction `primary_final` is sealed as the decision. A law that cannot
    predict the run is recorded with its error, not dropped."""
    out: dict[str, dict[str, Any]] = dict(calibrated_entry(primary, primary_final))
    laws: dict[str, dict[str, Any]] = {primary: primary_final}
    if primary_final.get("point_correction"):
        laws[primary] = primary_final["uncorrected"]
        out[primary + ALONE_SUFFIX] = _entry(primary_final["uncorrected"])
    elif primary_final.get("law"):  # the calibrated centre decides: the law's own point competes beside it
        laws[primary] = primary_final["law"]
        out[primary + ALONE_SUFFIX] = _entry(primary_final["law"])
    for law, path in fit_paths.items():
        if law == primary:
            continue
        try:
            final, _ = predict_final(Path(path), hero, results, noise_scope, n_seeds)
        except (DelphiError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
            out[law] = {"error": f"no prediction ({e})"}
            continue
        if not math.isfinite(final["loss"]):
            out[law] = {"error": "a non-finite prediction"}
            continue
        laws[law] = final
        out[law] = _entry(final)
    for name, members in ENSEMBLES.items():
        if all(m in laws for m in members):
            out[name] = ensemble_entry({m: laws[m] for m in members})
    return out


def score_competing(competing: Mapping[str, dict[str, Any]], actual: float) -> dict[str, dict[str, Any]]:
    """Each sealed competing law against the outcome: its relative error (actual / predicted - 1) and
    whether its 50% and 90% intervals (and its calibrated ones, where sealed) covered."""

    def covered(interval) -> bool | None:
        return None if not interval else bool(interval[0] <= actual <= interval[1])

    out = {}
    for name, e in competing.items():
        if "loss" not in e:
            out[name] = {"error": e.get("error", "no prediction")}
            continue
        row = {
            "predicted": float(e["loss"]),
            "rel_error": actual / float(e["loss"]) - 1,
            "covered_50": covered(e.get("loss_50")),
            "covered_90": covered(e.get("loss_90")),
        }
        if e.get("calibrated"):
            row["calibrated_covered_90"] = covered(e["calibrated"].get("loss_90"))
        out[name] = row
    return out
