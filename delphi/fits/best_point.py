"""The point a forecast decides on: the law's own, or its calibrated centre, by what the evidence supports.

The public calibration (`delphi.fits.calibration`) shifts a law's point by the bias the public isoFLOP
sweeps showed for that law at that extrapolation factor. On sweeps like its sources the calibrated
centre beats the law's own point; on Delphi's own byte-level ladders it moves the point the wrong way
(the evidence: DELPHI_LADDER_EVIDENCE, PUBLIC_EVIDENCE and docs/notebook.md §8.23). So the
calibration decides only where the evidence says it transfers (`decide_point`):

- a correction measured on this design beyond its ladder (probes, or a study design's measured
  bias) decides where there is one: it is evidence about this very design;
- Delphi's own ladders (a results table collected from a Delphi ladder, or a study) keep the law's
  own point: the calibration was measured not to transfer there;
- so does a table the source check flags as unlike the calibration's sources
  (`delphi.fits.method_choice.source_likeness`),
  and a prediction the calibration has no applicable entry for (no entry for the law, not beyond the
  fit, beyond the furthest calibrated factor);
- otherwise the calibrated centre decides, the law's own point recorded beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from delphi.fits.calibration import CALIBRATED as APPLIED
from delphi.fits.method_choice import source_likeness, table_features

# What decides: the names sealed in `prediction.final.point.decides` and printed by `predict`.
LAW, CALIBRATED, PROBE_CORRECTION, POINT_CORRECTION = "law", "calibrated", "probe_correction", "point_correction"
# The measured cases behind the rule, quoted in its reasons (docs/notebook.md).
DELPHI_LADDER_EVIDENCE = (
    "on Delphi's own byte-level ladders the public calibration moved the point the wrong way "
    "(the eighth edition's 30x hero: calibrated +3.57%, the law's own +2.07%; docs/notebook.md §8.23)"
)
PUBLIC_EVIDENCE = (
    "on public isoFLOP sweeps held out from the calibration, its centre erred 0.44% at 3x against the law's "
    "1.23% (every law error on one side), 1.01% at the top three budgets against 1.90%"
)


@dataclass(frozen=True)
class PointEvidence:
    """What `decide_point` weighs. `delphi_ladder`: the table is Delphi's own rung records (None: not
    known, e.g. a fit file that does not record its table); `calibration_status`: the calibrated
    prediction's status (delphi.fits.calibration.CALIBRATED, BEYOND_RANGE, NO_ENTRY, NOT_BEYOND,
    NO_PREDICTION; None: no calibration asked for) and `calibration_reason` its reason;
    `source_distance`: the table's distance to the nearest calibration source and `source_reach` the
    farthest the calibration was carried out of sample (`calibration.source_likeness`); `corrected_by`: a
    correction of this design already applied (PROBE_CORRECTION, POINT_CORRECTION or None)."""

    delphi_ladder: bool | None
    calibration_status: str | None
    calibration_reason: str = ""
    source_distance: float | None = None
    source_reach: float | None = None
    corrected_by: str | None = None


@dataclass(frozen=True)
class PointChoice:
    decides: str  # LAW, CALIBRATED, PROBE_CORRECTION or POINT_CORRECTION
    why: str

    def to_json(self) -> dict[str, str]:
        return {"decides": self.decides, "why": self.why}


def decide_point(evidence: PointEvidence) -> PointChoice:
    """Which point decides a forecast (module docstring), and why, in one line. Pure."""
    if evidence.corrected_by == PROBE_CORRECTION:
        return PointChoice(
            PROBE_CORRECTION,
            "the law corrected by its error trend at the probes, measured on this design beyond its ladder, decides",
        )
    if evidence.corrected_by == POINT_CORRECTION:
        return PointChoice(
            POINT_CORRECTION, "the law corrected by this design's bias measured on earlier studies decides"
        )
    if evidence.delphi_ladder:
        return PointChoice(LAW, f"the law's own point: the table is Delphi's own ladder, and {DELPHI_LADDER_EVIDENCE}")
    if evidence.calibration_status is None:
        return PointChoice(LAW, "the law's own point: no calibration asked for")
    if evidence.calibration_status != APPLIED:
        return PointChoice(LAW, f"the law's own point: no calibrated centre applies ({evidence.calibration_reason})")
    if evidence.delphi_ladder is None:
        return PointChoice(
            LAW,
            "the law's own point: the fit does not record what table it was fitted on, so whether the "
            "calibration transfers to it cannot be judged (refit it with this version, or give --results)",
        )
    if (
        evidence.source_distance is None
        or evidence.source_reach is None
        or evidence.source_distance > evidence.source_reach
    ):
        far = (
            ""
            if evidence.source_distance is None
            else (
                f" (distance {evidence.source_distance:.2f} to the nearest source, beyond the {evidence.source_reach:.2f} the "
                f"calibration was tested out of sample)"
            )
        )
        return PointChoice(
            LAW, f"the law's own point: the source check flags the table as unlike the calibration's sources{far}"
        )
    return PointChoice(
        CALIBRATED, f"the calibrated centre: the table is like the calibration's public sources, and {PUBLIC_EVIDENCE}"
    )


def table_evidence(table: Any, calibration: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(whether the table is Delphi's own rung records, its `source_likeness`) for `decide_point`."""
    return bool(table.attrs.get("ladder_records", False)), source_likeness(table_features(table), calibration)


