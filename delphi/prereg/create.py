"""Build a preregistration from a fit, a hero config and (optionally) the ladder's curves.

`build_prereg` is pure: it takes the final-loss prediction, the trajectory and the
provenance and returns the sealed document. `create_prereg` does the I/O around
it (load the fit and hero, hash the inputs, ask git) and validates everything
before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import json
import math
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import delphi
from delphi.errors import CheckFailed, DelphiError
from delphi.fits.backtest import NOISE_SCOPES, PROBE_CARRIES, Z_50 as Z50, Z_90 as Z90
from delphi.fits.data import isoflop_rows
from delphi.io import atomic_write_json, read_json, sha256_file
from delphi.prereg import format as fmt

# docs/design.md §9: the project's goal is a hero within 1% of its prediction.
DEFAULT_TOLERANCE_REL = 0.01


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_utc(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 UTC stamp written by `utc_now`."""
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def git_state(repo: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the toolkit's checkout (None when not a git checkout)."""
    repo = repo or Path(delphi.__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"git_commit": None, "git_dirty": None}
        status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=30)
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": None, "git_dirty": None}


# --------------------------------------------------------------------------- final prediction


def _interval(pred: dict, key: str) -> list[float] | None:
    v = pred.get(key)
    return None if v is None else [float(v[0]), float(v[1])]


def final_from_prediction(pred: dict, source: str) -> dict[str, Any]:
    """Normalise a fit's predict() dict to {loss, loss_50, loss_90, source}."""
    if "loss" not in pred:
        raise DelphiError(f"{source}: its prediction has no 'loss'; a fit of a loss law is needed")
    loss = float(pred["loss"])
    i90 = _interval(pred, "loss_interval_90")
    i50 = _interval(pred, "loss_interval_50")
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
    from delphi.fits.backtest import residual_scatter
    from delphi.fits.data import cell_points, with_anchors

    if fit_table is None or "budget" not in fit_table:
        return None
    if not fit.law_in_nd:
        return residual_scatter(fit, fit_table)
    points, _ = cell_points(with_anchors(fit_table))  # the points the law was fitted to
    residuals = [row["loss"] - fit.predict(params=row["params"], tokens=row["tokens"], **{t: row[t] for t in fit.law_terms})["loss"]
                 for _, row in points.iterrows()]
    dof = len(residuals) - len(fit.params)
    return float(math.sqrt(sum(r * r for r in residuals) / dof)) if dof > 0 else None


def seed_noise_nats(fit, fit_table, scope: str = "pooled") -> float | None:
    """One run's seed sd (nats) under `scope` (NOISE_SCOPES): the fit's pooled per-run seed sd, or
    the within-cell sd pooled over the top isoFLOP budget's cells. None without replicates."""
    from delphi.prereg.gates import ladder_top_budget, pooled_seed_noise

    if scope not in NOISE_SCOPES:
        raise DelphiError(f"noise scope {scope!r}: expected one of {', '.join(NOISE_SCOPES)}")
    if scope == "pooled":
        seed = (fit.diagnostics or {}).get("seed_noise_nats")
    else:
        rows = isoflop_rows(fit_table)
        seed = pooled_seed_noise(rows[rows["budget"] == ladder_top_budget(fit_table)])
    return float(seed) if isinstance(seed, (int, float)) and math.isfinite(seed) else None


def run_noise_nats(fit, fit_table, scope: str = "pooled") -> tuple[float | None, dict[str, Any]]:
    """The sd (nats) one run adds around the law: the law's scatter about the ladder's points
    (law_scatter_nats) and one run's seed noise (`seed_noise_nats` under `scope`), in quadrature.
    None when neither is known."""
    scatter = law_scatter_nats(fit, fit_table)
    seed = seed_noise_nats(fit, fit_table, scope)
    parts = [v for v in (scatter, seed) if v is not None]
    info = {"residual_scatter_nats": scatter, "seed_noise_nats": seed, "noise_scope": scope}
    return (float(math.hypot(*parts)) if parts else None), info


def predictive(pred: dict, noise: float | None) -> dict:
    """`pred` with its 50% and 90% intervals widened, side by side in quadrature, by z x `noise`: an
    interval for one run's outcome rather than for the law's mean (the backtests' rule)."""
    from delphi.fits.backtest import predictive_interval

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
    from delphi.model.flops import count_params, flops_per_token

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
    evaluated at the hero's own N and D or at its exact compute."""
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


