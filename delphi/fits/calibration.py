"""Point calibration: one law's prediction beyond its fitted budgets, with its calibrated interval beside the law's own.

`calibrate_point` is a pure function of the method's calibration entry, the prediction, its 90%
interval and its extrapolation factor. A prediction beyond the furthest calibrated factor, or of a
method without an entry, keeps the law's own interval, marked uncalibrated with the reason.
`calibrate_final` calibrates a hero's sealed prediction; `calibrate_backtest` and
`calibrate_all_holdouts` put both intervals on every held-out budget of a backtest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from delphi.fits.calibration_file import calibration_provenance, load_calibration, shown_path
from delphi.fits.calibration_model import fit_only_sd_rel
from delphi.fits.data import isoflop_rows
from delphi.fits.method_choice import (
    PRIMARY_CAPABLE,
    choose_method,
    method_choice_lines,
    primary_note,
    source_likeness,
    table_features,
)

# The calibration key of a fit (the `delphi fit` method that produced it), by (kind, method).
FIT_METHOD_KEYS = {
    ("isoflop", "approach2"): "isoflop",
    ("parametric", "vpnls"): "vpnls",
    ("parametric", "approach3"): "parametric",
    ("frontier", "frontier-free-weighted"): "asymptotic",
}

# calibrate_point's "status": why the calibrated interval is there, or why the law's own stands alone.
CALIBRATED = "calibrated"
BEYOND_RANGE = "beyond_calibrated_range"
NO_ENTRY = "no_calibration_entry"
NOT_BEYOND = "not_beyond_fitted_budgets"
NO_PREDICTION = "no_prediction"
NOT_CALIBRATED_WHY = {
    BEYOND_RANGE: "beyond the calibrated range",
    NO_ENTRY: "without a calibration entry",
    NOT_BEYOND: "not beyond the fitted budgets",
    NO_PREDICTION: "without a prediction",
}


def calibration_key(kind: str, method: str) -> str | None:
    """The calibration entry for a fit of this kind and method (None: not calibrated)."""
    if (kind, method) in FIT_METHOD_KEYS:
        return FIT_METHOD_KEYS[(kind, method)]
    return (
        "frontier" if kind == "frontier" and method.startswith("frontier-free") and "weighted" not in method else None
    )


def calibrated_prediction(
    method: str,
    predicted_loss: float,
    interval_90: Sequence[float] | None,
    factor: float,
    calibration: dict[str, Any],
    residual_scatter_nats: float | None = None,
) -> dict[str, Any]:
    """A law's prediction `factor` beyond its largest fitted budget, with the calibrated point and
    intervals. The fit-only sd is the 90% interval's half-width / z_0.95 (widened in quadrature by
    the residual scatter when given, as `backtest.predictive_interval`)."""
    cal = calibration["methods_parsed"].get(method)
    if cal is None:
        return {"applied": False, "reason": f"no calibration for method {method!r} in {calibration['path']}"}
    base_sd_rel = fit_only_sd_rel(predicted_loss, interval_90, residual_scatter_nats)
    out = cal.predict(predicted_loss, factor, base_sd_rel)
    return {
        **out,
        "method": method,
        "uncalibrated_loss": float(predicted_loss),
        "base_sd_rel": base_sd_rel,
        **calibration_provenance(calibration),
    }


def calibrate_final(
    fit: Any, final: dict[str, Any], compute: float, table: pd.DataFrame, calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The calibrated version of a hero's `final` prediction (prereg's {loss, loss_50, loss_90}): the
    shift and model-error term of the fit's method at the hero's extrapolation factor (compute / the
    table's largest isoFLOP budget), with the method choice by evidence for this ladder. The fit-only
    sd is `final`'s 90% half-width / z_0.95 (bootstrap and run noise already in it)."""
    calibration = calibration if calibration is not None else load_calibration()  # a broken file is loud (exit 2)
    top = float(isoflop_rows(table)["budget"].max())
    factor = float(compute) / top
    key = calibration_key(fit.kind, fit.method)
    choice = choose_method(table_features(table), calibration, PRIMARY_CAPABLE)
    out: dict[str, Any]
    if key is None:
        out = {"applied": False, "reason": f"no calibration for a {fit.kind} fit by {fit.method}"}
    elif factor <= 1:
        out = {
            "applied": False,
            "reason": f"the hero ({compute:.3g} FLOPs) is not beyond the ladder's top budget {top:.3g}",
        }
    else:
        out = calibrated_prediction(key, float(final["loss"]), final.get("loss_90"), factor, calibration)
    out["top_budget"] = top
    out["source_likeness"] = source_likeness(table_features(table), calibration)
    recorded = calibration.get("inputs") if isinstance(calibration.get("inputs"), dict) else {}
    out["table_is_calibration_source"] = (
        table.attrs.get("sha256") in recorded.values()
    )  # its calibration is then in-sample
    out["method_choice"] = choice
    out["method_choice"]["fitted_method"] = key
    out["method_choice"]["agrees"] = key == choice["method"]
    return out