def best_point_of(
    calibrated: dict[str, Any], observed: float, ladder: bool, likeness: dict[str, Any]
) -> dict[str, Any]:
    """One held-out prediction's deciding point (`decide_point`) against the truth: {decides, loss,
    rel_error, covered_90}. `calibrated`: its `calibrate_point` answer (with the law's own point)."""
    choice = decide_point(
        PointEvidence(
            ladder,
            calibrated["status"],
            str(calibrated.get("reason") or ""),
            likeness.get("distance"),
            likeness.get("reach"),
        )
    )
    if choice.decides == CALIBRATED:
        loss, interval = float(calibrated["loss"]), calibrated["loss_90"]
    else:
        loss, interval = float(calibrated["uncalibrated_loss"]), calibrated.get("uncalibrated_interval_90")
    return {
        "decides": choice.decides,
        "loss": loss,
        "rel_error": loss / observed - 1,
        "covered_90": None if not interval else bool(interval[0] <= observed <= interval[1]),
    }


def with_best_points(
    result: dict[str, Any], table: Any, calibration: dict[str, Any], key: str = "budgets"
) -> dict[str, Any]:
    """A calibrated backtest (`calibrate_backtest`, or `calibrate_all_holdouts` with key="rows") with each
    held-out prediction's deciding point ("best_point") beside the law's own ("loss_is" says which the
    top-level "predicted_loss", "loss_interval_90" and "covered_90" are), and the rule's choice for the
    table with both mean |errors| ("best_point")."""
    ladder, likeness = table_evidence(table, calibration)
    rows, errors, law_errors = [], [], []
    for r in result[key]:
        if "calibrated" not in r:
            rows.append(r)
            continue
        best = best_point_of(r["calibrated"], float(r["observed_best_loss"]), ladder, likeness)
        errors.append(abs(best["rel_error"]))
        law_errors.append(abs(float(r["rel_error"])))
        rows.append(
            r
            | {
                "best_point": best,
                "loss_is": "predicted_loss, loss_interval_90 and covered_90 are the law's own "
                "point and interval (uncalibrated); best_point is the point that decides",
            }
        )
    first = next((r["calibrated"] for r in result[key] if "calibrated" in r), None)
    choice = decide_point(
        PointEvidence(
            ladder,
            None if first is None else first["status"],
            "" if first is None else str(first.get("reason") or ""),
            likeness.get("distance"),
            likeness.get("reach"),
        )
    )
    summary = choice.to_json() | {
        "source_likeness": likeness,
        "delphi_ladder": ladder,
        "mean_abs_rel_error": sum(errors) / len(errors) if errors else None,
        "law_mean_abs_rel_error": sum(law_errors) / len(law_errors) if law_errors else None,
    }
    return result | {key: rows, "best_point": summary}
