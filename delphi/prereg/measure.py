"""The gates' evidence measured from the sources (`delphi.prereg.evidence.Evidence`): the primary
law's refits (held-out budgets, leave one budget out), the cross-check laws, the probes and the
rehearsal scored, the LR rule's drift and the recipe check; then every gate judged on them
(`compute_gates`, `delphi.prereg.gates.evaluate_gates`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError
from delphi.fits import FITTERS
from delphi.fits import best_point as bp
from delphi.fits.backtest import backtest as run_backtest
from delphi.fits.calibration import calibrate_backtest, calibrate_point, calibration_key
from delphi.fits.calibration_file import load_checked_calibration
from delphi.fits.e_prior import prior_of
from delphi.fits.prediction_checks import CROSS_CHECK_METHODS, law_name
from delphi.fits.probes import probe_trend
from delphi.ladder.hero import ladder_ranges as spec_ranges
from delphi.ladder.hero import range_scopes, trained_ranges
from delphi.ladder.lr_calibration import merge_reports, rule_drift
from delphi.ladder.recipe_check import read_report
from delphi.ladder.spec import load_ladder_spec
from delphi.prereg import gates as gt
from delphi.prereg.evidence import Evidence, PredictionRule
from delphi.prereg.predict import (
    beyond_ladder_runs,
    fit_convention,
    load_tables,
    predict_hero,
    run_noise_nats,
    run_predicted_vs_actual,
    score_probes,
)


def refit_options(fit) -> dict[str, Any]:
    """What a refit of `fit` keeps besides its law: its E prior (delphi.fits.e_prior), and a frontier
    fit's points; a frontier refit skips the E profile (the gates read its point only)."""
    prior = prior_of(fit)
    options: dict[str, Any] = {} if prior is None else {"E_prior": prior}
    if law_name(fit) == "frontier":
        options |= {
            "points": fit.diagnostics.points if "points" in fit.diagnostics else "min",
            "with_sensitivity": False,
        }
    elif law_name(fit) == "asymptotic":
        options["with_sensitivity"] = False
    return options


def refit_function(fit) -> Callable[[Any], Any]:
    """Refit the same law (no bootstrap) on another table, with the fit's FLOPs family attached."""
    name = law_name(fit)
    return refit_with(
        name,
        getattr(fit, "family", None),
        fit.seed or 0,
        f"a {fit.kind!r} fit (method {fit.method!r})",
        **refit_options(fit),
    )


def refit_with(name: str, family, seed: int = 0, what: str | None = None, **options: Any) -> Callable[[Any], Any]:
    """Fit law `name` (a `delphi.fits.FITTERS` key, no bootstrap, with `options`) on a table, `family` attached."""
    if name not in FITTERS:
        raise DelphiError(f"fit: cannot refit {what or repr(name)} for the gates")

    def refit(table):
        refitted = FITTERS[name](table, n_bootstrap=0, seed=seed, **options)
        return refitted.with_family(family) if family is not None else refitted

    return refit


