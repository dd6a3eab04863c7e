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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import delphi
from delphi import prereg_format as fmt
from delphi.errors import CheckFailed, DelphiError
from delphi.fits.backtest import Z_50 as Z50  # noqa: F401 (importable from here)
from delphi.fits.data import TableOptions
from delphi.fits.intervals import PointCorrection
from delphi.fits.prediction_checks import CROSS_CHECK_METHODS, REFIT_NAMES, law_name  # noqa: F401 (importable from here)
from delphi.fits.probes import CARRY_ASSUMPTION, NOISE_SCOPES, correct_by_probes, correction_text  # noqa: F401 (moved there)
from delphi.io import atomic_write_json, read_json, sha256_file
from delphi.prereg.hero import HeroSpec
from delphi.prereg.predict import (  # noqa: F401 (moved there; importable from here)
    _interval,
    beyond_ladder_runs,
    final_from_prediction,
    fit_convention,
    fit_family,
    hero_params,
    hero_prediction,
    law_scatter_nats,
    load_tables,
    model_family,
    predict_final,
    predict_hero,
    predictive,
    probe_noise_rel,
    run_noise_nats,
    run_predicted_vs_actual,
    score_probes,
    seed_noise_nats,
)

# docs/design.md §9: the project's goal is a hero within 1% of its prediction.
DEFAULT_TOLERANCE_REL = 0.01


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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


# --------------------------------------------------------------------------- assembly


def bpb_from_loss(final: dict, bpb_per_nat: float | None) -> dict:
    """Add bpb, bpb_50, bpb_90 by the ladder's bytes-per-token ratio (a constant per tokenizer)."""
    if bpb_per_nat is None:
        return final
    scale = lambda v: None if v is None else [x * bpb_per_nat for x in v]  # noqa: E731
    return final | {
        "bpb": final["loss"] * bpb_per_nat,
        "bpb_50": scale(final["loss_50"]),
        "bpb_90": scale(final["loss_90"]),
    }


def trajectory_from_final(final: dict, hero) -> dict:
    """A one-point trajectory (no ladder curves given): the final prediction at the last step."""
    lo50, hi50 = final["loss_50"] or (final["loss"],) * 2
    lo90, hi90 = final["loss_90"] or (final["loss"],) * 2
    step = {} if isinstance(hero, HeroSpec) else {"step": hero.steps}  # a hero given as N and D has no schedule
    point = {
        **step,
        "tokens": hero.tokens,
        "loss": final["loss"],
        "lo50": lo50,
        "hi50": hi50,
        "lo90": lo90,
        "hi90": hi90,
    }
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
    forced_gates: dict[str, str] | None = None,
    seeds: Sequence[int] | None = None,
    competing: dict[str, dict] | None = None,
) -> dict:
    """Assemble and seal a preregistration document (pure apart from the defaults' clock and git).

    `gates` (Gate.to_json() dicts) and `forced` are sealed with the prediction: a preregistration
    sealed with --force over failing gates says so in every verdict; `forced_gates` names the gates
    forced one by one, each with its reason. `seeds` (two or more) makes the sealed quantity the mean
    final loss of those seeds' runs of the hero config (the "target" block; None or one seed: one
    run, and the document reads as before). `competing` seals other laws' predictions beside the
    primary (prediction.competing), each judged on the same outcome but deciding nothing."""
    if not (0 < tolerance_rel < 1):
        raise DelphiError(f"tolerance: must be in (0, 1), got {tolerance_rel}")
    check_seeds(seeds)
    multi = seeds is not None and len(seeds) > 1
    outcome = (
        f"the mean final val_loss of the hero config's runs at seeds {', '.join(str(s) for s in seeds)}"
        if multi
        else "the hero's final val_loss"
    )
    doc = {
        "schema_version": fmt.SCHEMA_VERSION,
        "id": prereg_id,
        "created": created or utc_now(),
        "author": author or _default_author(),
        "toolkit": toolkit or {"name": "delphi", "version": delphi.__version__, **git_state()},
        "provenance": provenance,
        "hero": {"config": hero_config, **hero_summary},
        "prediction": {"final": final, "trajectory": trajectory, **({"competing": competing} if competing else {})},
        "decision": {
            "tolerance_rel": float(tolerance_rel),
            "rule": (
                f"passed if {outcome} is within {tolerance_rel:.2%} (relative) of prediction.final.loss; "
                "otherwise failed. A run that diverges or fails is failed. Whether the 50%/90% intervals covered "
                "the outcome is reported but does not decide. While training: on-track if the latest eval point is "
                "inside the trajectory's 90% band or within the tolerance of its median, else deviating."
                + (
                    " Each seed's run must start after the seal; one that started before it makes the outcome invalid."
                    if multi
                    else ""
                )
            ),
        },
        "rationale": rationale,
        "assumptions": list(assumptions or []),
        "gates": list(gates or []),
        "forced": bool(forced),
    }
    if forced_gates:
        doc["forced_gates"] = dict(forced_gates)
    if multi:
        doc["target"] = {
            "seeds": [int(x) for x in seeds],
            "quantity": "mean",
            "runs": "the hero config with seed and data.seed set to each seed",
        }
    return fmt.seal(_plain(doc))


