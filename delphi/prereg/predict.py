"""The hero's predicted final loss, before anything is sealed: the law evaluated at the hero (N and D,
or its exact compute), its interval made predictive for one run (the law's scatter and the seed
noise), and, when asked, corrected by the law's error trend at the probes (delphi.fits.probes).
Also each finished run beyond the ladder (dress rehearsal, probes) against the law.

`delphi.prereg.create` assembles and seals the preregistration around this prediction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from delphi.errors import DelphiError
from delphi.fits import best_point as bp
from delphi.fits.backtest import residual_scatter
from delphi.fits.calibration import calibrate_final, calibrated_status
from delphi.fits.data import TableOptions, cell_points, isoflop_rows, load_results, with_anchors
from delphi.fits.e_prior import forecast_at_refits
from delphi.fits.intervals import Z_50 as Z50
from delphi.fits.intervals import Z_90 as Z90
from delphi.fits.intervals import correct_by_design, predictive_interval
from delphi.fits.laws import SURFACES
from delphi.fits.probes import NOISE_SCOPES, correct_by_probes, probe_trend
from delphi.fits.results import load_fit
from delphi.fits.table_files import read_table
from delphi.model.flops import count_params, flops_per_token
from delphi.prereg.evidence import Evidence, PredictionRule
from delphi.prereg.gates import ladder_top_budget, pooled_seed_noise
from delphi.prereg.hero import HeroSpec
from delphi.train.config import load_train_config


def interval_pair(pred: dict, key: str) -> list[float] | None:
    """The [lo, hi] interval under `key` of a prediction, as plain floats; None when it has none."""
    v = pred.get(key)
    return None if v is None else [float(v[0]), float(v[1])]


def final_from_prediction(pred: dict, source: str) -> dict[str, Any]:
    """Normalise a fit's predict() dict to {loss, loss_50, loss_90, source}."""
    if "loss" not in pred:
        raise DelphiError(f"{source}: its prediction has no 'loss'; a fit of a loss law is needed")
    loss = float(pred["loss"])
    i90 = interval_pair(pred, "loss_interval_90")
    i50 = interval_pair(pred, "loss_interval_50")
    note = None
    if i90 is not None and i50 is None:
        # Only a 90% interval: derive the 50% one as if the spread were normal.
        lo, hi = i90
        i50 = [loss - (loss - lo) * Z50 / Z90, loss + (hi - loss) * Z50 / Z90]
        note = "50% interval derived from the fit's 90% interval assuming a normal spread"
    out = {"loss": loss, "loss_50": i50, "loss_90": i90, "source": source}
    if note:
        out["note"] = note
    return out


def law_scatter_nats(fit, fit_table) -> float | None:
    """RMS (nats) of the ladder's seed-averaged points about the law, per residual dof: each cell at
    its own N and D for a law in (N, D); for a law in C (isoFLOP, frontier) each budget's best cell
    against L*(C) (delphi.fits.backtest.residual_scatter)."""
    if fit_table is None or "budget" not in fit_table:
        return None
    if not fit.law_in_nd:
        return residual_scatter(fit, fit_table)
    points, _ = cell_points(with_anchors(fit_table))  # the points the law was fitted to
    residuals = [
        row["loss"]
        - fit.predict(params=row["params"], tokens=row["tokens"], **{t: row[t] for t in fit.law_terms})["loss"]
        for _, row in points.iterrows()
    ]
    dof = len(residuals) - len(fit.params)
    return float(math.sqrt(sum(r * r for r in residuals) / dof)) if dof > 0 else None


