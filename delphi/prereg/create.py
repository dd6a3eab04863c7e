"""Seal a preregistration: the hero's prediction, its trajectory and its gates, written once.

`create_prereg` validates the inputs (`delphi.prereg.evidence`: what the seal is judged on),
makes the prediction (`delphi.prereg.predict`), judges the gates (`delphi.prereg.measure`),
and writes the document `build_prereg` assembles and seals (pure apart from the defaults' clock
and git), refusing to overwrite.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import delphi
from delphi import prereg_format as fmt
from delphi.errors import CheckFailed, DelphiError
from delphi.fits import curves as cv
from delphi.fits.bootstrap import MIN_BOOTSTRAP_FOR_INTERVAL
from delphi.fits.data import TableOptions
from delphi.fits.probes import CARRY_ASSUMPTION
from delphi.fits.results import load_fit
from delphi.fits.shape_trajectory import trajectory_from_shapes
from delphi.hashes import sha256_file
from delphi.io import atomic_write_json, read_json
from delphi.model.flops import count_params
from delphi.path_policy import check_output_file
from delphi.prereg import gates as gt
from delphi.prereg.evidence import DEFAULT_TOLERANCE_REL, Evidence, PredictionRule, SealTerms
from delphi.prereg.hero import HeroSpec, hero_from_numbers
from delphi.prereg.measure import compute_gates
from delphi.prereg.predict import (
    beyond_ladder_runs,
    fit_convention,
    fit_family,
    hero_prediction,
    load_tables,
    model_family,
    run_noise_nats,
    run_predicted_vs_actual,
)
from delphi.train.config import load_train_config, train_config_to_dict
from delphi.train.rundir import read_metrics


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


@dataclass(frozen=True)
class PreregParts:
    """The parts of a preregistration document before it is sealed (`build_prereg`).

    `hero_config` the hero's train config as a dict (None for a hero given as N and D), beside
    `hero_summary` (params, tokens, flops, family); `final` the final-loss prediction, `trajectory`
    its curve, `provenance` the inputs' hashes; `gates` (Gate.to_json() dicts) and `forced` are
    sealed with the prediction: a preregistration sealed with --force over failing gates says so in
    every verdict; `forced_gates` names the gates forced one by one, each with its reason. `seeds`
    (two or more) makes the sealed quantity the mean final loss of those seeds' runs of the hero
    config (the "target" block; None or one seed: one run). `competing` seals other laws'
    predictions beside the primary (prediction.competing), each judged on the same outcome but
    deciding nothing. `created`, `author` and `toolkit` default to now, the user and this checkout."""

    prereg_id: str
    hero_config: dict | None
    hero_summary: dict
    final: dict
    trajectory: dict
    provenance: dict
    tolerance_rel: float = DEFAULT_TOLERANCE_REL
    author: str | None = None
    rationale: str = ""
    assumptions: list[str] | None = None
    created: str | None = None
    toolkit: dict | None = None
    gates: list[dict] | None = None
    forced: bool = False
    forced_gates: dict[str, str] | None = None
    seeds: Sequence[int] | None = None
    competing: dict[str, dict] | None = None


def build_prereg(parts: PreregParts) -> dict:
    """Assemble and seal a preregistration document (pure apart from the defaults' clock and git)."""
    tolerance_rel, seeds = parts.tolerance_rel, parts.seeds
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
        "id": parts.prereg_id,
        "created": parts.created or utc_now(),
        "author": parts.author or _default_author(),
        "toolkit": parts.toolkit or {"name": "delphi", "version": delphi.__version__, **git_state()},
        "provenance": parts.provenance,
        "hero": {"config": parts.hero_config, **parts.hero_summary},
        "prediction": {
            "final": parts.final,
            "trajectory": parts.trajectory,
            **({"competing": parts.competing} if parts.competing else {}),
        },
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
        "rationale": parts.rationale,
        "assumptions": list(parts.assumptions or []),
        "gates": list(parts.gates or []),
        "forced": bool(parts.forced),
    }
    if parts.forced_gates:
        doc["forced_gates"] = dict(parts.forced_gates)
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