def predict_final(fit_path: Path, hero, results: Path | None = None, noise_scope: str = "pooled") -> tuple[dict, Any]:
    """(final prediction, the loaded fit) for the hero from a fit file written by `delphi fit`; with
    the ladder's `results`, its intervals are predictive for one run (`run_noise_nats` under `noise_scope`)."""
    from delphi.fits.laws import SURFACES
    from delphi.fits.results import load_fit

    fit = load_fit(fit_path)
    if fit.kind not in SURFACES:
        raise DelphiError(f"{fit_path}: a fit of kind {fit.kind!r} cannot predict a final loss (expected one of {', '.join(SURFACES)})")
    try:
        pred, how = predict_hero(fit, hero)
    except (TypeError, ValueError, KeyError) as e:
        raise DelphiError(f"{fit_path}: cannot predict the hero's loss with a {fit.kind!r} fit ({e})") from None
    noise, parts = (run_noise_nats(fit, load_tables(results, fit_convention(fit))[0], noise_scope)
                    if results is not None else (None, {}))
    final = final_from_prediction(predictive(pred, noise), how)
    if noise is not None:
        final["interval"] = (f"the fit's bootstrap interval widened in quadrature by z x {noise:.4g} nats: one run's "
                             f"noise around the law (residual scatter and seed noise, {NOISE_SCOPES[noise_scope]}, in quadrature)")
        final |= parts
    if pred.get("allocation"):
        final["allocation"] = pred["allocation"]
    if not math.isfinite(final["loss"]):
        raise DelphiError(f"{fit_path}: the fit predicts a non-finite loss for the hero")
    return final, fit


def score_probes(fit, probe_runs: Sequence[Path], noise: float | None = None) -> dict[str, dict[str, Any]]:
    """Each finished probe (`beyond_ladder_runs`) predicted by `fit` at its own N and D, against its final loss."""
    return {name: run_predicted_vs_actual(fit, run, noise) for name, run in beyond_ladder_runs(None, probe_runs).items()}


# How a sealed assumption says the law's error continues beyond the probes, per carry (PROBE_CARRIES).
CARRY_ASSUMPTION = {"linear": "linearly in log10 C", "local_slope": PROBE_CARRIES["local_slope"]}


def correct_by_probes(final: dict, trend, hero_compute: float, noise_rel: float) -> dict[str, Any]:
    """`final` x (1 + the probes' error trend carried to the hero), its intervals moved with it and
    widened, in quadrature, by z x the carried error's sd when each probe is one run of relative sd
    `noise_rel` (`delphi.fits.backtest.ProbeTrend.correct`). Why: the isoFLOP law's error grew with
    distance in the fifth edition (-1.99%, +2.96%, +8.69% at 3x, 10x, 30x); the trend of its first
    two probes, carried to 30x, put the hero at 1.0029 against an actual 1.0142 (+1.13%;
    paper/v5/second_opinions.csv)."""
    carried, sd = trend.at(hero_compute), trend.sd_at(hero_compute, noise_rel)
    out = dict(final) | {"loss": float(final["loss"]) * (1 + carried)}
    for key, z in (("loss_50", Z50), ("loss_90", Z90)):
        interval = trend.correct(float(final["loss"]), final.get(key), hero_compute, noise_rel, z)[1]
        out[key] = None if interval is None else list(interval)
    out["uncorrected"] = {k: final.get(k) for k in ("loss", "loss_50", "loss_90", "source")}
    rule = ("least squares linear in log10(C / top budget)" if trend.carry == "linear" else
            f"{PROBE_CARRIES[trend.carry]} in log10(C / top budget)")
    out["probe_correction"] = {
        "rule": f"primary law x (1 + its relative error at the probes, {rule}, carried to the hero's exact FLOPs)",
        "carry": trend.carry,
        "carried_rel": carried, "carried_sd_rel": sd, "noise_rel": noise_rel, "slope_per_decade": trend.slope,
        "intercept": trend.intercept, "top_budget": trend.top_budget,
        "probes": {n: {"log10_multiple": x, "rel_error": e} for n, x, e in zip(trend.names, trend.x, trend.errors)}}
    out["source"] = f"{final['source']}; x (1 {carried:+.2%}), the probes' error trend carried to the hero"
    out["interval"] = (f"{final.get('interval') or 'the fit interval'}; moved by the correction and widened in quadrature "
                       f"by z x {sd:.2%} of the loss: the carried error's sd for probes of {noise_rel:.2%} noise each")
    return out


def correction_text(final: dict, actual: float | None, *, primary_law: str) -> dict[str, str]:
    """How the sealed number came from the primary law: as it is, or corrected by the law's error
    trend at the probes (`delphi.prereg.create.correct_by_probes`), and what the law alone would
    have scored."""
    correction = final.get("probe_correction")
    if correction is None:
        return {"prediction_rule": f"made the law they confirmed, {primary_law}, the primary one",
                "correction_sentence": f"The sealed number is {primary_law}'s own prediction."}
    law, sealed = float(final["uncorrected"]["loss"]), float(final["loss"])
    errors = ", ".join(f"{p['rel_error']:+.2%} at {10 ** p['log10_multiple']:.0f}x"
                       for p in sorted(correction["probes"].values(), key=lambda p: p["log10_multiple"]))
    outcome = "" if actual is None else (f" Against the law alone the hero's error would have been {float(actual) / law - 1:+.2%}; "
                                         f"against the sealed number it is {float(actual) / sealed - 1:+.2%}.")
    return {"prediction_rule": f"corrected the primary law, {primary_law}, by its error trend at them",
            "correction_sentence": (
                f"The sealed number is not the law's own: the law predicted {law:.4f} at the hero. Its relative error at the "
                f"probes ({errors}), {PROBE_CARRIES[correction.get('carry', 'linear')]} ({correction['slope_per_decade']:+.1%} per decade), carried to "
                f"the hero gives {correction['carried_rel']:+.2%} with an sd of {correction['carried_sd_rel']:.2%} (each probe "
                f"one run of {correction['noise_rel']:.2%} noise), so the preregistration sealed {sealed:.4f} = {law:.4f} x "
                f"(1 {correction['carried_rel']:+.2%}), its interval widened by that sd in quadrature.{outcome}")}