def seed_noise_nats(fit, fit_table, scope: str = "pooled") -> float | None:
    """One run's seed sd (nats) under `scope` (NOISE_SCOPES): the fit's pooled per-run seed sd, or
    the within-cell sd pooled over the top isoFLOP budget's cells. None without replicates."""
    if scope not in NOISE_SCOPES:
        raise DelphiError(f"noise scope {scope!r}: expected one of {', '.join(NOISE_SCOPES)}")
    if scope == "pooled":
        seed = fit.diagnostics.seed_noise_nats
    else:
        rows = isoflop_rows(fit_table)
        seed = pooled_seed_noise(rows[rows["budget"] == ladder_top_budget(fit_table)])
    return float(seed) if isinstance(seed, (int, float)) and math.isfinite(seed) else None


def run_noise_nats(fit, fit_table, scope: str = "pooled", n_seeds: int = 1) -> tuple[float | None, dict[str, Any]]:
    """The sd (nats) the outcome adds around the law: the law's scatter about the ladder's points
    (law_scatter_nats) and the seed noise (`seed_noise_nats` under `scope`) of the mean of `n_seeds`
    runs (one run's / sqrt(n_seeds)), in quadrature. The scatter is the law's lack of fit at a
    point, which more seeds of the same run do not average away. None when neither is known."""
    if n_seeds < 1:
        raise DelphiError(f"n_seeds: the outcome is the mean of >= 1 seed, got {n_seeds}")
    scatter = law_scatter_nats(fit, fit_table)
    seed = seed_noise_nats(fit, fit_table, scope)
    parts = [v for v in (scatter, None if seed is None else seed / math.sqrt(n_seeds)) if v is not None]
    info = {"residual_scatter_nats": scatter, "seed_noise_nats": seed, "noise_scope": scope}
    if n_seeds > 1:
        info["n_seeds"] = int(n_seeds)
    return (float(math.hypot(*parts)) if parts else None), info


def predictive(pred: dict, noise: float | None) -> dict:
    """`pred` with its 50% and 90% intervals widened, side by side in quadrature, by z x `noise`: an
    interval for one run's outcome rather than for the law's mean (the backtests' rule)."""
    if noise is None:
        return pred
    out = dict(pred)
    for key, z in (("loss_interval_50", Z50), ("loss_interval_90", Z90)):
        out[key] = list(predictive_interval(float(pred["loss"]), pred.get(key), noise, z))
    return out


def model_family(model_cfg) -> str:
    return "moe" if model_cfg.moe is not None and model_cfg.moe.experts > 1 else "dense"


def fit_family(fit, ladder_families: set[str]) -> str | None:
    """The model family a fit describes: recorded in the fit (from its table's expert counts), else
    the single family of the ladder's runs; None when neither says."""
    if fit.model_family is not None:
        return fit.model_family
    if len(ladder_families) == 1:
        return next(iter(ladder_families))
    return None


def hero_params(model, seq_len: int, convention: str = "nonembedding") -> float:
    """The hero's N counted as the fit counted its ladder's N (fits/allocation.PARAM_CONVENTIONS)."""
    counts = count_params(model)
    if convention == "active":
        return float(counts.active)
    if convention == "fpt6":  # Porian et al. 2024 / Pearce & Song 2024: N = FLOPs per token / 6
        return float(flops_per_token(model, seq_len) / 6)
    return float(counts.nonembedding)


def fit_convention(fit) -> str:
    family = getattr(fit, "family", None)
    return getattr(family, "convention", None) or "nonembedding"