def create_prereg(
    evidence: Evidence,
    out: Path,
    *,
    hero_path: Path | None = None,
    hero_numbers: dict[str, str | None] | None = None,
    rule: PredictionRule | None = None,
    terms: SealTerms | None = None,
) -> dict:
    """Validate every input, evaluate the gates, build and seal the document, then write it
    (refusing to overwrite). The gate report goes to NAME.gates.json in any case; when a gate
    fails and `terms.force` is false nothing is sealed and `CheckFailed` (exit 1) is raised.

    The hero is its train config `hero_path`, or given without a config by `hero_numbers` as
    `delphi.prereg.hero.hero_from_numbers` reads them ({params, tokens, flops, compute}). The
    prediction is made under `rule` from `evidence` (`hero_prediction`); the evidence's results
    table defaults to the ladder's, its rehearsal score to one measured here on its rehearsal run;
    the probes' summaries are hashed into the provenance. `terms` holds the tolerance, the gates'
    thresholds, what may be forced, and what is sealed beside the prediction (None: the defaults)."""
    rule, terms = rule or PredictionRule(), terms or SealTerms()
    out = Path(out)
    if out.exists():
        raise DelphiError(f"{out}: already exists; a preregistration is never overwritten (choose a new name)")
    seeds, n_seeds = rule.seeds, rule.n_seeds
    check_seeds(seeds)
    fit_path, ladder, results = evidence.fit_path, evidence.ladder, evidence.results
    # The gate report beside the seal is written even when the seal is refused: never over a user's file.
    check_output_file(
        gates_path(out),
        inputs=(fit_path, hero_path, results),
        flag="gate report",
        command=GATES_COMMAND,
        force=terms.force,
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
    results = Path(results) if results is not None else None
    evidence = dataclasses.replace(evidence, fit_path=Path(fit_path), results=results)
    options, probe_runs = evidence.options, evidence.probe_runs
    final, fit_obj = hero_prediction(evidence, hero, rule)
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

    assumptions = list(terms.assumptions or [])
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
    if terms.trajectory_from_probes:
        trajectory = trajectory_from_shapes(list(beyond_ladder_runs(None, probe_runs).values()), hero, final)
        assumptions.append(
            f"the trajectory is the final prediction x the normalised eval curve of {trajectory['model']['shape_run']} "
            "(the longest run beyond the ladder, on the hero's schedule) at the same fractions of training"
        )
    elif evidence.curve_fit_path is not None:
        curve_fit = cv.CurveLawFit.from_json(read_json(evidence.curve_fit_path, what="curve-law JSON"))
        provenance["curve_fit_sha256"] = sha256_file(evidence.curve_fit_path)
    elif run_dirs and not isinstance(hero, HeroSpec):
        curves = cv.load_ladder_curves(ladder)
        if curves:
            curve_fit = cv.fit_curve_law(
                curves, bootstrap=terms.curve_bootstrap, seed=terms.curve_seed, lr_ref=cv.ladder_lr_ref(ladder)
            )
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
    elif not terms.trajectory_from_probes:
        trajectory = trajectory_from_final(final, hero)

    # Gates: evaluated on the evidence before anything is sealed; the report is written either way.
    tolerance_rel, thresholds = terms.tolerance_rel, terms.thresholds
    if thresholds is None:
        thresholds = gt.GateThresholds(tolerance_rel=tolerance_rel)
    elif thresholds.tolerance_rel != tolerance_rel:
        thresholds = dataclasses.replace(thresholds, tolerance_rel=tolerance_rel)
    thresholds.validate("gates")
    rehearsal = evidence.rehearsal
    if rehearsal is None and evidence.rehearsal_run is not None:
        noise = (
            run_noise_nats(fit_obj, load_tables(results, fit_convention(fit_obj), options)[0], rule.noise_scope)[0]
            if results is not None
            else None
        )
        rehearsal = run_predicted_vs_actual(fit_obj, evidence.rehearsal_run, noise)
        evidence = dataclasses.replace(evidence, rehearsal=rehearsal)
    gate_list = compute_gates(fit_obj, evidence, hero, final, rule, thresholds)
    report = gt.gate_report(gate_list, forced=terms.force, thresholds=thresholds) | {
        "prereg": str(out),
        "sealed": False,
    }
    if rehearsal is not None:
        report["rehearsal"] = rehearsal
    passed = gt.all_passed(gate_list)
    failed = gt.failed_names(gate_list)
    forced_gates = dict(terms.forced_gates or {})
    unknown = sorted(set(forced_gates) - {g.name for g in gate_list})
    if unknown:
        raise DelphiError(
            f"forced gates: {', '.join(unknown)} is not a gate of this seal (gates: {', '.join(g.name for g in gate_list)})"
        )
    report_path = gates_path(out)
    if forced_gates:
        report["forced_gates"] = forced_gates
    unforced = [n for n in failed if n not in forced_gates]
    if unforced and not terms.force:
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
    competing_doc = terms.competing(hero, final) if terms.competing is not None else None

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
    parts = PreregParts(
        prereg_id=out.name.removesuffix(".yaml").removesuffix(".yml"),
        hero_config=None if isinstance(hero, HeroSpec) else train_config_to_dict(hero),
        hero_summary=hero_summary,
        final=final,
        trajectory=trajectory,
        provenance=provenance,
        tolerance_rel=tolerance_rel,
        author=terms.author,
        rationale=terms.rationale,
        assumptions=assumptions,
        gates=[g.to_json() for g in gate_list],
        forced=not passed,
        forced_gates={n: forced_gates[n] for n in failed if n in forced_gates} or None,
        seeds=seeds,
        competing=competing_doc,
    )
    doc = build_prereg(parts)
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
