"""What `delphi predict` tells a reader beside the law's number: which point decides (the calibrated
centre or the law's own, delphi.fits.best_point), a fitted parameter on a bound of its search, how
far beyond the fitted budgets the prediction lies (`extrapolation`), and whether the laws a seal
cross-checks (gate method_agreement's: the isoFLOP law and VPNLS) disagree beyond the tolerance on
the same table. `config_prediction` answers `predict --config` (a run's loss at its own N and D).

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
from delphi.fits import FITTERS
from delphi.fits import best_point as bp
from delphi.fits.allocation import flops_of
from delphi.fits.beyond import record_features
from delphi.fits.calibration import calibrate_point, calibration_key
from delphi.fits.data import TableOptions, load_results
from delphi.fits.method_choice import source_likeness
from delphi.hashes import sha256_file
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import load_train_config

# Laws the primary prediction is checked against (gate method_agreement): the isoFLOP frontier is a
# pure power law in C (no asymptote), VPNLS the Chinchilla surface with one. On a ladder spanning one
# decade the two bracket what the data cannot decide: whether the loss is bending toward an E.
CROSS_CHECK_METHODS = ("isoflop", "vpnls")
# `delphi fit` method (or kind) -> the FITTERS name that refits it. A law fitted under a lab's E prior
# is the same law ("vpnls-E-prior" refits as vpnls, with the prior: delphi.prereg.measure.refit_options);
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


# `predict --tolerance`'s default: a seal's default tolerance (delphi.prereg.evidence.DEFAULT_TOLERANCE_REL),
# which gate method_agreement applies to the same laws.
AGREEMENT_TOLERANCE_REL = 0.01
# `predict` warns beyond this many times the largest fitted compute budget: the published laws
# were backtested at most ~100x beyond their fits; 1,000x is past any evidence.
EXTRAPOLATION_WARN_FACTOR = 1_000.0


def bound_warning(fit: Any) -> str | None:
    """One line when the fit's estimate is not an interior optimum: a parameter on a bound of its
    search (E at 0: the data show no level-off; an exponent at its search limit) or no convergence."""
    status = str(getattr(fit, "status", "ok"))
    at_bound = list(fit.diagnostics.at_bound or [])
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
    record = fit.diagnostics.table
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


def fit_table(
    fit: Any, fit_path: Path, results: Path | None = None, options: TableOptions | None = None
) -> tuple[Any, str | None]:
    """(the table the fit was made on, None) or (None, why it cannot be had): `results` read with
    `options`, else the fit's recorded source, query and column mapping where that file still has
    the recorded sha256."""
    diag = fit.diagnostics
    convention = diag.params_convention or "nonembedding"
    if results is not None:
        return load_results(results, options, params_convention=convention), None
    source = diag.source
    record = diag.table
    if not source or record is None:
        return None, f"{fit_path} does not record its table's reading; give --results TABLE"
    if not Path(source).is_file():
        return None, f"the fit's table {source} is not here; give --results TABLE"
    if fit.input_sha256 and sha256_file(source) != fit.input_sha256:
        return None, f"the fit's table {source} has changed since the fit (sha256 differs); give --results TABLE"
    dropped = diag.dropped or {}
    try:
        options = TableOptions(
            columns=tuple((record.get("columns") or {}).items()),
            query=diag.query,
            drop_invalid="non_positive" in dropped,
            drop_duplicates="duplicates" in dropped,
        )
        table = load_results(source, options, params_convention=convention, family=fit.family)
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


def question(fit, prediction: dict[str, Any], terms: dict[str, Any]):
    """The prediction's question as a function of a law (the fit, a refit of it, another law): the
    compute-optimal loss at C, or a run's loss at its N, D and FLOPs."""
    if prediction.get("config") is None and prediction.get("compute") is not None:
        return lambda law: law.predict(compute=float(prediction["compute"]))["loss"]
    n, d = float(prediction["params"]), float(prediction["tokens"])
    c = float(prediction["compute"]) if prediction.get("compute") is not None else float(flops_of(fit.family, n, d))
    return lambda law: law.predict_run(
        params=n, tokens=d, flops=c, **{k: v for k, v in terms.items() if k in law.law_terms}
    )["loss"]


def calibrated_loss(law, loss: float, factor: float, calibration: dict[str, Any]) -> float:
    """A law's calibrated centre at `factor` (its own point where its calibration does not apply)."""
    point = calibrate_point(calibration_key(law.kind, law.method), loss, None, factor, calibration)
    return float(point["loss"]) if point["applied"] else float(loss)