def probe_noise_rel(fit, fit_table, probes: dict[str, dict], noise_scope: str = "pooled") -> float:
    """One probe's relative noise about the probes' error trend: the ladder's seed noise under
    `noise_scope` (the law's scatter about the ladder is what the trend corrects), or the whole run
    noise when no seed noise was measured, relative to the probes' mean loss."""
    noise, parts = run_noise_nats(fit, fit_table, noise_scope)
    nats = parts.get("seed_noise_nats") or noise
    if nats is None:
        raise DelphiError("--probe-correction: the ladder measured no run noise (one seed per cell and no law scatter)")
    return float(nats) / float(np.mean([r["actual"] for r in probes.values()]))


def hero_prediction(fit_path: Path, hero, results: Path | None = None, probe_runs: Sequence[Path] = (),
                    probe_correction: bool = False, probe_carry: str = "linear",
                    noise_scope: str = "pooled") -> tuple[dict, Any]:
    """(final prediction, the loaded fit) for the hero: `predict_final`, and with `probe_correction` that
    prediction corrected by the probes' error trend, carried by `probe_carry` (`correct_by_probes`);
    one run's noise under `noise_scope` (NOISE_SCOPES)."""
    from delphi.fits.backtest import probe_trend
    from delphi.prereg import gates as gt

    final, fit = predict_final(fit_path, hero, results, noise_scope)
    if not probe_correction:
        return final, fit
    if results is None:
        raise DelphiError("--probe-correction: needs the results table (--results or --ladder) to score the law on the probes")
    fit_table, gate_table = load_tables(results, fit_convention(fit))
    probes = score_probes(fit, probe_runs)
    trend = probe_trend(probes, gt.ladder_top_budget(gate_table), probe_carry)
    if trend is None:
        raise DelphiError(f"--probe-correction: needs >= 2 finished probes at distinct computes (--probe); got {len(probes)}")
    return correct_by_probes(final, trend, float(hero.flops), probe_noise_rel(fit, fit_table, probes, noise_scope)), fit


# --------------------------------------------------------------------------- assembly


def bpb_from_loss(final: dict, bpb_per_nat: float | None) -> dict:
    """Add bpb, bpb_50, bpb_90 by the ladder's bytes-per-token ratio (a constant per tokenizer)."""
    if bpb_per_nat is None:
        return final
    scale = lambda v: None if v is None else [x * bpb_per_nat for x in v]  # noqa: E731
    return final | {"bpb": final["loss"] * bpb_per_nat, "bpb_50": scale(final["loss_50"]), "bpb_90": scale(final["loss_90"])}


def trajectory_from_final(final: dict, hero) -> dict:
    """A one-point trajectory (no ladder curves given): the final prediction at the last step."""
    lo50, hi50 = final["loss_50"] or (final["loss"],) * 2
    lo90, hi90 = final["loss_90"] or (final["loss"],) * 2
    point = {"step": hero.steps, "tokens": hero.tokens, "loss": final["loss"], "lo50": lo50, "hi50": hi50, "lo90": lo90, "hi90": hi90}
    return {"model": None, "points": [point], "note": "no ladder curves given: only the final point is predicted"}


def build_prereg(
    *,
    prereg_id: str,
    hero_config: dict,
    hero_summary: dict,
    final: dict,
    trajectory: dict,
    provenance: dict,
    tolerance_rel: float = DEFAULT_TOLERANCE_REL,
    author: str | None = None,
    rationale: str = "",
    assumptions: list[str] | None = None,
    created: str | None = None,
    toolkit: dict | None = None,
    gates: list[dict] | None = None,
    forced: bool = False,
) -> dict:
    """Assemble and seal a preregistration document (pure apart from the defaults' clock and git).

    `gates` (Gate.to_json() dicts) and `forced` are sealed with the prediction: a preregistration
    sealed with --force over failing gates says so in every verdict."""
    if not (0 < tolerance_rel < 1):
        raise DelphiError(f"tolerance: must be in (0, 1), got {tolerance_rel}")
    doc = {
        "schema_version": fmt.SCHEMA_VERSION,
        "id": prereg_id,
        "created": created or utc_now(),
        "author": author or _default_author(),
        "toolkit": toolkit or {"name": "delphi", "version": delphi.__version__, **git_state()},
        "provenance": provenance,
        "hero": {"config": hero_config, **hero_summary},
        "prediction": {"final": final, "trajectory": trajectory},
        "decision": {
            "tolerance_rel": float(tolerance_rel),
            "rule": (
                f"passed if the hero's final val_loss is within {tolerance_rel:.2%} (relative) of prediction.final.loss; "
                "otherwise failed. A run that diverges or fails is failed. Whether the 50%/90% intervals covered "
                "the outcome is reported but does not decide. While training: on-track if the latest eval point is "
                "inside the trajectory's 90% band or within the tolerance of its median, else deviating."
            ),
        },
        "rationale": rationale,
        "assumptions": list(assumptions or []),
        "gates": list(gates or []),
        "forced": bool(forced),
    }
    return fmt.seal(_plain(doc))