def cross_check_predictions(
    fit,
    fit_table,
    hero,
    rehearsal_run: Path | None = None,
    probe_runs: Sequence[Path] = (),
    noise_scope: str = "pooled",
    calibrated_at: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Each cross-check method refitted on the ladder (no bootstrap): {method: {"loss",
    "backtest_rel_error", "probes"}} or {method: {"error"}}.

    "loss" is its prediction for the hero's own run (`predict_hero`: a law in (N, D) at the hero's
    N and D; the isoFLOP law at its exact FLOPs plus its curvature's off-optimum penalty). The
    other two are its own errors where the truth is already known: the held-out top budget, and
    each finished run beyond the ladder (`beyond_ladder_runs`: the dress rehearsal, probes) as
    {run: {"rel_error", "noise_rel"}}, "noise_rel" being one run's noise around this law relative
    to the run's loss. They decide whether gate method_agreement counts it: a law the data already
    contradict is no competing explanation. The primary's own law (VPNLS for Approach 3 too) is
    skipped. `calibrated_at` (the hero's extrapolation factor, where the primary's calibrated centre
    decides the seal): each law's point is its own calibrated centre there ("law_loss" beside it),
    so that the gate compares like with like."""
    primary_own = law_name(fit)
    family = getattr(fit, "family", None)
    runs = beyond_ladder_runs(rehearsal_run, probe_runs)
    out: dict[str, dict[str, Any]] = {}
    for name in CROSS_CHECK_METHODS:
        if name == primary_own or (name == "vpnls" and fit.kind == "parametric"):
            continue
        refit = refit_with(name, family, fit.seed or 0)
        try:
            other = refit(fit_table)
            loss = float(predict_hero(other, hero)[0]["loss"])
            held_out = run_backtest(fit_table, refit, family=family)["budgets"]
            noise = run_noise_nats(other, fit_table, noise_scope)[0] or 0.0
            scored = {run: run_predicted_vs_actual(other, path) for run, path in runs.items()}
        except (DelphiError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
            out[name] = {"error": f"not fitted ({e})"}
            continue
        out[name] = {
            "loss": loss if math.isfinite(loss) else None,
            "backtest_rel_error": float(held_out[0]["rel_error"]) if held_out else None,
            "probes": {
                run: {"rel_error": float(r["rel_error"]), "noise_rel": noise / float(r["actual"])}
                for run, r in scored.items()
            },
        }
        if calibrated_at is not None and out[name]["loss"] is not None:
            out[name] |= _calibrated_cross_check(other, out[name]["loss"], calibrated_at)
    return out


def _calibrated_cross_check(fit, loss: float, factor: float) -> dict[str, Any]:
    """A cross-check law's calibrated centre at `factor` (delphi.fits.calibration.calibrate_point), as
    {"loss", "law_loss"}; its own point where its calibration does not apply."""
    point = calibrate_point(calibration_key(fit.kind, fit.method), loss, None, factor, load_checked_calibration())
    return (
        {"loss": float(point["loss"]), "law_loss": loss}
        if point["applied"]
        else {"law_loss": loss, "calibrated": False}
    )


def backtest_of_point(backtest: dict | None, final: dict, fit) -> dict | None:
    """The held-out-budget backtest of the point that decides the seal: where the calibrated centre
    decides (`final["point"]`), each held-out budget is scored at the law's calibrated centre there
    (`calibrate_backtest`; "law_rel_error" keeps the law's own error), as gate backtest reads it."""
    if not backtest or backtest.get("error") or (final.get("point") or {}).get("decides") != bp.CALIBRATED:
        return backtest
    key = (final.get("calibrated") or {}).get("method")
    calibrated = calibrate_backtest(
        backtest, load_checked_calibration(), method=key or fit.method, kind=fit.kind, fit_method=fit.method
    )
    budgets = []
    for b in calibrated["budgets"]:
        c = b["calibrated"]
        if not c["applied"]:
            budgets.append(b)
            continue
        truth = float(b["observed_best_loss"])
        budgets.append(
            b
            | {
                "rel_error": float(c["loss"]) / truth - 1,
                "law_rel_error": b["rel_error"],
                "covered_90": c["covered_90"],
                "point": bp.CALIBRATED,
            }
        )
    return calibrated | {"budgets": budgets}


def ladder_spec_ranges(ladder: Path | None, gate_table) -> dict | None:
    """The hero's ranges from the ladder's own spec when the ladder dir holds it: {"ranges" (judged,
    delphi.ladder.hero.ladder_ranges), "range_scopes", "trained_ranges"}, the GateInputs fields;
    None (ranges from the results table) otherwise."""
    if ladder is None or not (Path(ladder) / "ladder.yaml").is_file():
        return None
    try:
        spec = load_ladder_spec(Path(ladder) / "ladder.yaml")
        return {
            "ranges": spec_ranges(spec, gate_table),
            "range_scopes": range_scopes(spec),
            "trained_ranges": trained_ranges(spec, gate_table),
        }
    except DelphiError:
        return None


def lr_drift_from(lr_calibration: Sequence[Path] | None, ladder: Path | None) -> list[dict] | None:
    """The ladder's LR rule (its pinned spec) against `lr-calibrate` reports; None without any."""
    if not lr_calibration:
        return None
    spec_path = Path(ladder) / "ladder.yaml" if ladder is not None else None
    if spec_path is None or not spec_path.is_file():
        raise DelphiError(
            f"--lr-calibration: needs the ladder dir (--ladder) whose ladder.yaml holds the LR rule; got {ladder}"
        )
    return rule_drift(merge_reports(list(lr_calibration)), load_ladder_spec(spec_path))


def compute_gates(
    fit, evidence: Evidence, hero, final: dict, rule: PredictionRule, thresholds: gt.GateThresholds
) -> list[gt.Gate]:
    """Evaluate every gate for the hero on `evidence`: refit the backtest (when the evidence has
    none), the leave-one-budget-out laws and the cross-check laws (scored on the dress rehearsal's
    run dir and the finished probes too); gate lr_transfer when an `lr-calibrate` report is given;
    gate probes (the primary law at each probe) when probes are given. `final` is the prediction
    `hero_prediction` made under `rule`: with `rule.probe_correction` each leave-one-budget-out law
    is corrected by its own errors at the probes; `rule.noise_scope` (NOISE_SCOPES) sets one run's
    noise at the probes and in the cross-checks; with `rule.point_correction` each
    leave-one-budget-out law is corrected by the same factor, so the gate compares like with like;
    where the calibrated centre decides (`final["point"]`), so is each refit by the same
    calibration, the backtest scores the calibrated centre and the cross-checks are their own
    calibrated centres. A table that is not a Delphi ladder's (no ladder dir, no rung records) is
    external: the gates it cannot hold the evidence for are not applicable (delphi.prereg.gates)."""
    lr_drift = lr_drift_from(evidence.lr_calibration, evidence.ladder)
    recipe = read_report(evidence.recipe_check)
    probe_runs = evidence.probe_runs
    if evidence.results is None:
        if probe_runs:
            raise DelphiError(
                "--probe: needs the results table (--results or --ladder) to score the laws on the probes"
            )
        inputs = gt.GateInputs(
            fit=fit,
            table=None,
            final=final,
            hero=gt.hero_facts(hero),
            backtest=evidence.backtest,
            rehearsal=evidence.rehearsal,
            lr_drift=lr_drift,
            recipe_check=recipe,
        )
        return gt.evaluate_gates(inputs, thresholds)
    fit_table, gate_table = load_tables(evidence.results, fit_convention(fit), evidence.options)
    external = evidence.ladder is None and not gate_table.attrs.get("ladder_records", False)
    noise = run_noise_nats(fit, fit_table, rule.noise_scope)[0] if probe_runs else None
    probes = score_probes(fit, probe_runs, noise)
    refit = refit_function(fit)
    backtest = evidence.backtest
    if backtest is None:
        try:
            backtest = run_backtest(fit_table, refit, family=getattr(fit, "family", None))
        except (DelphiError, ValueError) as e:
            backtest = {"error": str(e)}
    calibrated = (final.get("point") or {}).get("decides") == bp.CALIBRATED
    point_factor = float(final["loss"]) / float(final["law"]["loss"]) if calibrated else 1.0

    def hero_loss(f) -> float:
        loss = float(predict_hero(f, hero)[0]["loss"])
        trend = (
            probe_trend(score_probes(f, probe_runs), gt.ladder_top_budget(gate_table), rule.probe_carry)
            if rule.probe_correction
            else None
        )
        loss = loss * (1 + trend.at(float(hero.flops))) if trend is not None else loss
        loss = loss * point_factor
        return loss * (1 + rule.point_correction.rel) if rule.point_correction is not None else loss

    lobo = gt.leave_one_budget_out(fit_table, refit, hero_loss)
    cross = cross_check_predictions(
        fit,
        fit_table,
        hero,
        evidence.rehearsal_run,
        probe_runs,
        rule.noise_scope,
        calibrated_at=final["calibrated"]["factor"] if calibrated else None,
    )
    inputs = gt.GateInputs(
        fit=fit,
        table=gate_table,
        final=final,
        hero=gt.hero_facts(hero),
        backtest=backtest_of_point(backtest, final, fit),
        lobo=lobo,
        rehearsal=evidence.rehearsal,
        **(ladder_spec_ranges(evidence.ladder, gate_table) or {}),
        cross_checks=cross,
        lr_drift=lr_drift,
        probes=probes,
        probe_correction=rule.probe_correction,
        probe_carry=rule.probe_carry,
        recipe_check=recipe,
        external=external,
    )
    return gt.evaluate_gates(inputs, thresholds)