def calibrated_status(cal: dict[str, Any] | None) -> tuple[str | None, str]:
    """(status, reason) of a calibrated prediction, from `calibrate_point` (which says) or
    `calibrate_final` (which says whether it applied and whether it lies beyond the calibrated
    range): CALIBRATED, BEYOND_RANGE, NO_ENTRY; (None, "") without one."""
    if not cal:
        return None, ""
    if "status" in cal:
        return cal["status"], str(cal.get("reason") or "")
    if not cal.get("applied"):
        return NO_ENTRY, str(cal.get("reason") or "not calibrated")
    if cal.get("beyond_calibrated_range"):
        return BEYOND_RANGE, (
            f"{cal['factor']:.4g}x is beyond {cal['method']}'s furthest calibrated factor "
            f"({cal['max_calibrated_factor']:.4g}x)"
        )
    return CALIBRATED, ""


def gate_uses_calibration(final: dict[str, Any]) -> bool:
    """Whether gate interval_width judges the calibrated interval: when `final` has an applied
    calibration and was corrected by neither probes nor a design's measured bias, whose outcomes
    beyond this design's own ladders then stand in for the public calibration."""
    return bool((final.get("calibrated") or {}).get("applied")) and not {"probe_correction", "point_correction"} & set(
        final
    )


def interval_for_gate(final: dict[str, Any]) -> tuple[Sequence[float] | None, float, str, str | None]:
    """(90% interval, its centre, a note saying which, why the hero is beyond the calibration or None)
    for gate interval_width: the calibrated interval where `gate_uses_calibration`, else the sealed one."""
    cal = final.get("calibrated") or {}
    if gate_uses_calibration(final):
        beyond = None
        if cal.get("beyond_calibrated_range"):
            beyond = (
                f"the hero lies {cal['factor']:.3g}x beyond the ladder's top budget, farther out than any calibration "
                f"point ({cal['max_calibrated_factor']:.3g}x for {cal['method']}): the calibrated interval is an "
                f"extrapolation of the calibration itself; refusing to seal without --force"
            )
        return (
            cal.get("loss_90"),
            float(cal["loss"]),
            f"calibrated ({cal['method']}, {cal['factor']:.3g}x beyond the ladder) ",
            beyond,
        )
    note = "sealed (corrected by the design's measured bias) " if "point_correction" in final else ""
    return final.get("loss_90"), float(final["loss"]), note, None


def report_lines(final: dict[str, Any], primary_fit: str | None = None, primary_law: str | None = None) -> list[str]:
    """Markdown for a study report: the primary law's calibrated prediction, and the method choice on
    the public sweeps beside it. `primary_fit` is the study's setting (a law, or "auto") and
    `primary_law` the law it resolved to: they say why the primary law made the sealed prediction
    where the public-sweep evidence names another (a study that fixed its law)."""
    cal = (final or {}).get("calibrated")
    if not cal:
        return []
    lines = ["## Calibrated interval and method choice (issue 30)", ""]
    if cal.get("applied"):
        lo, hi = cal["loss_90"]
        lines.append(
            f"The {cal['method']} law's prediction {cal['uncalibrated_loss']:.4f}, {cal['factor']:.3g}x beyond the ladder's "
            f"top budget, calibrated on the public isoFLOP sweeps: {cal['loss']:.4f}, 90% [{lo:.4f}, {hi:.4f}] "
            f"(model-error sd {cal['model_sd_rel']:.2%}, total sd {cal['sd_rel']:.2%}; calibration {cal['path']}, "
            f"sha256 {cal['sha256'][:12]})."
        )
        if cal.get("beyond_calibrated_range"):
            lines.append(
                f"**The hero lies farther out than any calibration point** ({cal['factor']:.3g}x against "
                f"{cal['max_calibrated_factor']:.3g}x): the interval extrapolates the calibration itself."
            )
    else:
        lines.append(f"Not calibrated: {cal.get('reason')}.")
    choice = cal.get("method_choice")
    if choice:
        lines += [""] + method_choice_lines(
            choice,
            primary_note(choice["method"], primary_law or choice.get("fitted_method"), primary_fit),
            lead="Public-sweep evidence for which law extrapolates best on sweeps like this one.",
        )
    return lines + [""]