def _default_author() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"


def _plain(obj: Any) -> Any:
    """Plain Python (lists, floats, ints) so the YAML and canonical JSON agree exactly."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        if not math.isfinite(v):
            raise DelphiError(f"preregistration: non-finite number {v}")
        return v
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _ladder_bpb_per_nat(run_dirs: list[Path]) -> float | None:
    from delphi.train.rundir import read_metrics

    ratios = []
    for run in run_dirs:
        for row in reversed(read_metrics(run)):
            if row.get("val_loss") and row.get("val_bpb"):
                ratios.append(row["val_bpb"] / row["val_loss"])
                break
    return float(np.median(ratios)) if ratios else None


def gates_path(out: Path) -> Path:
    """NAME.yaml -> NAME.gates.json beside it: the gate report, written whether or not the file is sealed."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".yaml").removesuffix(".yml") + ".gates.json")


# `delphi fit` method (or kind) -> the FITTERS name that refits it.
REFIT_NAMES = {"vpnls": "vpnls", "approach3": "parametric", "approach2": "isoflop", "approach1": "envelope"}


def law_name(fit) -> str:
    """The `delphi.fits.FITTERS` key of the law a fit was made with."""
    return REFIT_NAMES.get(fit.method) or fit.kind


def refit_function(fit) -> Callable[[Any], Any]:
    """Refit the same law (no bootstrap) on another table, with the fit's FLOPs family attached."""
    name = law_name(fit)
    return refit_with(name, getattr(fit, "family", None), fit.seed or 0, f"a {fit.kind!r} fit (method {fit.method!r})")


def refit_with(name: str, family, seed: int = 0, what: str | None = None) -> Callable[[Any], Any]:
    """Fit law `name` (a `delphi.fits.FITTERS` key, no bootstrap) on a table, `family` attached."""
    from delphi.fits import FITTERS

    if name not in FITTERS:
        raise DelphiError(f"fit: cannot refit {what or repr(name)} for the gates")

    def refit(table):
        refitted = FITTERS[name](table, n_bootstrap=0, seed=seed)
        return refitted.with_family(family) if family is not None else refitted

    return refit


# Laws the primary prediction is checked against (gate method_agreement): the isoFLOP frontier is a
# pure power law in C (no asymptote), VPNLS the Chinchilla surface with one. On a ladder spanning one
# decade the two bracket what the data cannot decide: whether the loss is bending toward an E.
CROSS_CHECK_METHODS = ("isoflop", "vpnls")


def beyond_ladder_runs(rehearsal_run: Path | None = None, probe_runs: Sequence[Path] = ()) -> dict[str, Path]:
    """The finished runs beyond the ladder, by name: the dress rehearsal and each probe (its dir name)."""
    runs = {"rehearsal": Path(rehearsal_run)} if rehearsal_run is not None else {}
    for run in probe_runs:
        name = Path(run).name
        if name in runs:
            raise DelphiError(f"--probe {run}: two runs beyond the ladder are named {name!r}; give each probe its own dir name")
        runs[name] = Path(run)
    return runs


def cross_check_predictions(fit, fit_table, hero, rehearsal_run: Path | None = None,
                            probe_runs: Sequence[Path] = (), noise_scope: str = "pooled") -> dict[str, dict[str, Any]]:
    """Each cross-check method refitted on the ladder (no bootstrap): {method: {"loss",
    "backtest_rel_error", "probes"}} or {method: {"error"}}.

    "loss" is its prediction for the hero's own run (`predict_hero`: a law in (N, D) at the hero's
    N and D; the isoFLOP law at its exact FLOPs plus its curvature's off-optimum penalty). The
    other two are its own errors where the truth is already known: the held-out top budget, and
    each finished run beyond the ladder (`beyond_ladder_runs`: the dress rehearsal, probes) as
    {run: {"rel_error", "noise_rel"}}, "noise_rel" being one run's noise around this law relative
    to the run's loss. They decide whether gate method_agreement counts it: a law the data already
    contradict is no competing explanation. The primary's own law (VPNLS for Approach 3 too) is
    skipped."""
    from delphi.fits import backtest as run_backtest

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
        out[name] = {"loss": loss if math.isfinite(loss) else None,
                     "backtest_rel_error": float(held_out[0]["rel_error"]) if held_out else None,
                     "probes": {run: {"rel_error": float(r["rel_error"]), "noise_rel": noise / float(r["actual"])}
                                for run, r in scored.items()}}
    return out