def predict_hero(fit, hero) -> tuple[dict, str]:
    """(the fit's prediction, how) for the hero: `FitResult.predict_run` decides whether the law is
    evaluated at the hero's own N and D or at its exact compute. `hero`: a train config, or a hero
    given as N and D (delphi.prereg.hero.HeroSpec: its N as the table counts it, its C as given)."""
    if isinstance(hero, HeroSpec):
        if fit.law_terms:
            raise DelphiError(
                f"a {fit.kind} law needs the hero's {', '.join(fit.law_terms)}: give the hero as a train config "
                "(--hero HERO.yaml)"
            )
        pred = dict(fit.predict_run(params=hero.params, tokens=hero.tokens, flops=hero.flops))
        how = pred.pop("how")
        return pred, how + (
            f" (N = {hero.params:.4g}, D = {hero.tokens:.4g}, as given)"
            if fit.law_in_nd
            else f" (C = {hero.flops:.4g} FLOPs, {hero.flops_how})"
        )
    convention = fit_convention(fit)
    n = hero_params(hero.model, hero.data.seq_len, convention)
    terms = {}
    if hero.model.moe is not None:
        terms = {"experts": hero.model.moe.experts, "granularity": hero.model.d_ff / hero.model.moe.d_expert}
    flops = hero.flops
    pred = dict(fit.predict_run(params=n, tokens=hero.tokens, flops=flops, **terms))
    how = pred.pop("how")
    if fit.law_in_nd:
        how += f" (N = {n:.4g}, {convention}; D = {hero.tokens:.4g})"
    else:
        how += f" (C = {flops:.4g} FLOPs, exact count, Chinchilla appendix F)"
    return pred, how


def predict_final(
    fit_path: Path,
    hero,
    results: Path | None = None,
    noise_scope: str = "pooled",
    n_seeds: int = 1,
    options: TableOptions | None = None,
) -> tuple[dict, Any]:
    """(final prediction, the loaded fit) for the hero from a fit file written by `delphi fit`; with
    the ladder's `results` (read with `options`: column mapping, query), its intervals are predictive
    for the mean of `n_seeds` runs (`run_noise_nats` under `noise_scope`) and its calibrated version
    is beside it (`final["calibrated"]`). A fit with a lab's E prior says how much of the forecast the
    prior decides (`final["E_prior"]`, delphi.fits.e_prior)."""
    fit = load_fit(fit_path)
    if fit.kind not in SURFACES:
        raise DelphiError(
            f"{fit_path}: a fit of kind {fit.kind!r} cannot predict a final loss (expected one of {', '.join(SURFACES)})"
        )
    try:
        pred, how = predict_hero(fit, hero)
    except (TypeError, ValueError, KeyError) as e:
        raise DelphiError(f"{fit_path}: cannot predict the hero's loss with a {fit.kind!r} fit ({e})") from None
    tables = load_tables(results, fit_convention(fit), options) if results is not None else None
    noise, parts = run_noise_nats(fit, tables[0], noise_scope, n_seeds) if tables is not None else (None, {})
    final = final_from_prediction(predictive(pred, noise), how)
    if noise is not None:
        whose = "one run's" if n_seeds == 1 else f"the mean of {n_seeds} seeds' runs'"
        seed_part = "seed noise" if n_seeds == 1 else f"one run's seed noise / sqrt({n_seeds})"
        final["interval"] = (
            f"the fit's bootstrap interval widened in quadrature by z x {noise:.4g} nats: {whose} "
            f"noise around the law (residual scatter and {seed_part}, {NOISE_SCOPES[noise_scope]}, in quadrature)"
        )
        final |= parts
    if pred.get("allocation"):
        final["allocation"] = pred["allocation"]
    if not math.isfinite(final["loss"]):
        raise DelphiError(f"{fit_path}: the fit predicts a non-finite loss for the hero")
    if tables is not None:  # the interval calibrated for how far beyond the ladder the hero lies
        final["calibrated"] = calibrate_final(fit, final, float(hero.flops), tables[1])
    decided = forecast_at_refits(fit, lambda f: float(predict_hero(f, hero)[0]["loss"]))
    if decided is not None:
        final["E_prior"] = decided
    return final, fit


def score_probes(fit, probe_runs: Sequence[Path], noise: float | None = None) -> dict[str, dict[str, Any]]:
    """Each finished probe (`beyond_ladder_runs`) predicted by `fit` at its own N and D, against its final loss."""
    return {
        name: run_predicted_vs_actual(fit, run, noise) for name, run in beyond_ladder_runs(None, probe_runs).items()
    }