def calibrate_point(
    method_key: str | None,
    predicted: float | None,
    interval_90: Sequence[float] | None,
    factor: float,
    calibration: dict[str, Any],
    *,
    fit_label: str | None = None,
) -> dict[str, Any]:
    """One prediction, `factor` times the largest fitted budget, beside its calibrated interval. Pure:
    the method's calibration entry (`method_key`, e.g. from `calibration_key`; None: no entry), the
    law's prediction and its own 90% interval (which sets the fit-only sd, `fit_only_sd_rel`).

    Always: "status", "applied", "method", "factor", "max_calibrated_factor" (None without an entry),
    "uncalibrated_loss", "uncalibrated_interval_90". Calibrated (status CALIBRATED): "loss" (the
    calibrated centre: the law's point less the calibrated shift), "loss_50", "loss_90", "sd_rel",
    "model_sd_rel", "shift_log", "base_sd_rel". Otherwise "reason", one line: a method without an
    entry (NO_ENTRY), a factor beyond the furthest calibrated one (BEYOND_RANGE: the calibration is not
    extrapolated; the law's own interval stands, uncalibrated), a prediction not beyond the fitted
    budgets (NOT_BEYOND: the calibration is of extrapolation) or no finite prediction (NO_PREDICTION)."""
    entry = calibration["methods_parsed"].get(method_key) if method_key is not None else None
    own = None if interval_90 is None or None in tuple(interval_90) else [float(v) for v in interval_90]
    out: dict[str, Any] = {
        "status": CALIBRATED,
        "applied": False,
        "method": method_key,
        "factor": float(factor),
        "max_calibrated_factor": None if entry is None else float(entry.max_factor),
        "uncalibrated_loss": None if predicted is None else float(predicted),
        "uncalibrated_interval_90": own,
    }
    label = fit_label or (repr(method_key) if method_key is not None else "this method")
    if entry is None:
        out.update(
            status=NO_ENTRY,
            reason=f"no calibration entry for {label} in {shown_path(calibration)}; its entries: "
            f"{', '.join(sorted(calibration['methods_parsed']))}",
        )
    elif predicted is None or not math.isfinite(float(predicted)) or float(predicted) <= 0:
        out.update(status=NO_PREDICTION, reason=f"no finite positive prediction to calibrate ({predicted!r})")
    elif not math.isfinite(float(factor)) or float(factor) <= 1:
        out.update(
            status=NOT_BEYOND,
            reason=f"{float(factor):.4g}x the largest fitted budget is not beyond it; "
            f"the calibration is of extrapolation",
        )
    elif float(factor) > entry.max_factor * (1 + 1e-9):
        out.update(
            status=BEYOND_RANGE,
            reason=f"{float(factor):.4g}x is beyond {method_key}'s furthest calibrated factor "
            f"(max_calibrated_factor {entry.max_factor:.4g}x)",
        )
    else:
        base = fit_only_sd_rel(float(predicted), own)
        p = entry.predict(float(predicted), float(factor), base)
        out.update(
            applied=True,
            loss=p["loss"],
            loss_50=p["loss_50"],
            loss_90=p["loss_90"],
            sd_rel=p["sd_rel"],
            model_sd_rel=p["model_sd_rel"],
            shift_log=p["shift_log"],
            base_sd_rel=base,
        )
    return out


def describe_calibrated(point: dict[str, Any]) -> str:
    """One phrase for a `calibrate_point` answer: the calibrated 90% interval with its centre, method and
    factor, or why there is none (the law's own interval then stands, uncalibrated)."""
    if point["applied"]:
        lo, hi = point["loss_90"]
        return (
            f"calibrated 90% [{lo:.4f}, {hi:.4f}] (centre {point['loss']:.4f}; {point['method']} calibration "
            f"at {point['factor']:.3g}x)"
        )
    return f"calibrated 90%: none; the law's own interval stands, uncalibrated: {point['reason']}"