def load_tables(results: Path, convention: str = "nonembedding"):
    """(fit table, gate table): the canonical table the fits read (N in `convention`; anchor rungs
    in its attrs), and every completed row, anchors included, with every other column of the
    results CSV (seeds, cells, health, steps, batch, role), matched by run_id where it is unique."""
    import pandas as pd

    from delphi.fits import load_results
    from delphi.fits.data import with_anchors

    fit_table = load_results(results, params_convention=convention)
    try:
        raw = pd.read_csv(results)
    except (UnicodeDecodeError, pd.errors.ParserError) as e:
        raise DelphiError(f"{results}: not a readable CSV ({e})") from None
    rows = with_anchors(fit_table)
    extra = [c for c in raw.columns if c not in rows.columns]
    if "run_id" in rows.columns and "run_id" in raw.columns and raw["run_id"].is_unique:
        gate_table = rows.merge(raw[["run_id", *extra]].astype({"run_id": str}), on="run_id", how="left")
    else:  # an external table without unique run ids: its rows in order (load_results keeps them)
        gate_table = rows.join(raw.loc[raw.index.isin(rows.index), extra], how="left")
    gate_table.attrs = dict(rows.attrs)
    return fit_table, gate_table


def run_predicted_vs_actual(fit, run_dir: Path, noise: float | None = None) -> dict[str, Any]:
    """A finished run (the dress rehearsal) predicted by `fit` at its own N and D, against its final
    loss; `noise` (run_noise_nats) makes the interval predictive for one run, as the hero's is."""
    from delphi.train.config import load_train_config

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
    return {"run": str(run_dir), "compute": float(cfg.flops),
            "predicted": predicted, "actual": actual, "rel_error": actual / predicted - 1,
            "loss_interval_90": None if i90 is None else [float(i90[0]), float(i90[1])],
            "covered_90": None if i90 is None else bool(i90[0] <= actual <= i90[1]), "how": how}


def ladder_spec_ranges(ladder: Path | None, gate_table) -> dict | None:
    """The hero's ranges from the ladder's own spec (delphi.ladder.plan.ladder_ranges) when the ladder dir
    holds it; None (ranges from the results table) otherwise."""
    if ladder is None or not (Path(ladder) / "ladder.yaml").is_file():
        return None
    try:
        from delphi.ladder.plan import ladder_ranges
        from delphi.ladder.spec import load_ladder_spec

        return ladder_ranges(load_ladder_spec(Path(ladder) / "ladder.yaml"), gate_table)
    except (ImportError, DelphiError):
        return None


def lr_drift_from(lr_calibration: list[Path] | None, ladder: Path | None) -> list[dict] | None:
    """The ladder's LR rule (its pinned spec) against `lr-calibrate` reports; None without any."""
    if not lr_calibration:
        return None
    from delphi.ladder.lr_calibration import merge_reports, rule_drift
    from delphi.ladder.spec import load_ladder_spec

    spec_path = Path(ladder) / "ladder.yaml" if ladder is not None else None
    if spec_path is None or not spec_path.is_file():
        raise DelphiError(f"--lr-calibration: needs the ladder dir (--ladder) whose ladder.yaml holds the LR rule; got {ladder}")
    return rule_drift(merge_reports(list(lr_calibration)), load_ladder_spec(spec_path))


