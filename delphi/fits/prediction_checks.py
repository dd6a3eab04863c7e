"""What `delphi predict` tells a reader beside the law's number: which point decides (the calibrated
centre or the law's own, delphi.fits.best_point), a fitted parameter on a bound of its search, and
whether the laws a seal cross-checks (gate method_agreement's: the isoFLOP law and VPNLS) disagree
beyond the tolerance on the same table.

The laws are compared on the fit's own table: `--results TABLE` (with the column mapping), else the
table the fit records (its path, query and column mapping) when that file is still there with the
sha256 the fit recorded; otherwise the output says why they were not compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError

# Laws the primary prediction is checked against (gate method_agreement): the isoFLOP frontier is a
# pure power law in C (no asymptote), VPNLS the Chinchilla surface with one. On a ladder spanning one
# decade the two bracket what the data cannot decide: whether the loss is bending toward an E.
CROSS_CHECK_METHODS = ("isoflop", "vpnls")
# `delphi fit` method (or kind) -> the FITTERS name that refits it. A law fitted under a lab's E prior
# is the same law ("vpnls-E-prior" refits as vpnls, with the prior: delphi.prereg.create.refit_options);
# the weighted frontier through the vertices is the asymptotic law.
REFIT_NAMES = {
    "vpnls": "vpnls",
    "approach3": "parametric",
    "approach2": "isoflop",
    "approach1": "envelope",
    "frontier-free-weighted": "asymptotic",
    "frontier-fixed-weighted": "asymptotic",
    "frontier-prior-weighted": "asymptotic",
}


def law_name(fit: Any) -> str:
    """The `delphi.fits.FITTERS` key of the law a fit was made with."""
    return REFIT_NAMES.get(str(fit.method).split("-E-")[0]) or fit.kind


# `predict --tolerance`'s default: a seal's default tolerance (delphi.prereg.create.DEFAULT_TOLERANCE_REL),
# which gate method_agreement applies to the same laws.
AGREEMENT_TOLERANCE_REL = 0.01


def bound_warning(fit: Any) -> str | None:
    """One line when the fit's estimate is not an interior optimum: a parameter on a bound of its
    search (E at 0: the data show no level-off; an exponent at its search limit) or no convergence."""
    status = str(getattr(fit, "status", "ok"))
    at_bound = list((fit.diagnostics or {}).get("at_bound") or [])
    if status == "not_converged":
        return f"the {fit.kind} fit ({fit.method}) did not converge: its estimate is not an optimum"
    if not at_bound:
        return None
    what = [
        f"E = {fit.params['E']:.4g} (at its bound 0: the data show no level-off; pin E or give it a prior, --E/--E-prior)"
        if name == "E"
        else f"{name} = {fit.params.get(name, float('nan')):.4g}"
        for name in at_bound
    ]
    return (
        f"the {fit.kind} fit ({fit.method}) has {', '.join(what)} on a bound of its search: the forecast extrapolates "
        "an edge of the search, not an interior optimum"
    )


def point_choice(fit: Any, calibrated: dict[str, Any] | None, calibration: dict[str, Any] | None) -> dict[str, Any]:
    """The point that decides a prediction (delphi.fits.best_point.decide_point) from what the fit
    records about its table (`diagnostics.table`: whether it is Delphi's own ladder, its features) and
    the prediction's calibrated centre (`calibrate_point`): {decides, why, loss, loss_90}."""
    from delphi.fits import best_point as bp
    from delphi.fits.beyond import record_features
    from delphi.fits.calibration import source_likeness

    record = (fit.diagnostics or {}).get("table")
    features = record_features(record) if record else None
    likeness = source_likeness(features, calibration) if features and calibration is not None else {}
    choice = bp.decide_point(
        bp.PointEvidence(
            delphi_ladder=None if record is None else bool(record.get("ladder_records")),
            calibration_status=None if calibrated is None else calibrated["status"],
            calibration_reason="" if calibrated is None else str(calibrated.get("reason") or ""),
            source_distance=likeness.get("distance"),
            source_reach=likeness.get("reach"),
        )
    )
    out = choice.to_json()
    if choice.decides == bp.CALIBRATED:
        out |= {"loss": calibrated["loss"], "loss_90": calibrated["loss_90"]}
    return out


def fit_table(fit: Any, fit_path: Path, results: Path | None = None, options: Any = None) -> tuple[Any, str | None]:
    """(the table the fit was made on, None) or (None, why it cannot be had): `results` read with
    `options` (delphi.fits.data.TableOptions), else the fit's recorded source, query and column
    mapping where that file still has the recorded sha256."""
    from delphi.fits.data import load_results
    from delphi.hashes import sha256_file

    diag = fit.diagnostics or {}
    convention = diag.get("params_convention") or "nonembedding"
    if results is not None:
        return load_results(results, params_convention=convention, **(options.load_kwargs() if options else {})), None
    source = diag.get("source")
    record = diag.get("table")
    if not source or record is None:
        return None, f"{fit_path} does not record its table's reading; give --results TABLE"
    if not Path(source).is_file():
        return None, f"the fit's table {source} is not here; give --results TABLE"
    if fit.input_sha256 and sha256_file(source) != fit.input_sha256:
        return None, f"the fit's table {source} has changed since the fit (sha256 differs); give --results TABLE"
    dropped = diag.get("dropped") or {}
    columns = {f"{name}_col": col for name, col in (record.get("columns") or {}).items()}
    try:
        table = load_results(
            source,
            query=diag.get("query"),
            params_convention=convention,
            family=fit.family,
            drop_invalid="non_positive" in dropped,
            drop_duplicates="duplicates" in dropped,
            **columns,
        )
    except DelphiError as e:
        return None, f"the fit's table {source} could not be read again ({e})"
    return table, None


def law_comparison(
    fit: Any,
    table: Any,
    predict: Callable[[Any], float],
    tolerance_rel: float,
    calibrate: Callable[[Any, float], float] | None = None,
) -> dict[str, Any]:
    """The seal's cross-check laws (delphi.prereg.create.CROSS_CHECK_METHODS, the primary's own skipped),
    each refitted on `table` (no bootstrap) and asked the same question (`predict(law) -> loss`),
    against the primary's answer. `calibrate(law, loss)`: each law's point where the calibrated
    centre decides (like with like, as gate method_agreement; each law's own point beside it as
    "law_loss"). {"laws": {name: {loss, rel} | {error}}, "primary", "tolerance_rel", "disagree": bool, "text"}."""
    from delphi.fits import FITTERS

    own = float(predict(fit))
    primary = calibrate(fit, own) if calibrate else own
    laws: dict[str, dict[str, Any]] = {}
    for name in CROSS_CHECK_METHODS:
        if name == law_name(fit) or (name == "vpnls" and str(fit.kind) == "parametric"):
            continue
        try:
            other = FITTERS[name](table, n_bootstrap=0)
            other = other.with_family(fit.family) if fit.family is not None else other
            law_loss = float(predict(other))
            loss = calibrate(other, law_loss) if calibrate else law_loss
        except (DelphiError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
            laws[name] = {"error": str(e)}
            continue
        if math.isfinite(loss):
            laws[name] = {"loss": loss, "rel": loss / primary - 1}
            if calibrate:
                laws[name] |= {"law_loss": law_loss, "law_rel": law_loss / own - 1}
    far = {n: r for n, r in laws.items() if "rel" in r and abs(r["rel"]) > tolerance_rel}
    shown = ", ".join(
        f"{n} {r['loss']:.4f} ({r['rel']:+.2%})" if "rel" in r else f"{n}: not fitted ({r['error']})"
        for n, r in laws.items()
    )
    if calibrate and laws:
        shown += "; the laws' own points: " + ", ".join(
            f"{n} {r['law_loss']:.4f} ({r['law_rel']:+.2%} from {own:.4f})" for n, r in laws.items() if "law_loss" in r
        )
    text = (
        f"the laws DISAGREE beyond the {tolerance_rel:.2%} tolerance: {law_name(fit)} {primary:.4f}, {shown}: the table "
        "cannot tell which extrapolation holds (gate method_agreement would refuse a seal)"
        if far
        else f"the laws agree within the {tolerance_rel:.2%} tolerance: {law_name(fit)} {primary:.4f}, {shown}"
        if laws
        else "no other law to compare"
    )
    return {"primary": primary, "laws": laws, "tolerance_rel": tolerance_rel, "disagree": bool(far), "text": text}