def check_seeds(seeds: Sequence[int] | None) -> None:
    """A seal's seed list: None (one run), or distinct integers."""
    if seeds is None:
        return
    if len(seeds) == 0:
        raise DelphiError("seeds: a seal's seed list is empty; name at least one seed (or none for one run)")
    if len(set(seeds)) != len(seeds) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise DelphiError(f"seeds: {list(seeds)}: expected distinct integers")


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


GATES_COMMAND = "prereg create"  # the gate report's output-policy marker (delphi.io)


def gates_path(out: Path) -> Path:
    """NAME.yaml -> NAME.gates.json beside it: the gate report, written whether or not the file is sealed."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".yaml").removesuffix(".yml") + ".gates.json")


def refit_options(fit) -> dict[str, Any]:
    """What a refit of `fit` keeps besides its law: its E prior (delphi.fits.e_prior), and a frontier
    fit's points; a frontier refit skips the E profile (the gates read its point only)."""
    from delphi.fits.e_prior import prior_of

    prior = prior_of(fit)
    options: dict[str, Any] = {} if prior is None else {"E_prior": prior}
    if law_name(fit) == "frontier":
        options |= {"points": (fit.diagnostics or {}).get("points", "min"), "with_sensitivity": False}
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
    from delphi.fits import FITTERS

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
    from delphi.fits.calibration import calibrate_point, calibration_key, load_checked_calibration

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
    from delphi.fits import best_point as bp
    from delphi.fits.calibration import calibrate_backtest, load_checked_calibration

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
    """The hero's ranges from the ladder's own spec (delphi.ladder.plan.ladder_ranges) when the ladder dir
    holds it; None (ranges from the results table) otherwise."""
    if ladder is None or not (Path(ladder) / "ladder.yaml").is_file():
        return None
    try:
        from delphi.ladder.hero import ladder_ranges
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
        raise DelphiError(
            f"--lr-calibration: needs the ladder dir (--ladder) whose ladder.yaml holds the LR rule; got {ladder}"
        )
    return rule_drift(merge_reports(list(lr_calibration)), load_ladder_spec(spec_path))