def compute_gates(fit, *, results: Path | None, hero, final: dict, thresholds, backtest: dict | None = None,
                  rehearsal: dict | None = None, rehearsal_run: Path | None = None, ladder: Path | None = None,
                  lr_calibration: list[Path] | None = None, probe_runs: Sequence[Path] = (),
                  probe_correction: bool = False, probe_carry: str = "linear", noise_scope: str = "pooled",
                  recipe_check: Path | None = None) -> list:
    """Evaluate every gate for the hero: refit the backtest (when not given), the leave-one-budget-out
    laws and the cross-check laws (scored on the dress rehearsal's run dir `rehearsal_run` and the
    finished `probe_runs` too); gate lr_transfer when an `lr-calibrate` report is given; gate probes
    (the primary law at each probe) when probes are given. With `probe_correction`, `final` is the
    corrected prediction (`hero_prediction`) and each leave-one-budget-out law is corrected by its
    own errors at the probes. `noise_scope` (NOISE_SCOPES) sets one run's noise at the probes and
    in the cross-checks."""
    from delphi.fits import backtest as run_backtest
    from delphi.fits.backtest import probe_trend
    from delphi.prereg import gates as gt

    lr_drift = lr_drift_from(lr_calibration, ladder)
    from delphi.ladder.recipe_check import read_report

    recipe = read_report(recipe_check)  # gate recipe (issue 29)
    if results is None:
        if probe_runs:
            raise DelphiError("--probe: needs the results table (--results or --ladder) to score the laws on the probes")
        return gt.evaluate_gates(fit=fit, table=None, final=final, hero=gt.hero_facts(hero), thresholds=thresholds,
                                 backtest=backtest, rehearsal=rehearsal, lr_drift=lr_drift, recipe_check=recipe)
    fit_table, gate_table = load_tables(results, fit_convention(fit))
    noise = run_noise_nats(fit, fit_table, noise_scope)[0] if probe_runs else None
    probes = score_probes(fit, probe_runs, noise)
    refit = refit_function(fit)
    if backtest is None:
        import inspect

        kwargs = {"family": getattr(fit, "family", None)} if "family" in inspect.signature(run_backtest).parameters else {}
        try:
            backtest = run_backtest(fit_table, refit, **kwargs)
        except (DelphiError, ValueError) as e:
            backtest = {"error": str(e)}

    def hero_loss(f) -> float:
        loss = float(predict_hero(f, hero)[0]["loss"])
        trend = (probe_trend(score_probes(f, probe_runs), gt.ladder_top_budget(gate_table), probe_carry)
                 if probe_correction else None)
        return loss * (1 + trend.at(float(hero.flops))) if trend is not None else loss

    lobo = gt.leave_one_budget_out(fit_table, refit, hero_loss)
    return gt.evaluate_gates(fit=fit, table=gate_table, final=final, hero=gt.hero_facts(hero), thresholds=thresholds,
                             backtest=backtest, lobo=lobo, rehearsal=rehearsal, ranges=ladder_spec_ranges(ladder, gate_table),
                             cross_checks=cross_check_predictions(fit, fit_table, hero, rehearsal_run, probe_runs, noise_scope),
                             lr_drift=lr_drift, probes=probes, probe_correction=probe_correction, probe_carry=probe_carry,
                             recipe_check=recipe)