def _with_truth(point: dict[str, Any], observed: float) -> dict[str, Any]:
    lo, hi = point["loss_90"] if point["applied"] else (None, None)
    return {**point, "covered_90": None if lo is None else bool(lo <= observed <= hi)}


def interval_coverage(points: Sequence[tuple[bool | None, dict[str, Any]]]) -> dict[str, Any]:
    """Counts over held-out points, each (the law's own interval covered it: True/False/None without an
    interval, its calibrated point with "covered_90"): how many there were, and how many each 90%
    interval (uncalibrated, calibrated) was there for and covered; the points left uncalibrated by why."""
    own = [c for c, _ in points if c is not None]
    cal = [p["covered_90"] for _, p in points if p["applied"]]
    why: dict[str, int] = {}
    for _, p in points:
        if not p["applied"]:
            why[p["status"]] = why.get(p["status"], 0) + 1
    return {
        "held_out": len(points),
        "uncalibrated_90": {"with_interval": len(own), "covered": int(sum(own))},
        "calibrated_90": {"with_interval": len(cal), "covered": int(sum(cal)), "not_calibrated": why},
    }


def describe_fit(kind: str, method: str) -> str:
    return f"the {kind} fit by {method}"


def calibrate_backtest(
    result: dict[str, Any], calibration: dict[str, Any], *, method: str, kind: str, fit_method: str
) -> dict[str, Any]:
    """A `delphi.fits.backtest.backtest` result with each held-out budget's calibrated interval beside
    the law's own ("calibrated": `calibrate_point` plus "covered_90"; "predicted_loss" stays the law's),
    the calibration's provenance ("calibration") and, per method (`method`, the --method name),
    `interval_coverage` ("interval_coverage")."""
    key = calibration_key(kind, fit_method)
    budgets = []
    for b in result["budgets"]:
        point = calibrate_point(
            key,
            b["predicted_loss"],
            b["loss_interval_90"],
            b["extrapolation"],
            calibration,
            fit_label=describe_fit(kind, fit_method),
        )
        budgets.append({**b, "calibrated": _with_truth(point, b["observed_best_loss"])})
    coverage = interval_coverage([(b["covered_90"], b["calibrated"]) for b in budgets])
    return {
        **result,
        "budgets": budgets,
        "calibration": _provenance(calibration, result.get("input_sha256")),
        "interval_coverage": {method: coverage},
    }


def calibrate_all_holdouts(
    result: dict[str, Any], calibration: dict[str, Any], fits: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """A `delphi.fits.backtest.all_holdouts` result with every scored row's calibrated interval
    ("calibrated", as `calibrate_backtest`), the provenance and the per-method `interval_coverage`.
    `fits`: method name -> (kind, method) of its fits (a method whose every fit failed has no rows)."""
    rows, per_method = [], {}
    for r in result["rows"]:
        if "error" in r:
            rows.append(r)
            continue
        kind, fit_method = fits.get(r["method"], (r["method"], r["method"]))
        own = None if r["lo_90"] is None else [r["lo_90"], r["hi_90"]]
        point = calibrate_point(
            calibration_key(kind, fit_method),
            r["predicted_loss"],
            own,
            r["extrapolation"],
            calibration,
            fit_label=describe_fit(kind, fit_method),
        )
        row = {**r, "calibrated": _with_truth(point, r["observed_best_loss"])}
        rows.append(row)
        per_method.setdefault(r["method"], []).append((row["covered_90"], row["calibrated"]))
    coverage = {m: interval_coverage(per_method.get(m, [])) for m in dict.fromkeys(r["method"] for r in result["rows"])}
    return {
        **result,
        "rows": rows,
        "calibration": _provenance(calibration, result.get("input_sha256")),
        "interval_coverage": coverage,
    }


def _provenance(calibration: dict[str, Any], input_sha256: str | None) -> dict[str, Any]:
    """`calibration_provenance`, its source check, and whether the backtested table's file is the data
    the calibration was made from ("table_is_calibration_source": its calibrated coverage is then in-sample)."""
    out = calibration_provenance(calibration)
    if "source_check" in calibration:
        out["source_check"] = calibration["source_check"]
    recorded = (calibration.get("inputs") or {}).values() if isinstance(calibration.get("inputs"), dict) else ()
    out["table_is_calibration_source"] = input_sha256 is not None and input_sha256 in recorded
    return out