def compute_gates(
    fit,
    *,
    results: Path | None,
    hero,
    final: dict,
    thresholds,
    backtest: dict | None = None,
    rehearsal: dict | None = None,
    rehearsal_run: Path | None = None,
    ladder: Path | None = None,
    lr_calibration: list[Path] | None = None,
    probe_runs: Sequence[Path] = (),
    probe_correction: bool = False,
    probe_carry: str = "linear",
    noise_scope: str = "pooled",
    recipe_check: Path | None = None,
    point_correction: PointCorrection | None = None,
    options: TableOptions | None = None,
) -> list:
    """Evaluate every gate for the hero: refit the backtest (when not given), the leave-one-budget-out
    laws and the cross-check laws (scored on the dress rehearsal's run dir `rehearsal_run` and the
    finished `probe_runs` too); gate lr_transfer when an `lr-calibrate` report is given; gate probes
    (the primary law at each probe) when probes are given. With `probe_correction`, `final` is the
    corrected prediction (`hero_prediction`) and each leave-one-budget-out law is corrected by its
    own errors at the probes. `noise_scope` (NOISE_SCOPES) sets one run's noise at the probes and
    in the cross-checks. With `point_correction` (`final` corrected by the design's bias), each
    leave-one-budget-out law is corrected by the same factor, so the gate compares like with like;
    where the calibrated centre decides (`final["point"]`), so is each refit by the same calibration,
    the backtest scores the calibrated centre and the cross-checks are their own calibrated centres.
    The table is read with `options`; one that is not a Delphi ladder's (no `ladder`, no rung records)
    is external: the gates it cannot hold the evidence for are not applicable (delphi.prereg.gates)."""
    from delphi.fits import backtest as run_backtest
    from delphi.fits import best_point as bp
    from delphi.fits.probes import probe_trend
    from delphi.prereg import gates as gt

    lr_drift = lr_drift_from(lr_calibration, ladder)
    from delphi.ladder.recipe_check import read_report

    recipe = read_report(recipe_check)  # gate recipe (issue 29)
    if results is None:
        if probe_runs:
            raise DelphiError(
                "--probe: needs the results table (--results or --ladder) to score the laws on the probes"
            )
        return gt.evaluate_gates(
            fit=fit,
            table=None,
            final=final,
            hero=gt.hero_facts(hero),
            thresholds=thresholds,
            backtest=backtest,
            rehearsal=rehearsal,
            lr_drift=lr_drift,
            recipe_check=recipe,
        )
    fit_table, gate_table = load_tables(results, fit_convention(fit), options)
    external = ladder is None and not gate_table.attrs.get("ladder_records", False)
    noise = run_noise_nats(fit, fit_table, noise_scope)[0] if probe_runs else None
    probes = score_probes(fit, probe_runs, noise)
    refit = refit_function(fit)
    if backtest is None:
        import inspect

        kwargs = (
            {"family": getattr(fit, "family", None)} if "family" in inspect.signature(run_backtest).parameters else {}
        )
        try:
            backtest = run_backtest(fit_table, refit, **kwargs)
        except (DelphiError, ValueError) as e:
            backtest = {"error": str(e)}
    calibrated = (final.get("point") or {}).get("decides") == bp.CALIBRATED
    point_factor = float(final["loss"]) / float(final["law"]["loss"]) if calibrated else 1.0

    def hero_loss(f) -> float:
        loss = float(predict_hero(f, hero)[0]["loss"])
        trend = (
            probe_trend(score_probes(f, probe_runs), gt.ladder_top_budget(gate_table), probe_carry)
            if probe_correction
            else None
        )
        loss = loss * (1 + trend.at(float(hero.flops))) if trend is not None else loss
        loss = loss * point_factor
        return loss * (1 + point_correction.rel) if point_correction is not None else loss

    lobo = gt.leave_one_budget_out(fit_table, refit, hero_loss)
    cross = cross_check_predictions(
        fit,
        fit_table,
        hero,
        rehearsal_run,
        probe_runs,
        noise_scope,
        calibrated_at=final["calibrated"]["factor"] if calibrated else None,
    )
    return gt.evaluate_gates(
        fit=fit,
        table=gate_table,
        final=final,
        hero=gt.hero_facts(hero),
        thresholds=thresholds,
        backtest=backtest_of_point(backtest, final, fit),
        lobo=lobo,
        rehearsal=rehearsal,
        ranges=ladder_spec_ranges(ladder, gate_table),
        cross_checks=cross,
        lr_drift=lr_drift,
        probes=probes,
        probe_correction=probe_correction,
        probe_carry=probe_carry,
        recipe_check=recipe,
        external=external,
    )