def probe_noise_rel(fit, fit_table, probes: dict[str, dict], noise_scope: str = "pooled") -> float:
    """One probe's relative noise about the probes' error trend: the ladder's seed noise under
    `noise_scope` (the law's scatter about the ladder is what the trend corrects), or the whole run
    noise when no seed noise was measured, relative to the probes' mean loss."""
    noise, parts = run_noise_nats(fit, fit_table, noise_scope)
    nats = parts.get("seed_noise_nats") or noise
    if nats is None:
        raise DelphiError("--probe-correction: the ladder measured no run noise (one seed per cell and no law scatter)")
    return float(nats) / float(np.mean([r["actual"] for r in probes.values()]))


def hero_prediction(evidence: Evidence, hero, rule: PredictionRule) -> tuple[dict, Any]:
    """(final prediction, the loaded fit) for the hero: `predict_final` on the evidence's fit and
    results table, with one run's noise under `rule.noise_scope` (NOISE_SCOPES) and the noise of the
    mean of `rule.n_seeds` runs; with `rule.probe_correction` that prediction corrected by the probes'
    error trend, carried by `rule.probe_carry` (`correct_by_probes`); then, with
    `rule.point_correction` (a `delphi.fits.intervals.PointCorrection`), corrected by the design's
    measured bias (`correct_by_design`). Last, the point that decides (`decide_final_point`): the
    calibrated centre on a table like the calibration's public sources, else the law's own or its
    correction; `final["point"]` says which and why. A table is a Delphi ladder's when the evidence
    names its ladder dir, whatever its columns, else when it holds rung records."""
    final, fit = _hero_prediction(evidence, hero, rule)
    final = final if rule.point_correction is None else correct_by_design(final, rule.point_correction)
    results, options = evidence.results, evidence.options
    ladder = evidence.ladder is not None or (
        load_tables(results, fit_convention(fit), options)[1].attrs.get("ladder_records", False)
        if results is not None
        else None
    )
    return decide_final_point(final, ladder), fit


def decide_final_point(final: dict, delphi_ladder: bool | None) -> dict:
    """`final` with the point that decides it (delphi.fits.best_point.decide_point) in `final["point"]`;
    where the calibrated centre decides, its loss and intervals become the sealed ones and the law's
    own stand beside them (`final["law"]`)."""
    cal = final.get("calibrated") or {}
    corrected = (
        bp.PROBE_CORRECTION
        if final.get("probe_correction")
        else bp.POINT_CORRECTION
        if final.get("point_correction")
        else None
    )
    likeness = cal.get("source_likeness") or {}
    status, reason = calibrated_status(cal)
    choice = bp.decide_point(
        bp.PointEvidence(
            delphi_ladder=delphi_ladder,
            calibration_status=status,
            calibration_reason=reason,
            source_distance=likeness.get("distance"),
            source_reach=likeness.get("reach"),
            corrected_by=corrected,
        )
    )
    out = dict(final) | {"point": choice.to_json()}
    if choice.decides == bp.CALIBRATED:
        out["law"] = {k: final.get(k) for k in ("loss", "loss_50", "loss_90", "source")}
        out |= {
            "loss": float(cal["loss"]),
            "loss_50": list(cal["loss_50"]),
            "loss_90": list(cal["loss_90"]),
            "source": f"{final['source']}; its calibrated centre ({cal['method']} calibration at {cal['factor']:.3g}x the "
            f"table's top budget, delphi.fits.calibration)",
            "interval": (
                f"the calibrated 50% and 90% intervals: the law's own ({final.get('interval') or 'the fit interval'}) "
                f"widened by the calibration's model error at {cal['factor']:.3g}x, around the calibrated centre"
            ),
        }
    return out