def create_prereg(
    fit_path: Path,
    hero_path: Path,
    out: Path,
    *,
    ladder: Path | None = None,
    results: Path | None = None,
    curve_fit_path: Path | None = None,
    tolerance_rel: float = DEFAULT_TOLERANCE_REL,
    author: str | None = None,
    rationale: str = "",
    assumptions: list[str] | None = None,
    bootstrap: int = 200,
    seed: int = 0,
    force: bool = False,
    thresholds=None,
    backtest: dict | None = None,
    rehearsal_run: Path | None = None,
    rehearsal: dict | None = None,
    lr_calibration: list[Path] | None = None,
    probe_runs: Sequence[Path] = (),
    probe_correction: bool = False,
    probe_carry: str = "linear",
    noise_scope: str = "pooled",
    trajectory_from_probes: bool = False,
    recipe_check: Path | None = None,
) -> dict:
    """Validate every input, evaluate the gates, build and seal the document, then write it
    (refusing to overwrite). The gate report goes to NAME.gates.json in any case; when a gate
    fails and `force` is false nothing is sealed and `CheckFailed` (exit 1) is raised.

    `thresholds` is a `gates.GateThresholds` (default: its defaults at `tolerance_rel`);
    `backtest` a precomputed held-out-budget backtest of the same law (default: refitted here);
    `rehearsal_run` a finished dress-rehearsal run dir, or `rehearsal` its result already measured;
    `lr_calibration` `lr-calibrate` reports (gate lr_transfer, against `ladder`'s rule);
    `probe_runs` finished runs beyond the ladder, sealed before they trained (gate probes, and
    evidence for method_agreement); their summaries are hashed into the provenance;
    `probe_correction` seals the primary law corrected by its error trend at the probes, carried by
    `probe_carry` (`hero_prediction`); `noise_scope` (NOISE_SCOPES) whose seed spread is one run's
    noise at the hero and the probes; `trajectory_from_probes` takes the trajectory's shape from the longest probe
    (`delphi.fits.curves.trajectory_from_shapes`) instead of the curve law."""
    from delphi.prereg import gates as gt
    from delphi.fits import curves as cv
    from delphi.model.flops import count_params
    from delphi.train.config import load_train_config, train_config_to_dict

    out = Path(out)
    if out.exists():
        raise DelphiError(f"{out}: already exists; a preregistration is never overwritten (choose a new name)")
    if not Path(hero_path).is_file():
        raise DelphiError(f"{hero_path}: hero config not found")
    hero = load_train_config(hero_path)
    run_dirs: list[Path] = []
    if ladder is not None:
        if not Path(ladder).is_dir():
            raise DelphiError(f"{ladder}: ladder dir not found")
        if not (Path(ladder) / "manifest.csv").is_file():
            raise DelphiError(f"--ladder {ladder}: no manifest.csv; not a ladder dir (plan it with `delphi ladder plan`)")
        run_dirs = cv.find_run_dirs(ladder)
    ladder_families = {model_family(load_train_config(r / "config.yaml").model) for r in run_dirs}

    if results is None and ladder is not None:
        guess = [p for p in (Path(ladder) / "results.csv", Path(ladder) / "results" / "results.csv") if p.is_file()]
        results = guess[0] if guess else None
    if results is not None and not Path(results).is_file():
        raise DelphiError(f"{results}: results table not found")
    final, fit_obj = hero_prediction(Path(fit_path), hero, Path(results) if results is not None else None,
                                     probe_runs, probe_correction, probe_carry, noise_scope)
    family, hero_family = fit_family(fit_obj, ladder_families), model_family(hero.model)
    if family is not None and family != hero_family:
        raise DelphiError(f"{hero_path}: hero is a {hero_family} model but the fit {fit_path} describes {family} models")

    assumptions = list(assumptions or [])
    n = count_params(hero.model).nonembedding
    hero_flops = hero.flops
    provenance: dict[str, Any] = {
        "fit_path": str(fit_path),
        "fit_sha256": sha256_file(fit_path),
        "fit_kind": str(fit_obj.kind),
        "fit_family": family,
        "hero_config_path": str(hero_path),
        "hero_config_sha256": sha256_file(hero_path),
    }
    for name, run in beyond_ladder_runs(None, probe_runs).items():
        if not (run / "summary.json").is_file():
            raise DelphiError(f"--probe {run}: no summary.json; not a finished run")
        provenance.setdefault("probe_summaries_sha256", {})[name] = sha256_file(run / "summary.json")
    manifest = Path(ladder) / "manifest.csv" if ladder else None
    provenance["manifest_sha256"] = sha256_file(manifest) if manifest and manifest.is_file() else None
    if results is not None:
        provenance["results_path"] = str(results)
        provenance["results_sha256"] = sha256_file(results)
    else:
        recorded = fit_obj.input_sha256
        provenance["results_sha256"] = recorded
        provenance["results_note"] = "taken from the fit file" if recorded else "no results table given"
    ladder_compute = _ladder_max_flops(results, run_dirs)
    if ladder_compute:
        provenance["ladder_max_flops"] = ladder_compute
        assumptions.append(f"extrapolation: the hero's compute {hero_flops:.3g} FLOPs is {hero_flops / ladder_compute:.1f}x the largest ladder run ({ladder_compute:.3g})")
    if fit_obj.n_points:
        assumptions.append(f"the {fit_obj.kind} fit uses {fit_obj.n_points} ladder points")
    if final.get("probe_correction"):
        corr = final["probe_correction"]
        errors = ", ".join(f"{p['rel_error']:+.2%}" for p in corr["probes"].values())
        assumptions.append(f"the {fit_obj.kind} law's relative error at the probes ({errors}) "
                           f"continues {CARRY_ASSUMPTION[corr['carry']]} to the hero: {corr['carried_rel']:+.2%} (sd {corr['carried_sd_rel']:.2%}); "
                           f"the law alone predicts {final['uncorrected']['loss']:.4f}")
    if "E" in fit_obj.params:
        assumptions.append(f"irreducible loss E = {float(fit_obj.params['E']):.4g} nats (fitted, not pinned)")

    # Trajectory: the shape of the longest run beyond the ladder, or the curve law fitted on the
    # ladder's curves (or given), anchored to the scaling law's end.
    curve_fit = None
    if trajectory_from_probes:
        trajectory = cv.trajectory_from_shapes(list(beyond_ladder_runs(None, probe_runs).values()), hero, final)
        assumptions.append(f"the trajectory is the final prediction x the normalised eval curve of {trajectory['model']['shape_run']} "
                           "(the longest run beyond the ladder, on the hero's schedule) at the same fractions of training")
    elif curve_fit_path is not None:
        curve_fit = cv.CurveLawFit.from_json(read_json(curve_fit_path, what="curve-law JSON"))
        provenance["curve_fit_sha256"] = sha256_file(curve_fit_path)
    elif run_dirs:
        curves = cv.load_ladder_curves(ladder)
        if curves:
            curve_fit = cv.fit_curve_law(curves, bootstrap=bootstrap, seed=seed, lr_ref=cv.ladder_lr_ref(ladder))
    if curve_fit is not None:
        traj = cv.predict_trajectory(curve_fit, hero, final_anchor=final["loss"])
        if any("lo90" not in p for p in traj["points"]):  # a curve law without a bootstrap has no bands
            traj["points"] = [{k: p.get(k, p["loss"]) for k in ("lo50", "hi50", "lo90", "hi90")} | p for p in traj["points"]]
            assumptions.append("the curve law had no bootstrap: the trajectory's bands are its median alone")
        agreement = _agreement(traj["curve_end_unanchored"], final)
        trajectory = {
            "model": curve_fit.to_json() | {"samples": []},
            "points": traj["points"],
            "agreement": agreement,
        }
        assumptions.append(agreement["note"])
        assumptions.append(f"trajectory bands include the eval noise of one point (sd {curve_fit.residual_sd:.3g} nats) and a {curve_fit.bootstrap} bootstrap of the curve law ({len(curve_fit.samples)} reps)")
    elif not trajectory_from_probes:
        trajectory = trajectory_from_final(final, hero)

    # Gates: evaluated on the evidence before anything is sealed; the report is written either way.
    if thresholds is None:
        thresholds = gt.GateThresholds(tolerance_rel=tolerance_rel)
    elif thresholds.tolerance_rel != tolerance_rel:
        thresholds = dataclasses.replace(thresholds, tolerance_rel=tolerance_rel)
    thresholds.validate("gates")
    if rehearsal is None and rehearsal_run is not None:
        noise = (run_noise_nats(fit_obj, load_tables(Path(results), fit_convention(fit_obj))[0], noise_scope)[0]
                 if results is not None else None)
        rehearsal = run_predicted_vs_actual(fit_obj, rehearsal_run, noise)
    gate_list = compute_gates(fit_obj, results=Path(results) if results is not None else None, hero=hero, final=final,
                              thresholds=thresholds, backtest=backtest, rehearsal=rehearsal, ladder=ladder,
                              rehearsal_run=rehearsal_run, lr_calibration=lr_calibration, probe_runs=probe_runs,
                              probe_correction=probe_correction, probe_carry=probe_carry, noise_scope=noise_scope,
                              recipe_check=recipe_check)
    report = gt.gate_report(gate_list, forced=force, thresholds=thresholds) | {"prereg": str(out), "sealed": False}
    if rehearsal is not None:
        report["rehearsal"] = rehearsal
    passed = gt.all_passed(gate_list)
    report_path = gates_path(out)
    if not passed and not force:
        atomic_write_json(report_path, report)
        raise CheckFailed(f"{out}: not sealed: gate(s) failed: {', '.join(gt.failed_names(gate_list))} "
                          f"(report {report_path}; fix the ladder or the fit, or seal anyway with --force, which is recorded)")
    if not passed:
        assumptions.append(f"SEALED WITH --force although gate(s) failed: {', '.join(gt.failed_names(gate_list))}")

    bpb_per_nat = _ladder_bpb_per_nat(run_dirs) or (1 / math.log(2) if hero.model.vocab_size == 256 else None)
    final = bpb_from_loss(final, bpb_per_nat)
    hero_summary = {"params": int(n), "tokens": int(hero.tokens), "flops": float(hero_flops), "family": hero_family}
    doc = build_prereg(
        prereg_id=out.name.removesuffix(".yaml").removesuffix(".yml"),
        hero_config=train_config_to_dict(hero),
        hero_summary=hero_summary,
        final=final,
        trajectory=trajectory,
        provenance=provenance,
        tolerance_rel=tolerance_rel,
        author=author,
        rationale=rationale,
        assumptions=assumptions,
        gates=[g.to_json() for g in gate_list],
        forced=bool(force and not passed),
    )
    fmt.write_new(out, doc)
    atomic_write_json(report_path, report | {"sealed": True, "seal": doc["seal"]["digest"]})
    return doc