def create_prereg(
    fit_path: Path,
    hero_path: Path | None,
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
    seeds: Sequence[int] | None = None,
    forced_gates: dict[str, str] | None = None,
    competing: Callable[[Any, dict], dict[str, dict]] | None = None,
    point_correction: PointCorrection | None = None,
    hero_numbers: dict[str, str | None] | None = None,
    options: TableOptions | None = None,
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
    (`delphi.fits.shape_trajectory.trajectory_from_shapes`) instead of the curve law.
    `seeds` (>= 2) seals the mean of those seeds' runs, its interval carrying the noise of that mean;
    `forced_gates` ({gate: reason}) seals over those gates alone failing, each reason sealed;
    `competing(hero, final)` returns the other laws' predictions sealed beside the primary;
    `point_correction` (delphi.fits.intervals.PointCorrection) seals the primary law x (1 + its measured
    bias on this design) (`correct_by_design`). `hero_numbers` gives the hero without a config, as
    `delphi.prereg.hero.hero_from_numbers` reads them ({params, tokens, flops, compute}; `hero_path`
    None); `options` how the results table is read (column mapping, query)."""
    from delphi.fits import curves as cv
    from delphi.model.flops import count_params
    from delphi.prereg import gates as gt
    from delphi.train.config import load_train_config, train_config_to_dict

    out = Path(out)
    if out.exists():
        raise DelphiError(f"{out}: already exists; a preregistration is never overwritten (choose a new name)")
    check_seeds(seeds)
    n_seeds = len(seeds) if seeds else 1
    # The gate report beside the seal is written even when the seal is refused: never over a user's file.
    from delphi.io import check_output_file

    check_output_file(
        gates_path(out), inputs=(fit_path, hero_path, results), flag="gate report", command=GATES_COMMAND, force=force
    )
    hero = load_hero(fit_path, hero_path, hero_numbers)
    run_dirs: list[Path] = []
    if ladder is not None:
        if not Path(ladder).is_dir():
            raise DelphiError(f"{ladder}: ladder dir not found")
        if not (Path(ladder) / "manifest.csv").is_file():
            raise DelphiError(
                f"--ladder {ladder}: no manifest.csv; not a ladder dir (plan it with `delphi ladder plan`)"
            )
        run_dirs = cv.find_run_dirs(ladder)
    ladder_families = {model_family(load_train_config(r / "config.yaml").model) for r in run_dirs}

    if results is None and ladder is not None:
        guess = [p for p in (Path(ladder) / "results.csv", Path(ladder) / "results" / "results.csv") if p.is_file()]
        results = guess[0] if guess else None
    if results is not None and not Path(results).is_file():
        raise DelphiError(f"{results}: results table not found")
    final, fit_obj = hero_prediction(
        Path(fit_path),
        hero,
        Path(results) if results is not None else None,
        probe_runs,
        probe_correction,
        probe_carry,
        noise_scope,
        n_seeds,
        point_correction,
        options,
        ladder_given=ladder is not None,
    )
    from delphi.fits.bootstrap import MIN_BOOTSTRAP_FOR_INTERVAL

    n_replicates = len(next(iter(fit_obj.samples.values()))) if fit_obj.samples else 0
    if 0 < n_replicates < MIN_BOOTSTRAP_FOR_INTERVAL:
        raise DelphiError(
            f"--fit {fit_path}: a bootstrap of {n_replicates} replicates; a sealed 90% interval needs at least "
            f"{MIN_BOOTSTRAP_FOR_INTERVAL} (refit with --bootstrap {MIN_BOOTSTRAP_FOR_INTERVAL} or more)"
        )
    family = fit_family(fit_obj, ladder_families)
    hero_family = family if isinstance(hero, HeroSpec) else model_family(hero.model)
    if family is not None and family != hero_family:
        raise DelphiError(
            f"{hero_path}: hero is a {hero_family} model but the fit {fit_path} describes {family} models"
        )

    assumptions = list(assumptions or [])
    hero_flops = hero.flops
    provenance: dict[str, Any] = {
        "fit_path": str(fit_path),
        "fit_sha256": sha256_file(fit_path),
        "fit_kind": str(fit_obj.kind),
        "fit_family": family,
    }
    if isinstance(hero, HeroSpec):
        provenance["hero_given"] = hero.given
        assumptions.append(
            f"the hero is given as numbers ({hero.given}), not a train config: N = {hero.params:.4g} "
            f"(counted as the table counts params), D = {hero.tokens:.4g}, C = {hero.flops:.4g} FLOPs ({hero.flops_how})"
        )
    else:
        provenance |= {"hero_config_path": str(hero_path), "hero_config_sha256": sha256_file(hero_path)}
    if options is not None and not options.is_default:
        provenance["results_reading"] = options.to_json()
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
    ladder_compute = _ladder_max_flops(results, run_dirs, options)
    if ladder_compute:
        provenance["ladder_max_flops"] = ladder_compute
        assumptions.append(
            f"extrapolation: the hero's compute {hero_flops:.3g} FLOPs is {hero_flops / ladder_compute:.1f}x the largest ladder run ({ladder_compute:.3g})"
        )
    if fit_obj.n_points:
        assumptions.append(f"the {fit_obj.kind} fit uses {fit_obj.n_points} ladder points")
    if final.get("probe_correction"):
        corr = final["probe_correction"]
        errors = ", ".join(f"{p['rel_error']:+.2%}" for p in corr["probes"].values())
        assumptions.append(
            f"the {fit_obj.kind} law's relative error at the probes ({errors}) "
            f"continues {CARRY_ASSUMPTION[corr['carry']]} to the hero: {corr['carried_rel']:+.2%} (sd {corr['carried_sd_rel']:.2%}); "
            f"the law alone predicts {final['uncorrected']['loss']:.4f}"
        )
    if final.get("point_correction"):
        corr = final["point_correction"]
        assumptions.append(
            f"the {fit_obj.kind} law's bias measured on earlier studies of this design holds at this hero: "
            f"{corr['rel']:+.2%} (sd {corr['sd_rel']:.2%}; {corr['source']}); the law alone predicts "
            f"{final['uncorrected']['loss']:.4f}"
        )
    if final.get("E_prior"):
        assumptions.append(f"irreducible loss: the lab's {final['E_prior']['text']}")
    elif "E" in fit_obj.params:
        assumptions.append(f"irreducible loss E = {float(fit_obj.params['E']):.4g} nats (fitted, not pinned)")
    if (final.get("point") or {}).get("decides") == "calibrated":
        assumptions.append(
            f"the sealed point is {final['point']['why']}; the law's own point is {final['law']['loss']:.4f}"
        )

    # Trajectory: the shape of the longest run beyond the ladder, or the curve law fitted on the
    # ladder's curves (or given), anchored to the scaling law's end.
    curve_fit = None
    if trajectory_from_probes:
        trajectory = cv.trajectory_from_shapes(list(beyond_ladder_runs(None, probe_runs).values()), hero, final)
        assumptions.append(
            f"the trajectory is the final prediction x the normalised eval curve of {trajectory['model']['shape_run']} "
            "(the longest run beyond the ladder, on the hero's schedule) at the same fractions of training"
        )
    elif curve_fit_path is not None:
        curve_fit = cv.CurveLawFit.from_json(read_json(curve_fit_path, what="curve-law JSON"))
        provenance["curve_fit_sha256"] = sha256_file(curve_fit_path)
    elif run_dirs and not isinstance(hero, HeroSpec):
        curves = cv.load_ladder_curves(ladder)
        if curves:
            curve_fit = cv.fit_curve_law(curves, bootstrap=bootstrap, seed=seed, lr_ref=cv.ladder_lr_ref(ladder))
    if curve_fit is not None and isinstance(hero, HeroSpec):
        raise DelphiError(
            "--curve-fit: a trajectory needs the hero's schedule; a hero given as N and D has none "
            "(give --hero HERO.yaml, or leave out --curve-fit)"
        )
    if curve_fit is not None:
        traj = cv.predict_trajectory(curve_fit, hero, final_anchor=final["loss"])
        if any("lo90" not in p for p in traj["points"]):  # a curve law without a bootstrap has no bands
            traj["points"] = [
                {k: p.get(k, p["loss"]) for k in ("lo50", "hi50", "lo90", "hi90")} | p for p in traj["points"]
            ]
            assumptions.append("the curve law had no bootstrap: the trajectory's bands are its median alone")
        agreement = _agreement(traj["curve_end_unanchored"], final)
        trajectory = {
            "model": curve_fit.to_json() | {"samples": []},
            "points": traj["points"],
            "agreement": agreement,
        }
        assumptions.append(agreement["note"])
        assumptions.append(
            f"trajectory bands include the eval noise of one point (sd {curve_fit.residual_sd:.3g} nats) and a {curve_fit.bootstrap} bootstrap of the curve law ({len(curve_fit.samples)} reps)"
        )
    elif not trajectory_from_probes:
        trajectory = trajectory_from_final(final, hero)

    # Gates: evaluated on the evidence before anything is sealed; the report is written either way.
    if thresholds is None:
        thresholds = gt.GateThresholds(tolerance_rel=tolerance_rel)
    elif thresholds.tolerance_rel != tolerance_rel:
        thresholds = dataclasses.replace(thresholds, tolerance_rel=tolerance_rel)
    thresholds.validate("gates")
    if rehearsal is None and rehearsal_run is not None:
        noise = (
            run_noise_nats(fit_obj, load_tables(Path(results), fit_convention(fit_obj), options)[0], noise_scope)[0]
            if results is not None
            else None
        )
        rehearsal = run_predicted_vs_actual(fit_obj, rehearsal_run, noise)
    gate_list = compute_gates(
        fit_obj,
        results=Path(results) if results is not None else None,
        hero=hero,
        final=final,
        thresholds=thresholds,
        backtest=backtest,
        rehearsal=rehearsal,
        ladder=ladder,
        rehearsal_run=rehearsal_run,
        lr_calibration=lr_calibration,
        probe_runs=probe_runs,
        probe_correction=probe_correction,
        probe_carry=probe_carry,
        noise_scope=noise_scope,
        recipe_check=recipe_check,
        point_correction=point_correction,
        options=options,
    )
    report = gt.gate_report(gate_list, forced=force, thresholds=thresholds) | {"prereg": str(out), "sealed": False}
    if rehearsal is not None:
        report["rehearsal"] = rehearsal
    passed = gt.all_passed(gate_list)
    failed = gt.failed_names(gate_list)
    forced_gates = dict(forced_gates or {})
    unknown = sorted(set(forced_gates) - {g.name for g in gate_list})
    if unknown:
        raise DelphiError(
            f"forced gates: {', '.join(unknown)} is not a gate of this seal (gates: {', '.join(g.name for g in gate_list)})"
        )
    report_path = gates_path(out)
    if forced_gates:
        report["forced_gates"] = forced_gates
    unforced = [n for n in failed if n not in forced_gates]
    if unforced and not force:
        atomic_write_json(report_path, report, written_by=GATES_COMMAND)
        raise CheckFailed(
            f"{out}: not sealed: gate(s) failed: {', '.join(unforced)} "
            f"(report {report_path}; fix the ladder or the fit, or seal anyway with --force, which is recorded)"
        )
    if not passed:
        how = "--force" if unforced else "the study forcing gate(s)"
        assumptions.append(
            f"SEALED WITH {how} although gate(s) failed: {', '.join(failed)}"
            + "".join(f"; {n} forced because: {forced_gates[n]}" for n in failed if n in forced_gates)
        )
    if n_seeds > 1:
        assumptions.append(
            f"the sealed quantity is the mean final loss of {n_seeds} seeds ({', '.join(str(s) for s in seeds)}) of "
            f"the hero config; the interval's seed-noise term is one run's / sqrt({n_seeds})"
        )
    competing_doc = competing(hero, final) if competing is not None else None

    byte_level = not isinstance(hero, HeroSpec) and hero.model.vocab_size == 256
    bpb_per_nat = _ladder_bpb_per_nat(run_dirs) or (1 / math.log(2) if byte_level else None)
    final = bpb_from_loss(final, bpb_per_nat)
    if isinstance(hero, HeroSpec):
        hero_summary = hero.summary(hero_family)
    else:
        hero_summary = {
            "params": int(count_params(hero.model).nonembedding),
            "tokens": int(hero.tokens),
            "flops": float(hero_flops),
            "family": hero_family,
        }
    doc = build_prereg(
        prereg_id=out.name.removesuffix(".yaml").removesuffix(".yml"),
        hero_config=None if isinstance(hero, HeroSpec) else train_config_to_dict(hero),
        hero_summary=hero_summary,
        final=final,
        trajectory=trajectory,
        provenance=provenance,
        tolerance_rel=tolerance_rel,
        author=author,
        rationale=rationale,
        assumptions=assumptions,
        gates=[g.to_json() for g in gate_list],
        forced=not passed,
        forced_gates={n: forced_gates[n] for n in failed if n in forced_gates} or None,
        seeds=seeds,
        competing=competing_doc,
    )
    fmt.write_new(out, doc)
    atomic_write_json(report_path, report | {"sealed": True, "seal": doc["seal"]["digest"]}, written_by=GATES_COMMAND)
    return doc


def _agreement(curve_end: float, final: dict) -> dict:
    diff = curve_end - final["loss"]
    half90 = None if final["loss_90"] is None else (final["loss_90"][1] - final["loss_90"][0]) / 2
    agree = half90 is not None and abs(diff) <= half90
    if agree:
        note = (
            f"the curve law's end ({curve_end:.4f}) agrees with the scaling law ({final['loss']:.4f}) within its 90% "
            f"half-width; the trajectory is shifted by {-diff:+.4f} to end exactly on the scaling law, bands widened to cover both"
        )
    else:
        note = (
            f"the curve law's end ({curve_end:.4f}) differs from the scaling law ({final['loss']:.4f}) by {diff:+.4f} "
            "(outside the scaling law's 90% interval): the scaling law is fitted to every ladder run's final loss and is "
            "the preregistered number; the curve law supplies the trajectory's shape, shifted to end on it, and its bands "
            "are widened to cover the unshifted curve law too (the disagreement counts as uncertainty)"
        )
    return {
        "curve_end": curve_end,
        "scaling_law": final["loss"],
        "difference": diff,
        "agree": bool(agree),
        "note": note,
    }


def load_hero(fit_path: Path, hero_path: Path | None, hero_numbers: dict[str, str | None] | None):
    """The hero: its train config (`hero_path`), or a HeroSpec from `hero_numbers` (delphi.prereg.hero),
    sized by the fit where it is given as a compute budget."""
    from delphi.fits.results import load_fit
    from delphi.prereg.hero import hero_from_numbers
    from delphi.train.config import load_train_config

    numbers = {k: v for k, v in (hero_numbers or {}).items() if v is not None}
    if hero_path is not None and numbers:
        raise DelphiError(
            f"--hero {hero_path} and --hero-{next(iter(numbers))}: give the hero one way (a train config, or "
            "its N and D, or a compute budget)"
        )
    if hero_path is None:
        return hero_from_numbers(load_fit(fit_path), **numbers)
    if not Path(hero_path).is_file():
        raise DelphiError(f"{hero_path}: hero config not found")
    return load_train_config(hero_path)


def _ladder_max_flops(results: Path | None, run_dirs: list[Path], options: TableOptions | None = None) -> float | None:
    if results is not None and options is not None and not options.is_default:
        return float(load_tables(Path(results), "nonembedding", options)[0]["flops"].max())
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