def _hero_prediction(evidence: Evidence, hero, rule: PredictionRule) -> tuple[dict, Any]:
    results, options = evidence.results, evidence.options
    final, fit = predict_final(evidence.fit_path, hero, results, rule.noise_scope, rule.n_seeds, options)
    if not rule.probe_correction:
        return final, fit
    if results is None:
        raise DelphiError(
            "--probe-correction: needs the results table (--results or --ladder) to score the law on the probes"
        )
    fit_table, gate_table = load_tables(results, fit_convention(fit), options)
    probes = score_probes(fit, evidence.probe_runs)
    trend = probe_trend(probes, ladder_top_budget(gate_table), rule.probe_carry)
    if trend is None:
        raise DelphiError(
            f"--probe-correction: needs >= 2 finished probes at distinct computes (--probe); got {len(probes)}"
        )
    noise_rel = probe_noise_rel(fit, fit_table, probes, rule.noise_scope)
    return correct_by_probes(final, trend, float(hero.flops), noise_rel), fit


def beyond_ladder_runs(rehearsal_run: Path | None = None, probe_runs: Sequence[Path] = ()) -> dict[str, Path]:
    """The finished runs beyond the ladder, by name: the dress rehearsal and each probe (its dir name)."""
    runs = {"rehearsal": Path(rehearsal_run)} if rehearsal_run is not None else {}
    for run in probe_runs:
        name = Path(run).name
        if name in runs:
            raise DelphiError(
                f"--probe {run}: two runs beyond the ladder are named {name!r}; give each probe its own dir name"
            )
        runs[name] = Path(run)
    return runs


def load_tables(results: Path, convention: str = "nonembedding", options: TableOptions | None = None):
    """(fit table, gate table): the canonical table the fits read (N in `convention`; anchor rungs
    in its attrs; read with `options`: column mapping, query, what to drop), and every completed row,
    anchors included, with every other column of the results table (seeds, cells, health, steps,
    batch, role), matched by run_id where it is unique. A table without unique run ids keeps its other
    columns only where its rows are the file's rows in order (no query, nothing dropped): otherwise
    which row is which cannot be told, and the gates judge its canonical columns alone."""
    options = options or TableOptions()
    fit_table = load_results(results, options, params_convention=convention)
    raw = read_table(results)[1]
    rows = with_anchors(fit_table)
    extra = [c for c in raw.columns if c not in rows.columns]
    if "run_id" in rows.columns and "run_id" in raw.columns and raw["run_id"].is_unique:
        gate_table = rows.merge(raw[["run_id", *extra]].astype({"run_id": str}), on="run_id", how="left")
    elif len(raw) == len(rows) and options.query is None:  # the file's rows, in order (load_results keeps them)
        gate_table = rows.join(raw.loc[raw.index.isin(rows.index), extra], how="left")
    else:
        gate_table = rows.copy()
    gate_table.attrs = dict(rows.attrs)
    return fit_table, gate_table


def run_predicted_vs_actual(fit, run_dir: Path, noise: float | None = None) -> dict[str, Any]:
    """A finished run (the dress rehearsal) predicted by `fit` at its own N and D, against its final
    loss; `noise` (run_noise_nats) makes the interval predictive for one run, as the hero's is."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise DelphiError(f"{run_dir}: no config.yaml; not a run dir")
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        raise DelphiError(f"{run_dir}: no readable summary.json; has the run finished?") from None
    if summary.get("status", "completed") != "completed" or summary.get("val_loss") is None:
        raise DelphiError(f"{run_dir}: status {summary.get('status')!r}, no final val_loss")
    cfg = load_train_config(run_dir / "config.yaml")
    pred, how = predict_hero(fit, cfg)
    pred = predictive(pred, noise)
    actual, predicted = float(summary["val_loss"]), float(pred["loss"])
    i90 = pred.get("loss_interval_90")
    return {
        "run": str(run_dir),
        "compute": float(cfg.flops),
        "predicted": predicted,
        "actual": actual,
        "rel_error": actual / predicted - 1,
        "loss_interval_90": None if i90 is None else [float(i90[0]), float(i90[1])],
        "covered_90": None if i90 is None else bool(i90[0] <= actual <= i90[1]),
        "how": how,
    }