def extrapolation(fit, prediction: dict[str, Any]) -> dict[str, Any] | None:
    """How far beyond the fitted budgets a prediction lies: its compute over the largest fitted
    compute budget, and a warning past EXTRAPOLATION_WARN_FACTOR. None when the fit does not
    record its budgets (a fit JSON without them and without optima)."""
    if fit.fitted_compute is None:
        return None
    compute = prediction.get("compute")
    if compute is None and prediction.get("params") is not None and prediction.get("tokens") is not None:
        compute = float(flops_of(fit.family, float(prediction["params"]), float(prediction["tokens"])))
    if compute is None:
        return None
    low, high = fit.fitted_compute
    factor = float(compute) / high
    out: dict[str, Any] = {
        "compute": float(compute),
        "fitted_compute": [low, high],
        "factor_over_largest": factor,
        "warn_above_factor": EXTRAPOLATION_WARN_FACTOR,
        "warning": None,
    }
    if factor > EXTRAPOLATION_WARN_FACTOR:
        out["warning"] = (
            f"C={float(compute):.3g} FLOPs is {factor:.3g}x the largest fitted budget ({high:.3g}); "
            f"beyond {EXTRAPOLATION_WARN_FACTOR:,.0f}x the law is untested and this is not a forecast"
        )
    return out


def extrapolation_text(ex: dict[str, Any] | None) -> str:
    """One line: where a prediction lies against the fitted budgets (`extrapolation`)."""
    if ex is None:
        return "extrapolation: unknown (the fit does not record the budgets it was fitted on)"
    factor = ex["factor_over_largest"]
    low, high = ex["fitted_compute"]
    where = (
        "below the fitted budgets"
        if ex["compute"] < low
        else "above the fitted budgets"
        if ex["compute"] > high
        else "inside the fitted budgets"
    )
    return (
        f"extrapolation: C={ex['compute']:.3g} FLOPs is {factor:.3g}x the largest fitted budget "
        f"({ex['fitted_compute'][1]:.3g}; fitted {ex['fitted_compute'][0]:.3g} .. {ex['fitted_compute'][1]:.3g}), {where}"
    )


def config_query(path: Path, convention: str = "nonembedding") -> dict[str, Any]:
    """A train config (a hero) -> its own N (counted as the fit counts it), D, exact training FLOPs
    and the MoE law's expert terms."""

    cfg = load_train_config(path)
    counts = count_params(cfg.model)
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    n = {"nonembedding": counts.nonembedding, "active": counts.active, "fpt6": fpt / 6.0}[convention]
    d = cfg.tokens
    terms = {}
    if cfg.model.moe is not None:
        terms = {"granularity": cfg.model.d_ff / cfg.model.moe.d_expert, "experts": cfg.model.moe.experts}
    return {"params": float(n), "tokens": float(d), "compute": float(fpt * d), "terms": terms}


def config_prediction(fit, path: Path, terms: dict[str, Any]) -> dict[str, Any]:
    """`predict --config`: the loss of that run, at its own N and D where the law can say (laws in N
    and D), else at its exact compute C (laws in C alone: the compute-optimal loss there, plus the
    isoFLOP curvature's price of the config's N off N* where the fit has one). "how" says which;
    N*, D* of a law in C are reported as params_opt, tokens_opt beside the config's own N and D."""
    convention = fit.family.convention if fit.family else fit.diagnostics.params_convention or "nonembedding"
    q = config_query(path, convention)
    terms = {**q["terms"], **terms}
    out = fit.predict_run(
        params=q["params"],
        tokens=q["tokens"],
        flops=q["compute"],
        **{k: v for k, v in terms.items() if k in fit.law_terms},
    )
    how = out.pop("how")
    if not fit.law_in_nd:
        optimum = {}
        for key in [k for k in out if k.split("_interval_")[0] in ("params", "tokens", "tokens_per_param")]:
            base, _, rest = key.partition("_interval_")
            optimum[f"{base}_opt" + (f"_interval_{rest}" if rest else "")] = out.pop(key)
        out.pop("compute", None)
        if "off_optimum_penalty" not in out:
            how += (
                " (the compute-optimal loss at that C: this law has no N and D terms and no curvature law to "
                "price the config's own N and D)"
            )
        out.update({k: v for k, v in optimum.items() if v is not None})  # a frontier law has no N*, D*
    return {
        "config": str(path),
        "params": q["params"],
        "tokens": q["tokens"],
        "compute": q["compute"],
        **out,
        "how": how,
    }