def _agreement(curve_end: float, final: dict) -> dict:
    diff = curve_end - final["loss"]
    half90 = None if final["loss_90"] is None else (final["loss_90"][1] - final["loss_90"][0]) / 2
    agree = half90 is not None and abs(diff) <= half90
    if agree:
        note = (f"the curve law's end ({curve_end:.4f}) agrees with the scaling law ({final['loss']:.4f}) within its 90% "
                f"half-width; the trajectory is shifted by {-diff:+.4f} to end exactly on the scaling law, bands widened to cover both")
    else:
        note = (f"the curve law's end ({curve_end:.4f}) differs from the scaling law ({final['loss']:.4f}) by {diff:+.4f} "
                "(outside the scaling law's 90% interval): the scaling law is fitted to every ladder run's final loss and is "
                "the preregistered number; the curve law supplies the trajectory's shape, shifted to end on it, and its bands "
                "are widened to cover the unshifted curve law too (the disagreement counts as uncertainty)")
    return {"curve_end": curve_end, "scaling_law": final["loss"], "difference": diff, "agree": bool(agree), "note": note}


def _ladder_max_flops(results: Path | None, run_dirs: list[Path]) -> float | None:
    if results is not None:
        try:
            import pandas as pd

            table = pd.read_csv(results)
            if "flops" in table.columns:
                return float(table["flops"].max())
        except Exception:  # a table we cannot read gives no extrapolation note, not an error
            pass
    flops = []
    for run in run_dirs:
        try:
            flops.append(float(json.loads((run / "summary.json").read_text())["flops"]))
        except (OSError, KeyError, ValueError, TypeError):
            continue
    return max(flops) if flops else None
