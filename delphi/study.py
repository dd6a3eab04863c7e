"""`delphi study`: the whole loop from one study file, resumably.

    prepare -> plan -> ladder -> collect -> fit -> backtest -> hero -> gates
            -> dress_rehearsal (its own gate) -> prereg -> train_hero (checked live) -> check -> figures -> report

The fit stage fits the primary law under each parameter-count convention
(non-embedding, active, FLOPs per token / 6), reports the compute-optimal
exponent under each, and keeps the convention its held-out-budget backtest
favours; every law allocates compute under the ladder family's exact FLOPs per
token. The gates stage says PASS/FAIL for every gate before anything larger than
the ladder trains and stops the study (exit 1) when one fails, unless the study
says `force: true`; then the dress rehearsal predicts and trains one run at ~3x
the top budget, and its error is one more gate before the hero.

Each stage writes `stages/<name>.json` when it completes; re-running the study
skips completed stages, and the two training stages resume their runs (the
ladder runner skips finished rungs, the trainer continues from its last
checkpoint). The preregistration stage always completes before the hero's
first step, so the sealed prediction provably precedes the outcome.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from delphi.config_schema import from_dict, to_dict
from delphi.errors import CheckFailed, DelphiError
from delphi.io import atomic_write_bytes, atomic_write_json, atomic_write_text, atomic_write_yaml, read_yaml
from delphi.fits import FIT_METHODS
from delphi.fits.allocation import PARAM_CONVENTIONS
from delphi.fits.backtest import NOISE_SCOPES, PROBE_CARRIES
from delphi.train.rundir import CONFIG_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE, read_status

DEFAULT_STUDY = "default_study.yaml"  # package data in delphi/defaults/
# How N is counted (PARAM_CONVENTIONS): the study fits under each and keeps the one its backtest
# favours (issue 10: 0.91 / 0.71 / 0.68 isoFLOP exponents on the first paper ladder).
# A dress rehearsal at ~3x the top budget (issue 10) sits between the ladder and a >= 10x hero.
DEFAULT_REHEARSAL_MULTIPLE = 3.0
# Study seed k trains the ladder's run seeds + k * STUDY_SEED_STRIDE: disjoint from seed 0's as long as
# a spec lists fewer seeds than the stride.
STUDY_SEED_STRIDE = 1000
TRAJECTORY_SOURCES = ("curve_law", "probes")
# Gates on the hero's prediction, which the study's own probes (hero.probe_multiples) correct: while
# those are untrained the gates stage shows them and the seal decides them.
PREDICTION_GATES = ("lobo_spread", "interval_width", "method_agreement", "probes")


@dataclass(frozen=True)
class HeroSpec:
    compute: float | None = None  # FLOPs; None: compute_multiple x the largest ladder budget
    compute_multiple: float = 10.0
    tolerance: float = 0.01  # relative error of the final loss that counts as a pass
    eval_every: int | None = None  # None: the ladder's evals_per_run, spaced as on its rungs
    # The dress rehearsal's compute as a multiple of the top ladder budget; None: no rehearsal.
    rehearsal_multiple: float | None = DEFAULT_REHEARSAL_MULTIPLE
    # Seal the primary law x (1 + its error trend at gates.probes carried to the hero), not the law
    # alone (delphi.prereg.create.correct_by_probes); needs >= 3 probes for gate probes to pass.
    probe_correction: bool = False
    # How the correction carries the law's error beyond the probes (delphi.fits.backtest.PROBE_CARRIES):
    # "linear" (least squares through every probe) or "local_slope" (the two furthest).
    probe_carry: str = "linear"
    # Whose seed spread is one run's noise at the hero and the probes (delphi.fits.backtest.NOISE_SCOPES):
    # "pooled" over every budget, or "top_budget" (the measured scale nearest the runs beyond the ladder).
    noise_scope: str = "pooled"
    # The hero's train config checkpoint_every_s: a checkpoint_every checkpoint is skipped while the
    # last save is less than this many seconds ago (a throttle, not a clock; 0: every checkpoint_every).
    checkpoint_every_s: float = 0.0
    # Where the sealed trajectory's shape comes from: "curve_law" (the LR-annealing law fitted on the
    # ladder's curves) or "probes" (the longest probe, normalised to its final loss).
    trajectory: str = "curve_law"
    # Probes of the study's own, as multiples of the top ladder budget (e.g. [3, 10, 30]): after the
    # ladder's gates pass, each is sized like the hero, sealed (with --force: the gates judge the
    # hero) and trained, then counts as evidence like gates.probes (paper/v6: three probes let
    # probe_correction seal a hero up to their span beyond the last).
    probe_multiples: tuple[float, ...] = ()


@dataclass(frozen=True)
class GatesSpec:
    """Gate thresholds (delphi.prereg.gates); tolerances left None are the hero's tolerance."""

    backtest_tolerance: float | None = None
    lobo_tolerance: float | None = None
    rehearsal_tolerance: float | None = None
    agreement_tolerance: float | None = None  # gate method_agreement
    # `delphi ladder lr-calibrate` reports (relative to the study file): gate lr_transfer checks the
    # ladder's LR rule against their points; empty: no such gate (the rule is taken on trust).
    lr_calibration: tuple[str, ...] = ()
    # Finished runs beyond the ladder (relative to the study file), each sealed before it trained:
    # gate probes scores the primary law on them and method_agreement sets aside a cross-check law
    # they reject. Empty: the dress rehearsal is the only such run.
    probes: tuple[str, ...] = ()
    # A `delphi ladder recipe-check` report (relative to the study file): gate recipe (issue 29).
    recipe_check: str | None = None
    interval_width_factor: float = 1.5  # issue 10: 90% half-width <= 1.5 x tolerance
    min_seeds: int = 2  # issue 10: >= 2 seeds per rung


@dataclass(frozen=True)
class StudySpec:
    name: str = "study"
    ladder: str = "ladder_default.yaml"  # ladder spec, relative to the study file
    fits: tuple[str, ...] = ("isoflop", "parametric", "vpnls", "frontier")
    primary_fit: str = "vpnls"  # the law that sizes the hero and makes the prediction
    bootstrap: int = 200
    seed: int = 0  # bootstrap, hero and rehearsal seed; offsets the ladder's run seeds (seed_offset)
    workers: int | None = None  # ladder processes; None: one per core
    hero: HeroSpec = field(default_factory=HeroSpec)
    author: str | None = None
    rationale: str = ""
    # Where the sealed preregistration goes, relative to the study file (None: inside --out).
    # The project's own study writes into preregistrations/ so that git history dates it.
    preregistration: str | None = None
    gates: GatesSpec = field(default_factory=GatesSpec)
    force: bool = False  # seal and train the hero even if a gate fails (recorded in the preregistration)
    conventions: tuple[str, ...] = PARAM_CONVENTIONS  # parameter counts compared by the fit stage
    params_convention: str | None = None  # None: the convention whose backtest is best

    def thresholds(self):
        from delphi.prereg.gates import GateThresholds

        g = self.gates
        return GateThresholds(tolerance_rel=self.hero.tolerance, backtest_tolerance_rel=g.backtest_tolerance,
                              lobo_tolerance_rel=g.lobo_tolerance, rehearsal_tolerance_rel=g.rehearsal_tolerance,
                              agreement_tolerance_rel=g.agreement_tolerance,
                              interval_width_factor=g.interval_width_factor, min_seeds=g.min_seeds)

    def validate(self, where: str) -> "StudySpec":
        for method in self.fits:
            if method not in FIT_METHODS:
                raise DelphiError(f"{where}: fits: unknown method {method!r} (expected one of {', '.join(FIT_METHODS)})")
        if self.primary_fit not in self.fits:
            raise DelphiError(f"{where}: primary_fit: {self.primary_fit!r} is not among fits {list(self.fits)}")
        if self.primary_fit not in ("isoflop", "parametric", "vpnls"):
            raise DelphiError(f"{where}: primary_fit: {self.primary_fit!r} must predict N*(C): isoflop, parametric or vpnls")
        if self.bootstrap < 0:
            raise DelphiError(f"{where}: bootstrap: must be >= 0, got {self.bootstrap}")
        if not 0 <= self.seed < 2**31 // STUDY_SEED_STRIDE:
            raise DelphiError(f"{where}: seed: must be in [0, {2**31 // STUDY_SEED_STRIDE}), got {self.seed}")
        if self.workers is not None and self.workers < 1:
            raise DelphiError(f"{where}: workers: must be >= 1, got {self.workers}")
        hero = self.hero
        if hero.compute is not None and not hero.compute > 0:
            raise DelphiError(f"{where}: hero.compute: must be positive FLOPs, got {hero.compute}")
        if not hero.compute_multiple > 1:
            raise DelphiError(f"{where}: hero.compute_multiple: must be > 1, got {hero.compute_multiple}")
        if not 0 < hero.tolerance < 1:
            raise DelphiError(f"{where}: hero.tolerance: must be in (0, 1), got {hero.tolerance}")
        if hero.rehearsal_multiple is not None:
            if not hero.rehearsal_multiple > 1:
                raise DelphiError(f"{where}: hero.rehearsal_multiple: must be > 1 (or null: no rehearsal), got {hero.rehearsal_multiple}")
            if hero.compute is None and hero.rehearsal_multiple >= hero.compute_multiple:
                raise DelphiError(f"{where}: hero.rehearsal_multiple: {hero.rehearsal_multiple} must be below "
                                  f"hero.compute_multiple {hero.compute_multiple} (a rehearsal precedes the hero)")
        if any(not m > 1 for m in hero.probe_multiples) or len(set(hero.probe_multiples)) != len(hero.probe_multiples):
            raise DelphiError(f"{where}: hero.probe_multiples: {list(hero.probe_multiples)}, expected distinct multiples > 1")
        if hero.compute is None and any(m >= hero.compute_multiple for m in hero.probe_multiples):
            raise DelphiError(f"{where}: hero.probe_multiples: {list(hero.probe_multiples)} must lie below "
                              f"hero.compute_multiple {hero.compute_multiple} (probes precede the hero)")
        has_probes = bool(self.gates.probes or hero.probe_multiples)
        if hero.probe_correction and not has_probes:
            raise DelphiError(f"{where}: hero.probe_correction: true needs probes (gates.probes or hero.probe_multiples)")
        if hero.probe_carry not in PROBE_CARRIES:
            raise DelphiError(f"{where}: hero.probe_carry: {hero.probe_carry!r}, expected one of {list(PROBE_CARRIES)}")
        if hero.noise_scope not in NOISE_SCOPES:
            raise DelphiError(f"{where}: hero.noise_scope: {hero.noise_scope!r}, expected one of {list(NOISE_SCOPES)}")
        if hero.trajectory not in TRAJECTORY_SOURCES:
            raise DelphiError(f"{where}: hero.trajectory: {hero.trajectory!r}, expected one of {list(TRAJECTORY_SOURCES)}")
        if hero.trajectory == "probes" and not has_probes:
            raise DelphiError(f"{where}: hero.trajectory: probes needs probes (gates.probes or hero.probe_multiples)")
        if not hero.checkpoint_every_s >= 0:
            raise DelphiError(f"{where}: hero.checkpoint_every_s: must be >= 0 seconds, got {hero.checkpoint_every_s}")
        if not self.conventions or any(c not in PARAM_CONVENTIONS for c in self.conventions):
            raise DelphiError(f"{where}: conventions: {list(self.conventions)}, expected a non-empty subset of {list(PARAM_CONVENTIONS)}")
        if self.params_convention is not None and self.params_convention not in PARAM_CONVENTIONS:
            raise DelphiError(f"{where}: params_convention: {self.params_convention!r}, expected one of {list(PARAM_CONVENTIONS)}")
        self.thresholds().validate(f"{where}: gates")
        return self


def load_study(path: str | Path | None) -> tuple[StudySpec, Path, Path | None, tuple[Path, ...], tuple[Path, ...]]:
    """The study spec, its ladder spec path, its preregistration path (None: inside the study dir),
    its LR calibration reports and its probe run dirs.

    With `path` None this is the built-in default study."""
    if path is None:
        base = Path(str(resources.files("delphi") / "defaults"))
        path = base / DEFAULT_STUDY
    path = Path(path)
    spec = from_dict(StudySpec, read_yaml(path), str(path)).validate(str(path))
    ladder = (path.parent / spec.ladder).resolve()
    if not ladder.is_file():
        raise DelphiError(f"{path}: ladder: {ladder} not found")
    prereg = (path.parent / spec.preregistration).resolve() if spec.preregistration else None
    calibrations = tuple((path.parent / c).resolve() for c in spec.gates.lr_calibration)
    for c in calibrations:
        if not c.is_file():
            raise DelphiError(f"{path}: gates.lr_calibration: {c} not found (write it with `delphi ladder lr-calibrate`)")
    # Absolute, not resolved: a link keeps its own name (paper/v5/hero30x -> study/hero).
    probes = tuple(Path(os.path.normpath((path.parent / p).absolute())) for p in spec.gates.probes)
    for p in probes:
        if not (p / SUMMARY_FILE).is_file() or not (p / CONFIG_FILE).is_file():
            raise DelphiError(f"{path}: gates.probes: {p} is not a finished run dir (needs {CONFIG_FILE} and {SUMMARY_FILE})")
    names = probe_names(spec)
    if len(set(names)) != len(names):
        raise DelphiError(f"{path}: gates.probes, hero.probe_multiples: two probes share a name ({', '.join(names)}); "
                          "each names its run in the gates")
    return spec, ladder, prereg, calibrations, probes


# ---- stage bookkeeping ---------------------------------------------------------------------------


class Study:
    """Paths of a study directory and its stage markers."""

    def __init__(self, out: str | Path, spec: StudySpec, ladder_spec_path: Path, prereg: Path | None = None,
                 lr_calibration_sources: tuple[Path, ...] = (), probe_sources: tuple[Path, ...] = (),
                 accept_store: str | None = None) -> None:
        self.out = Path(out)
        self.accept_store = accept_store  # sha256 of a store to go on with though it differs from the pinned one
        self.store_accepted = self.out / "store_accepted.json"
        self.lr_calibration_sources = lr_calibration_sources
        self.probe_sources = probe_sources
        self.spec = spec
        self.ladder_spec_path = ladder_spec_path
        self.ladder_dir = self.out / "ladder"
        self.results = self.out / "results.csv"
        self.fits_dir = self.out / "fits"
        self.hero_config = self.out / "hero.yaml"
        self.rehearsal_config = self.out / "rehearsal.yaml"
        self.rehearsal_run = self.out / "rehearsal"
        self.gates = self.out / "gates.json"
        self.lr_calibration = self.out / "lr_calibration.json"  # the gates stage's merged copy of gates.lr_calibration
        self.probes_dir = self.out / "probes"  # the gates stage's copy of gates.probes (config and summary)
        self.conventions = self.out / "fits" / "conventions.json"
        self.prereg = prereg or self.out / "preregistration.yaml"
        self.hero_run = self.out / "hero"
        self.figures = self.out / "figures"
        self.report = self.out / "report.md"

    def fit_path(self, method: str) -> Path:
        return self.fits_dir / f"{method}.json"

    def marker(self, stage: str) -> Path:
        return self.out / "stages" / f"{stage}.json"

    def done(self, stage: str) -> dict | None:
        path = self.marker(stage)
        return json.loads(path.read_text()) if path.is_file() else None


def _say(text: str) -> None:
    print(f"[study] {text}", file=sys.stderr, flush=True)


def _pin_study(study: Study) -> None:
    """Record the resolved study and ladder spec; refuse to continue a different study in the same dir."""
    from delphi.ladder.spec import ladder_spec_from_dict, ladder_spec_to_dict

    pinned = {"study": to_dict(study.spec), "ladder": ladder_spec_to_dict(_ladder_spec(study))}
    path = study.out / STUDY_FILE
    if path.is_file():
        recorded = json.loads(path.read_text())
        try:  # keys added to StudySpec or LadderSpec since the directory was pinned take their defaults
            recorded["study"] = to_dict(from_dict(StudySpec, recorded.get("study"), str(path)))
            recorded["ladder"] = ladder_spec_to_dict(ladder_spec_from_dict(recorded.get("ladder")))
        except DelphiError:
            pass
        if recorded != json.loads(json.dumps(pinned)):
            raise DelphiError(f"--out: {study.out} holds a different study (study.json differs); choose a new directory")
        return
    atomic_write_json(path, pinned)


# ---- compact copies: a study continued elsewhere, the paper's data -------------------------------

# Too big or too machine-bound to commit: a finished run's result is its config, status, summary
# and metrics; an unfinished run is left out whole and trains again wherever the study continues.
STUDY_FILE = "study.json"  # the pinned study and ladder spec: a directory holds one study
COMPACT_SKIP_DIRS = frozenset({"checkpoints", "logs", "locks", "__pycache__", "wandb"})


def compact_files(study_dir: str | Path, *, resumable: bool = False) -> list[Path]:
    """The files of a study directory worth committing, relative to it: everything but checkpoints,
    logs, locks and the run directories of runs that have not finished (completed or diverged).
    With `resumable` an unfinished run is kept too, with its newest complete checkpoint (one with
    a manifest), so that a fresh machine resumes it where it stopped rather than from step 0: a
    hero longer than one working session continues on the next."""
    from delphi.ladder.driver import is_finished
    from delphi.train.checkpoint import CorruptCheckpoint, list_checkpoints, read_manifest

    study_dir = Path(study_dir)
    unfinished = {p.parent for p in study_dir.rglob(CONFIG_FILE)  # a run dir holds its config.yaml first
                  if not is_finished((read_status(p.parent) or {}).get("status", "pending"))}
    newest: set[Path] = set()
    for run in unfinished if resumable else ():
        for _, path in reversed(list_checkpoints(run)):
            try:
                read_manifest(path)
            except CorruptCheckpoint:
                continue
            newest.add(path)
            break
    files = []
    for path in sorted(study_dir.rglob("*")):
        rel = path.relative_to(study_dir)
        if path.is_dir():
            continue
        if any(d in newest for d in path.parents):
            files.append(rel)
        elif COMPACT_SKIP_DIRS & set(rel.parts) or (not resumable and any(d in unfinished for d in path.parents)):
            continue
        else:
            files.append(rel)
    return files


def export_study(study_dir: str | Path, dest: str | Path, *, resumable: bool = False) -> list[str]:
    """Copy a study's compact data (`compact_files`) into `dest`, each file written atomically: a
    stage of a long study, committed as it completes. To continue on another machine, copy `dest`
    to a study directory and run the same `delphi study` command there; with `resumable`, an
    unfinished run (a hero mid-way) continues from its newest checkpoint."""
    study_dir, dest = Path(study_dir), Path(dest)
    if not (study_dir / STUDY_FILE).is_file():
        raise DelphiError(f"--from-study: {study_dir} is not a study directory (no {STUDY_FILE})")
    copied = []
    for rel in compact_files(study_dir, resumable=resumable):
        atomic_write_bytes(dest / rel, (study_dir / rel).read_bytes())
        copied.append(str(rel))
    return copied


# ---- stages --------------------------------------------------------------------------------------


def stage_prepare(study: Study) -> dict:
    from delphi.data.store import resolve_store

    ladder = _ladder_spec(study)
    store = resolve_store(ladder.run.store)
    meta = json.loads((store / "meta.json").read_text())
    return {"store": str(store), "sha256": meta.get("sha256"), "train_tokens": meta.get("n_train"),
            "val_tokens": meta.get("n_val"), "bytes_by_package": meta.get("bytes_by_package")}


def stage_plan(study: Study) -> dict:
    from delphi.ladder.plan import format_table, plan_ladder, write_ladder

    ladder = _ladder_spec(study)
    preflight = _hero_preflight(study, ladder)
    rows = write_ladder(ladder, plan_ladder(ladder), study.ladder_dir)
    print(format_table(rows), file=sys.stderr)
    return {"rungs": len(rows), "flops": sum(float(r["flops"]) for r in rows), "hero_preflight": preflight}


def _hero_preflight(study: Study, ladder) -> dict:
    """Before the ladder trains: would the rehearsal and the hero fit the ladder's ranges if the
    optimum came out where the spec expects it? If not at the expected optimum itself, the gates
    would refuse after hours of ladder; stop now unless `force: true`."""
    from delphi.ladder.plan import hero_preflight

    if ladder.isoflop is None:
        return {"skipped": "a tokens_per_param ladder has no expected optimum"}
    runs = {"hero": hero_compute(study)}
    if study.spec.hero.rehearsal_multiple is not None:
        runs["rehearsal"] = study.spec.hero.rehearsal_multiple * max(ladder.budgets)
    out = {}
    for name, compute in runs.items():
        check = out[name] = hero_preflight(ladder, compute)
        band = check["inside_factors"]
        expected = check["expected"]
        _say(f"preflight {name} at {compute:.3g} FLOPs: at the expected N* ({check['expected_params']:.3g}) it would be "
             f"{expected['run_id']} ({expected['steps']:,} steps), " + (
                 f"inside the ladder's ranges and depths for a fitted N* {band[0]:g}-{band[1]:g}x the expected" if band else
                 "outside the ladder's ranges or depths at every N* from 0.5x to 2x the expected"))
        if not expected["inside"] and not study.spec.force:
            raise CheckFailed(f"preflight: the {name} at {compute:.3g} FLOPs would leave the ladder's ranges or depths "
                              f"({', '.join(expected['outside'])}) even if the fit found the optimum the ladder spec expects; "
                              f"the gates hero_ranges / hero_depth would refuse it after the ladder trained. Nothing was "
                              f"trained. Lower hero.compute_multiple, add anchors (long rungs of small shapes), widen "
                              f"isoflop.span, or choose a depth rule that keeps the hero at a depth trained near the optimum.")
    return out


def stage_ladder(study: Study) -> dict:
    from delphi.ladder.runner import run_ladder

    check_store_unchanged(study)
    summary = run_ladder(study.ladder_dir, workers=study.spec.workers)
    if summary.get("failed"):
        raise DelphiError(f"ladder: rungs failed: {summary['failed']}; see {study.ladder_dir}/logs and rerun the study")
    return summary


def check_store_unchanged(study: Study) -> None:
    """A study continued elsewhere (its committed stages copied to a fresh machine) must train on
    the corpus its first rungs trained on: a built-in store is rebuilt from the machine's files
    (`environment`: its installed packages), so compare its sha256 with the one pinned at prepare.

    Each store accepted instead (`--accept-store`) is appended to store_accepted.json with its
    bytes per package and the hero's step when it was accepted, so that a later machine can name
    what differs from the store the study last trained on, and the hero's steps can be traced."""
    prepared = study.done("prepare")
    if prepared is None:
        return
    pinned = prepared["result"].get("sha256")
    now = stage_prepare(study)
    if pinned is None or now["sha256"] == pinned:
        return
    history = read_store_acceptances(study.store_accepted)
    last = history["accepted"][-1] if history["accepted"] else {"sha256": pinned, **prepared["result"]}
    if study.accept_store != now["sha256"]:
        from delphi.data.store import package_differences

        before, after = last.get("bytes_by_package"), now.get("bytes_by_package")
        which = (f"; packages that differ from sha256 {last['sha256'][:12]}: {package_differences(before, after)}"
                 if before and after else "")
        raise DelphiError(f"{study.marker('prepare')}: the study's rungs trained on store sha256 {pinned}, but "
                          f"{now['store']} now holds sha256 {now['sha256']} (another machine or other installed "
                          f"packages{which}); rebuild that corpus, start a new study directory, or pass "
                          f"--accept-store {now['sha256']} to go on with it (recorded in {study.store_accepted})")
    if last["sha256"] != now["sha256"]:
        hero = read_status(study.hero_run) or {}
        history["accepted"].append({
            "sha256": now["sha256"], "train_tokens": now.get("train_tokens"), "val_tokens": now.get("val_tokens"),
            "accepted_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hero_step": hero.get("step"),
            "bytes_by_package": now.get("bytes_by_package")})
        atomic_write_json(study.store_accepted, {"pinned_sha256": pinned, "pinned_train_tokens":
                                                 prepared["result"].get("train_tokens"), "store": now["store"], **history})
    _say(f"store: going on with sha256 {now['sha256'][:12]} ({now.get('train_tokens')} train tokens), not the pinned "
         f"{pinned[:12]} ({prepared['result'].get('train_tokens')}), as --accept-store asked; recorded in {study.store_accepted}")


def read_store_acceptances(path: Path) -> dict[str, list[dict]]:
    """The stores a study went on with instead of its pinned one, oldest first (none if no file).
    A file from before the history was kept holds one store as accepted_sha256/accepted_train_tokens."""
    if not path.is_file():
        return {"accepted": []}
    record = json.loads(path.read_text())
    if "accepted_sha256" in record:
        return {"accepted": [{"sha256": record["accepted_sha256"], "train_tokens": record.get("accepted_train_tokens")}]}
    return {"accepted": list(record.get("accepted", []))}


def stage_collect(study: Study) -> dict:
    from delphi.ladder.collect import collect_ladder, write_results

    table = collect_ladder(study.ladder_dir)
    write_results(table, study.results)
    return {"rows": len(table), "results": str(study.results)}


def _ladder_spec(study: Study):
    """The study's ladder: the ladder spec with its run seeds offset by the study seed (seed_offset)."""
    from delphi.ladder.spec import load_ladder_spec

    spec = load_ladder_spec(study.ladder_spec_path)
    offset = seed_offset(study.spec.seed)
    if offset == 0:
        return spec
    run = replace(spec.run, seeds=tuple(s + offset for s in spec.run.seeds),
                  top_seeds=tuple(s + offset for s in spec.run.top_seeds))
    return replace(spec, run=run)


def seed_offset(study_seed: int) -> int:
    """What the study seed adds to every ladder run seed: studies with different seeds train
    different inits and data orders (the robustness check of issue 10), seed 0 the spec's own."""
    return STUDY_SEED_STRIDE * study_seed


def chosen_convention(study: Study) -> str:
    """The parameter-count convention the fits use: the study's, or the one the fit stage chose."""
    done = study.done("fit")
    if done is not None and done["result"].get("params_convention"):
        return done["result"]["params_convention"]
    return study.spec.params_convention or "nonembedding"


def load_table(study: Study, convention: str | None = None) -> pd.DataFrame:
    """The results table with N counted as `convention` and the ladder family's exact FLOPs attached."""
    from delphi.fits import load_results
    from delphi.ladder.plan import flops_family

    convention = convention or chosen_convention(study)
    return load_results(study.results, params_convention=convention, family=flops_family(_ladder_spec(study), convention))


def _fit_one(study: Study, method: str, table: pd.DataFrame, n_bootstrap: int) -> Any:
    from delphi.fits import FITTERS

    kwargs: dict[str, Any] = {"n_bootstrap": n_bootstrap, "seed": study.spec.seed}
    if method == "frontier":
        kwargs["target_compute"] = [hero_compute(study)]
    fit = FITTERS[method](table, **kwargs)
    family = table.attrs.get("flops_family")
    return fit.with_family(family) if family is not None and hasattr(fit, "with_family") else fit


def optimal_exponent(fit: Any, compute_lo: float, compute_hi: float) -> float | None:
    """d ln N* / d ln C of the fit between two computes (under its own allocation, exact or 6ND)."""
    lo, hi = fit.predict(compute=compute_lo).get("params"), fit.predict(compute=compute_hi).get("params")
    if lo is None or hi is None or not (lo > 0 and hi > 0):
        return None
    return math.log(float(hi) / float(lo)) / math.log(compute_hi / compute_lo)


def compare_conventions(study: Study) -> dict:
    """For each parameter-count convention: the isoFLOP exponent, the primary law's compute-optimal
    exponent, and its held-out-budget backtest; the convention with the lowest backtest error wins."""
    from delphi.fits import backtest
    from delphi.fits.isoflop import isoflop_exponent_by_convention

    raw = pd.read_csv(study.results)
    iso = isoflop_exponent_by_convention(raw, tuple(study.spec.conventions))
    budgets = sorted(float(b) for b in raw["budget"].unique())
    rows = {}
    for convention in study.spec.conventions:
        row: dict[str, Any] = {"isoflop_a": iso.get(convention, {}).get("a"),
                               "isoflop_a_interval_90": iso.get(convention, {}).get("a_interval_90")}
        try:
            table = load_table(study, convention)
            fit = _fit_one(study, study.spec.primary_fit, table, 0)
            row["law_a"] = optimal_exponent(fit, budgets[-1], hero_compute(study))
            row["fit_status"] = getattr(fit, "status", None)
            bt = backtest(table, lambda t: _fit_one(study, study.spec.primary_fit, t, 0))
            row["backtest_mean_abs_rel_error"] = bt["mean_abs_rel_error"]
            row["backtest"] = [{"budget": b["budget"], "rel_error": b["rel_error"]} for b in bt["budgets"]]
        except DelphiError as e:
            row["error"] = str(e)
        rows[convention] = row
    scored = {c: r["backtest_mean_abs_rel_error"] for c, r in rows.items() if r.get("backtest_mean_abs_rel_error") is not None}
    if study.spec.params_convention is not None:
        chosen, why = study.spec.params_convention, "set by the study spec"
    elif scored:
        chosen = min(scored, key=scored.get)
        why = f"lowest held-out-budget backtest |error| ({scored[chosen]:.2%}) of {len(scored)} conventions"
    else:
        chosen, why = "nonembedding", "no convention could be backtested; non-embedding N by default"
    return {"conventions": rows, "chosen": chosen, "why": why, "primary_fit": study.spec.primary_fit}


def stage_fit(study: Study) -> dict:
    conventions = compare_conventions(study)
    atomic_write_json(study.conventions, conventions)
    convention = conventions["chosen"]
    _say(f"parameter convention: {convention} ({conventions['why']})")
    for name, row in conventions["conventions"].items():
        _say(f"  {name}: isoFLOP a = {_fmt(row.get('isoflop_a'), '.3f')}, {study.spec.primary_fit} a = "
             f"{_fmt(row.get('law_a'), '.3f')}, backtest |error| {_fmt(row.get('backtest_mean_abs_rel_error'), '.2%')}"
             + (f" ({row['error']})" if row.get("error") else ""))
    table = load_table(study, convention)
    out: dict[str, Any] = {}
    for method in study.spec.fits:
        start = time.perf_counter()
        try:
            fit = _fit_one(study, method, table, study.spec.bootstrap)
        except DelphiError as e:
            if method == study.spec.primary_fit:
                raise
            out[method] = {"error": str(e)}  # a secondary law that cannot be fitted here is reported, not fatal
            _say(f"fit {method}: failed ({e})")
            continue
        atomic_write_json(study.fit_path(method), fit.to_json())
        out[method] = {"params": fit.params, "seconds": round(time.perf_counter() - start, 2),
                       "status": getattr(fit, "status", None), "allocation": getattr(fit, "allocation", None),
                       "seed_noise_nats": fit.diagnostics.get("seed_noise_nats")}
        _say(f"fit {method}: {', '.join(f'{k}={v:.4g}' for k, v in fit.params.items() if isinstance(v, (int, float)))}"
             + (f" [{fit.status}]" if getattr(fit, "status", "ok") != "ok" else ""))
    return {"params_convention": convention, "fits": out}


# The backtest's own bootstrap: enough draws for a 90% interval, fewer than the final fits'.
BACKTEST_BOOTSTRAP_MAX = 100


def stage_backtest(study: Study) -> dict:
    """Hold out the top budget (every method, with 90% intervals and coverage), then every budget above
    the third in turn (mean |error| and coverage per method)."""
    from delphi.fits import backtest
    from delphi.fits.backtest import all_holdouts

    table = load_table(study)
    n_boot = min(study.spec.bootstrap, BACKTEST_BOOTSTRAP_MAX)
    methods = [m for m in study.spec.fits if m != "envelope"]
    out: dict[str, Any] = {}
    for method in methods:
        try:
            result = backtest(table, lambda t, m=method: _fit_one(study, m, t, n_boot))
        except DelphiError as e:  # too few budgets below the cut for this method
            out[method] = {"error": str(e)}
            continue
        out[method] = result
        for b in result["budgets"]:
            i90 = b.get("loss_interval_90")
            _say(f"backtest {method}: budget {b['budget']:.3g}: predicted {b['predicted_loss']:.4f}"
                 + (f" [{i90[0]:.4f}, {i90[1]:.4f}]" if i90 else "")
                 + f", observed {b['observed_best_loss']:.4f} ({b['rel_error']:+.2%})")
    atomic_write_json(study.fits_dir / "backtest.json", out)
    summary = None
    try:
        many = all_holdouts(table, {m: (lambda t, m=m: _fit_one(study, m, t, n_boot)) for m in methods})
        atomic_write_json(study.fits_dir / "backtest_all.json", many)
        summary = many["summary"]
    except DelphiError as e:  # too few budgets for more than one cut
        _say(f"backtest over every held-out budget: skipped ({e})")
    return {"methods": sorted(out), "summary": summary}


def hero_compute(study: Study) -> float:
    if study.spec.hero.compute is not None:
        return float(study.spec.hero.compute)
    return study.spec.hero.compute_multiple * max(_ladder_spec(study).budgets)


def _sized_run(study: Study, compute: float, name: str, out: Path) -> dict:
    """Size a run at `compute` from the primary fit (exact-FLOP allocation, inside the ladder's ranges)
    and write its train config to `out`."""
    from delphi.ladder.hero import hero_from_fit
    from delphi.train.config import train_config_from_dict, train_config_to_dict

    rung, details = hero_from_fit(study.fit_path(study.spec.primary_fit), compute, _ladder_spec(study),
                                  seed=study.spec.seed, results=pd.read_csv(study.results))
    config = train_config_to_dict(rung.train) | {"name": name}
    # The rung's own events (the ladder's evals_per_run, on multiples of its step quantum) let the
    # trainer fuse several steps per call; an override of eval_every may cost that.
    if study.spec.hero.eval_every:
        config.update(eval_every=study.spec.hero.eval_every, checkpoint_every=study.spec.hero.eval_every)
    if name == "hero" and study.spec.hero.checkpoint_every_s:
        config["checkpoint_every_s"] = study.spec.hero.checkpoint_every_s
    atomic_write_yaml(out, train_config_to_dict(train_config_from_dict(config)))
    return details


def stage_hero(study: Study) -> dict:
    from delphi.fits import load_fit

    fit = load_fit(study.fit_path(study.spec.primary_fit))
    n_star = fit.predict(compute=hero_compute(study)).get("params")
    if n_star is None or not float(n_star) > 0:
        bound = ", ".join(fit.diagnostics.get("at_bound") or []) or "none"
        raise CheckFailed(f"the {study.spec.primary_fit} fit has no compute-optimal point (status {getattr(fit, 'status', '?')}, "
                          f"on a bound: {bound}; parameters {fit.params}): gate fit_status fails and the hero cannot be "
                          f"sized; nothing was trained or sealed. The ladder does not determine the law: add budgets or seeds.")
    return _sized_run(study, hero_compute(study), "hero", study.hero_config)


def stage_dress_rehearsal(study: Study) -> dict:
    """Predict and train one run at ~3x the top budget, sized like the hero; its error is a gate.

    It runs after the other gates passed (no compute is spent on a rehearsal of a ladder the gates
    already refuse) and stops the study before the hero when it misses, unless `force: true`."""
    from delphi.fits import load_fit
    from delphi.prereg.gates import gate_dress_rehearsal
    from delphi.prereg.create import run_predicted_vs_actual
    from delphi.train.config import load_train_config
    from delphi.train.trainer import train

    multiple = study.spec.hero.rehearsal_multiple
    if multiple is None:
        return {"skipped": "hero.rehearsal_multiple is null: no dress rehearsal"}
    compute = multiple * max(_ladder_spec(study).budgets)
    check_store_unchanged(study)
    if not study.rehearsal_config.is_file():
        _sized_run(study, compute, "rehearsal", study.rehearsal_config)
    fit = load_fit(study.fit_path(study.spec.primary_fit))
    cfg = load_train_config(study.rehearsal_config)
    from delphi.prereg.create import predict_hero, run_noise_nats

    predicted = predict_hero(fit, cfg)[0]
    _say(f"dress rehearsal at {compute:.3g} FLOPs ({multiple:g}x the top budget): predicted {predicted['loss']:.4f}")
    _finished(train(cfg, study.rehearsal_run, resume=(study.rehearsal_run / CONFIG_FILE).exists()), "the dress rehearsal")
    result = run_predicted_vs_actual(fit, study.rehearsal_run, run_noise_nats(fit, load_table(study), study.spec.hero.noise_scope)[0])
    _say(f"dress rehearsal: actual {result['actual']:.4f} vs predicted {result['predicted']:.4f} ({result['rel_error']:+.2%})")
    thresholds = study.spec.thresholds()
    gate = gate_dress_rehearsal(result | {"compute": compute}, thresholds.rehearsal_tolerance_rel or thresholds.tolerance_rel)
    _say(f"gate {'PASS' if gate.passed else 'FAIL'} {gate.name}: {gate.detail}")
    if not gate.passed and not study.spec.force:
        raise CheckFailed(f"gates failed before the hero trained: dress_rehearsal ({gate.detail}; {gate.threshold}); "
                          "the hero was NOT trained and nothing was sealed. Set `force: true` in the study file to go on anyway.")
    return result | {"multiple": multiple, "gate_passed": gate.passed}


def _rehearsal(study: Study) -> dict | None:
    done = study.done("dress_rehearsal")
    if done is None or done["result"].get("skipped"):
        return None
    return done["result"]


def _primary_backtest(study: Study) -> dict | None:
    path = study.fits_dir / "backtest.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get(study.spec.primary_fit)


def stage_gates(study: Study) -> dict:
    """Every gate, PASS/FAIL, before the hero trains; a failure stops the study here unless `force: true`."""
    from delphi.prereg import gates as gt
    from delphi.prereg.create import compute_gates, hero_prediction
    from delphi.train.config import load_train_config

    hero = load_train_config(study.hero_config)
    pin_lr_calibration(study)
    pin_probes(study)
    # While the study's own probes are untrained, the prediction they will correct is not known yet:
    # the ladder's gates decide whether to spend their compute, the prediction's wait for the seal.
    pending = [m for m in study.spec.hero.probe_multiples if not (study.probes_dir / own_probe_name(m) / SUMMARY_FILE).is_file()]
    correct = study.spec.hero.probe_correction and not pending
    probes = probe_runs(study)
    final, fit = hero_prediction(study.fit_path(study.spec.primary_fit), hero, study.results, probes,
                                 correct, study.spec.hero.probe_carry, study.spec.hero.noise_scope)  # what prereg will seal
    thresholds = study.spec.thresholds()
    rehearsal = _rehearsal(study)
    gates = compute_gates(fit, results=study.results, hero=hero, final=final, thresholds=thresholds,
                          backtest=_primary_backtest(study), rehearsal=rehearsal, ladder=study.ladder_dir,
                          rehearsal_run=study.rehearsal_run if rehearsal is not None else None,
                          lr_calibration=_lr_calibration(study), probe_runs=probes, probe_correction=correct,
                          probe_carry=study.spec.hero.probe_carry, noise_scope=study.spec.hero.noise_scope,
                          recipe_check=getattr(study, "recipe_check", None))
    deferred = [g for g in gates if pending and g.name in PREDICTION_GATES]
    deciding = [g for g in gates if g not in deferred]
    report = gt.gate_report(deciding, forced=study.spec.force, thresholds=thresholds) | {"prediction": final}
    if deferred:
        report["deferred"] = {"gates": [g.to_json() for g in deferred],
                              "why": f"the study's probes at {', '.join(f'{m:g}x' for m in pending)} have not trained: "
                                     "these gates are evaluated at the seal, after them"}
    atomic_write_json(study.gates, report)
    for line in gt.gate_lines(deciding):
        _say(f"gate {line}")
    for g in deferred:
        _say(f"gate DEFERRED {g.name}: evaluated at the seal, after the study's probes")
    if not report["passed"]:
        if not study.spec.force:
            raise CheckFailed(f"gates failed before the hero trained: {', '.join(report['failed'])}; the hero was NOT "
                              f"trained and nothing was sealed (report {study.gates}). Fix the ladder (more seeds, "
                              f"budgets, healthier rungs) or set `force: true` in the study file to go on anyway.")
        _say(f"GATES FAILED ({', '.join(report['failed'])}); going on because the study says force: true "
             "(the preregistration records it)")
    return {"passed": report["passed"], "failed": report["failed"], "forced": bool(study.spec.force and not report["passed"]),
            "gates": report["gates"]}


def pin_lr_calibration(study: Study) -> Path | None:
    """Merge gates.lr_calibration into one report in the study dir, where the gates and the seal read
    it: the study's data then hold the evidence. Written afresh by the gates stage (a calibration may
    be extended while the ladder trains); the seal reads the copy the gates saw."""
    from delphi.ladder.lr_calibration import merge_reports

    if not study.lr_calibration_sources:
        return None
    atomic_write_json(study.lr_calibration, merge_reports(list(study.lr_calibration_sources)))
    return study.lr_calibration


def pin_probes(study: Study) -> None:
    """Copy each of gates.probes' config, status, summary and metrics into the study dir, where the
    gates, the seal and the paper read them: the study's data then hold the evidence (and a
    snapshot, which keeps finished runs only, keeps them)."""
    for source in study.probe_sources:
        for name in (CONFIG_FILE, STATUS_FILE, SUMMARY_FILE, METRICS_FILE):
            if (source / name).is_file():
                atomic_write_bytes(study.probes_dir / source.name / name, (source / name).read_bytes())


def own_probe_name(multiple: float) -> str:
    return f"probe{multiple:g}x"


def probe_names(spec: StudySpec) -> list[str]:
    """Each probe's name (its directory under the study's probes/, and in the gates): gates.probes
    by their directory's name, then the study's own (hero.probe_multiples), nearest first."""
    return [Path(p).name for p in spec.gates.probes] + [own_probe_name(m) for m in sorted(spec.hero.probe_multiples)]


def probe_runs(study: Study) -> list[Path]:
    """The pinned copies of gates.probes (a study continued from a snapshot has them), then the
    study's own probes (hero.probe_multiples) that have finished."""
    runs = [study.probes_dir / name for name in probe_names(study.spec)]
    missing = [str(r) for r in runs[:len(study.spec.gates.probes)] if not (r / SUMMARY_FILE).is_file()]
    if missing:
        raise DelphiError(f"{', '.join(missing)}: missing; the gates stage copies them from gates.probes")
    return [r for r in runs if (r / SUMMARY_FILE).is_file()]


def stage_probes(study: Study) -> dict:
    """Each of hero.probe_multiples, smallest first: sized from the primary fit like the hero,
    its prediction sealed into STUDY/probes/NAME.prereg.yaml before its first step (with force: the
    gates judge the hero, not a probe), then trained against the seal. A probe that started before
    its seal existed is refused; an interrupted one resumes."""
    from delphi.fits import load_fit
    from delphi.prereg.create import create_prereg, run_noise_nats, run_predicted_vs_actual
    from delphi.prereg.format import predicted_loss_curve
    from delphi.train.config import load_train_config
    from delphi.train.trainer import train

    multiples = sorted(study.spec.hero.probe_multiples)
    if not multiples:
        return {"skipped": "hero.probe_multiples is empty: no probes of the study's own"}
    check_store_unchanged(study)
    fit = load_fit(study.fit_path(study.spec.primary_fit))
    noise = run_noise_nats(fit, load_table(study), study.spec.hero.noise_scope)[0]
    top = max(_ladder_spec(study).budgets)
    results = []
    for multiple in multiples:
        name = own_probe_name(multiple)
        run, config, seal = study.probes_dir / name, study.probes_dir / f"{name}.yaml", study.probes_dir / f"{name}.prereg.yaml"
        if not config.is_file():
            _sized_run(study, multiple * top, name, config)
        if not seal.exists():
            if (run / METRICS_FILE).exists():
                raise DelphiError(f"{run}: the probe started before its preregistration existed; remove it to start over")
            create_prereg(study.fit_path(study.spec.primary_fit), config, seal, ladder=study.ladder_dir, results=study.results,
                          tolerance_rel=study.spec.hero.tolerance, author=study.spec.author, force=True,
                          rationale=f"Study {study.spec.name}: probe at {multiple:g}x the top budget, evidence for the hero's gates "
                                    "(sealed with force: the gates judge the hero, not a probe).",
                          bootstrap=min(study.spec.bootstrap, 200), seed=study.spec.seed, thresholds=study.spec.thresholds(),
                          backtest=_primary_backtest(study))
        cfg = load_train_config(config)
        _say(f"probe {name}: {cfg.flops:.3g} FLOPs, sealed in {seal}")
        _finished(train(cfg, run, resume=(run / CONFIG_FILE).exists(), predicted_loss=predicted_loss_curve(seal)), f"probe {name}")
        result = run_predicted_vs_actual(fit, run, noise)
        _say(f"probe {name}: actual {result['actual']:.4f} vs predicted {result['predicted']:.4f} ({result['rel_error']:+.2%})")
        results.append(result | {"name": name, "multiple": multiple})
    return {"probes": results}


def _lr_calibration(study: Study) -> list[Path] | None:
    """The merged copy, when the study names calibrations (a study continued from a snapshot has it)."""
    if not study.spec.gates.lr_calibration:
        return None
    if not study.lr_calibration.is_file():
        raise DelphiError(f"{study.lr_calibration}: missing; the gates stage writes it from gates.lr_calibration")
    return [study.lr_calibration]


def stage_prereg(study: Study) -> dict:
    from delphi.prereg.create import create_prereg

    if study.prereg.exists():  # sealed on an earlier, interrupted attempt: never rewrite it
        from delphi.prereg.format import read, seal_status

        if not seal_status(read(study.prereg))["ok"]:
            raise DelphiError(f"{study.prereg}: exists but its seal is broken; it was edited after sealing")
        return {"prereg": str(study.prereg), "note": "sealed earlier"}
    if (study.hero_run / METRICS_FILE).exists():
        raise DelphiError(f"{study.hero_run}: the hero started before a preregistration existed; remove it to start over")
    rehearsal = _rehearsal(study)
    doc = create_prereg(
        study.fit_path(study.spec.primary_fit), study.hero_config, study.prereg,
        ladder=study.ladder_dir, results=study.results, tolerance_rel=study.spec.hero.tolerance,
        author=study.spec.author, rationale=study.spec.rationale or _default_rationale(study),
        bootstrap=min(study.spec.bootstrap, 200), seed=study.spec.seed,
        force=study.spec.force, thresholds=study.spec.thresholds(), backtest=_primary_backtest(study),
        rehearsal=rehearsal, rehearsal_run=study.rehearsal_run if rehearsal is not None else None,
        lr_calibration=_lr_calibration(study), probe_runs=probe_runs(study),
        probe_correction=study.spec.hero.probe_correction, probe_carry=study.spec.hero.probe_carry,
        noise_scope=study.spec.hero.noise_scope, trajectory_from_probes=study.spec.hero.trajectory == "probes",
        recipe_check=getattr(study, "recipe_check", None),
    )
    final = doc.get("prediction", {}).get("final", {}) if isinstance(doc.get("prediction"), dict) else {}
    return {"prereg": str(study.prereg), "final": final, "forced": doc.get("forced", False)}


def _default_rationale(study: Study) -> str:
    return (f"Study {study.spec.name}: the {study.spec.primary_fit} law fitted on the ladder (N counted as "
            f"{chosen_convention(study)}, compute allocated under the family's exact FLOPs) sizes the hero "
            f"and predicts its final loss; the trajectory comes from the LR-annealing curve law fitted on the ladder's curves.")


def stage_train_hero(study: Study) -> dict:
    from delphi.prereg.format import predicted_loss_curve
    from delphi.train.config import load_train_config
    from delphi.train.trainer import train

    check_store_unchanged(study)
    cfg = load_train_config(study.hero_config)
    resume = (study.hero_run / CONFIG_FILE).exists()
    return _finished(train(cfg, study.hero_run, resume=resume, predicted_loss=predicted_loss_curve(study.prereg)), "the hero")


def _finished(summary: dict, what: str) -> dict:
    """A run that ended (completed, or diverged: a diverged hero is a failed prediction, checked as
    such); one stopped before its end (a signal) is not a stage done: nothing after it may run."""
    if summary.get("status") not in ("completed", "diverged"):
        raise CheckFailed(f"{what} stopped before its end ({summary.get('reason') or summary.get('status')}); nothing "
                          "after it ran or was checked. Run the same `delphi study` command to resume it.")
    return summary


def stage_check(study: Study) -> dict:
    from delphi.prereg.check import check

    result, _, _ = check(study.prereg, run_dir=study.hero_run)
    _say(f"verdict: {result['verdict']}")
    return result


def _hero_point(study: Study) -> dict:
    from delphi.model.flops import count_params
    from delphi.train.config import load_train_config

    if not study.hero_config.is_file():
        return {}
    cfg = load_train_config(study.hero_config)
    return {"compute": cfg.flops,
            "params": count_params(cfg.model).nonembedding, "tokens": cfg.tokens}


def _residual_prediction(fit: Any, table: pd.DataFrame):
    import numpy as np

    terms = {t: table[t].to_numpy(float) for t in fit.law_terms if t in table}
    pred = fit.predict_run(params=table["params"].to_numpy(float), tokens=table["tokens"].to_numpy(float),
                           flops=table["flops"].to_numpy(float), **terms)
    return np.asarray(pred["loss"], float)


def stage_figures(study: Study) -> dict:
    """Every figure of the study, drawn by the library functions behind `delphi plot ...`."""
    from delphi.fits import curves as cv
    from delphi.fits import load_fit
    from delphi.fits.isoflop import per_budget_optima
    from delphi.plot import figures as pf
    from delphi.plot.style import save_figure
    from delphi.prereg.check import compare, read_run_dir
    from delphi.prereg.format import load_prereg

    study.figures.mkdir(parents=True, exist_ok=True)
    fig = lambda name: str(study.figures / f"{name}.png")  # noqa: E731
    table = load_table(study)
    primary = load_fit(study.fit_path(study.spec.primary_fit))
    fits = {m: load_fit(study.fit_path(m)) for m in study.spec.fits if study.fit_path(m).is_file()}
    files: list[str] = []
    failed: list[str] = []

    def draw(name: str, make: Callable[[], Any]) -> None:
        try:
            files.extend(save_figure(make(), fig(name)))
        except (DelphiError, ValueError, KeyError) as e:  # one figure's missing input does not lose the others
            failed.append(f"{name} ({e})")

    draw("isoflop", lambda: pf.isoflop_figure(table, fits["isoflop"].extra.get("optima") if "isoflop" in fits else None))

    def allocation():
        optima = (fits["isoflop"].extra.get("optima") if "isoflop" in fits else None) or per_budget_optima(table)[0]
        frame = pd.DataFrame({"budget": [o["flops"] for o in optima], "params": [o["params_opt"] for o in optima],
                              "tokens": [o["tokens_opt"] for o in optima]})
        hero = _hero_point(study)
        return pf.allocation_figure(frame, primary, hero.get("compute"), hero.get("params"), hero.get("tokens"))

    draw("allocation", allocation)
    prereg = load_prereg(study.prereg) if study.prereg.is_file() else None
    run = read_run_dir(study.hero_run) if study.hero_run.is_dir() else None

    def frontier():
        hero_c = interval = None
        if prereg is not None:
            final = prereg.doc["prediction"]["final"]
            hero_c = prereg.doc["hero"]["flops"]
            lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
            interval = (final["loss"], lo, hi)
        return pf.frontier_figure(table, primary, hero_c, interval, run.final_loss if run else None)

    draw("frontier", frontier)
    if prereg is not None:
        def prediction():
            verdict = compare(prereg, run)["verdict"] if run else None
            return pf.prediction_figure(prereg.doc, run, verdict)

        draw("prediction", prediction)

    def ladder_curves():
        curves = cv.load_ladder_curves(study.ladder_dir)
        law = cv.fit_curve_law(curves, bootstrap=0, seed=study.spec.seed, lr_ref=cv.ladder_lr_ref(study.ladder_dir))
        return pf.curves_figure(curves, law, None)

    draw("ladder_curves", ladder_curves)
    for method, f in fits.items():
        if method != "frontier":
            draw(f"residuals_{method}", lambda f=f: pf.residuals_figure(table, _residual_prediction(f, table),
                                                                         title=f"{f.kind} fit ({f.method}) residuals"))
    for problem in failed:
        _say(f"figure not drawn: {problem}")
    return {"files": sorted(p for p in files if p.endswith(".png")), "not_drawn": failed}


def stage_report(study: Study) -> dict:
    atomic_write_text(study.report, render_report(study))
    return {"report": str(study.report)}


STAGES: tuple[tuple[str, Callable[[Study], dict]], ...] = (
    ("prepare", stage_prepare),
    ("plan", stage_plan),
    ("ladder", stage_ladder),
    ("collect", stage_collect),
    ("fit", stage_fit),
    ("backtest", stage_backtest),
    ("hero", stage_hero),
    ("gates", stage_gates),
    ("dress_rehearsal", stage_dress_rehearsal),
    ("probes", stage_probes),
    ("prereg", stage_prereg),
    ("train_hero", stage_train_hero),
    ("check", stage_check),
    ("figures", stage_figures),
    ("report", stage_report),
)


STAGE_NAMES = tuple(name for name, _ in STAGES)


def run_study(study_path: str | Path | None, out: str | Path, *, stop_after: str | None = None,
              accept_store: str | None = None) -> dict:
    """Run (or resume) the stages of a study; return the verdict and the report path.

    `stop_after` ends the invocation after that stage, e.g. "prereg" so the sealed
    file can be committed before the hero's first step; the next call resumes.
    `accept_store` (a sha256) goes on with a corpus store that differs from the one pinned at
    prepare, when it is that store (`check_store_unchanged`; recorded in store_accepted.json).
    """
    if stop_after is not None and stop_after not in STAGE_NAMES:
        raise DelphiError(f"--stop-after: unknown stage {stop_after!r} (expected one of {', '.join(STAGE_NAMES)})")
    if accept_store is not None and not re.fullmatch(r"[0-9a-f]{64}", accept_store):
        raise DelphiError(f"--accept-store: {accept_store!r} is not a store's sha256 (64 lowercase hex digits, "
                          "as the study's refusal prints it)")
    spec, ladder_spec_path, prereg, calibrations, probes = load_study(study_path)
    study = Study(out, spec, ladder_spec_path, prereg, calibrations, probes, accept_store)
    from delphi.ladder.recipe_check import study_report_path

    study.recipe_check = study_report_path(study_path, spec.gates.recipe_check)
    _pin_study(study)
    started = time.perf_counter()
    for name, stage in STAGES:
        if study.done(name) is not None:
            _say(f"{name}: done earlier, skipped")
        else:
            _say(f"{name}: running")
            t0 = time.perf_counter()
            result = stage(study)
            atomic_write_json(study.marker(name), {"stage": name, "seconds": round(time.perf_counter() - t0, 2), "result": result})
            _say(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        if name == stop_after:  # also when it was done earlier: the invocation goes no further
            _say(f"stopped after {name}, as asked; run the same command without --stop-after to continue")
            return {"out": str(study.out), "stopped_after": name, "verdict": None}
    verdict = study.done("check")["result"]
    _say(f"report: {study.report} ({time.perf_counter() - started:.0f} s this invocation)")
    return {"out": str(study.out), "report": str(study.report), "verdict": verdict.get("verdict"),
            "predicted_loss": verdict.get("predicted_final_loss"), "actual_loss": verdict.get("actual_final_loss"),
            "rel_error": verdict.get("rel_error"), "covered_90": verdict.get("covered_90")}


# ---- report --------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return f"[{_fmt(x[0], spec)}, {_fmt(x[1], spec)}]"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def render_report(study: Study) -> str:
    """report.md: every number comes from the stage markers and the files they name."""
    from delphi.prereg.gates import ladder_top_budget

    plan = study.done("plan")["result"]
    fits = study.done("fit")["result"]
    fits = fits.get("fits", fits)  # studies before conventions stored the fits at the top level
    hero = study.done("hero")["result"]
    check = study.done("check")["result"]
    backtest = json.loads((study.fits_dir / "backtest.json").read_text())
    table = pd.read_csv(study.results)
    top = table["budget"].max()
    lines = [
        f"# Study `{study.spec.name}`",
        "",
        f"Ladder: {plan['rungs']} runs, {plan['flops']:.3g} FLOPs in all, budgets "
        f"{', '.join(f'{b:.3g}' for b in sorted(table['budget'].unique()))}. "
        f"Hero: {hero['compute']:.3g} FLOPs ({hero['compute'] / ladder_top_budget(table):.3g}x the top isoFLOP budget, "
        f"{hero['compute'] / top:.3g}x the largest run), "
        f"d_model {hero.get('d_model')}, {hero.get('n_layers')} layers, N = {_fmt(hero.get('params'))}, "
        f"D = {_fmt(hero.get('tokens'))} tokens.",
        "",
        "## Preregistered prediction against the outcome",
        "",
        "| quantity | predicted | actual | relative error | inside 90% interval | verdict |",
        "|---|---|---|---|---|---|",
        f"| hero final val loss (nats/byte) | {_fmt(check.get('predicted_final_loss'))} | {_fmt(check.get('actual_final_loss'))} "
        f"| {_fmt(check.get('rel_error'), '+.2%')} | {_fmt(check.get('covered_90'))} | {check.get('verdict')} |",
        "",
        f"{check.get('why', '')}",
        "",
    ]
    lines += _gates_section(study)
    lines += _rehearsal_section(study)
    lines += _probes_section(study)
    lines += _conventions_section(study)
    lines += ["## Fits", "", "| method | status | allocation | parameters |", "|---|---|---|---|"]
    for method, info in fits.items():
        if "error" in info:
            lines.append(f"| {method} | failed | - | {info['error']} |")
            continue
        params = ", ".join(f"{k} = {_fmt(v)}" for k, v in info["params"].items() if isinstance(v, (int, float)))
        lines.append(f"| {method} | {_fmt(info.get('status'))} | {_fmt(info.get('allocation'))} | {params} |")
    lines += ["", "## Backtests (fit below the top budget, predict it)", "",
              "| method | budget | predicted best loss | 90% interval | observed best loss | relative error | 90% covered |",
              "|---|---|---|---|---|---|---|"]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            lines.append(f"| {method} | {b['budget']:.3g} | {_fmt(b['predicted_loss'])} | {_fmt(b.get('loss_interval_90'))} "
                         f"| {_fmt(b['observed_best_loss'])} | {_fmt(b['rel_error'], '+.2%')} | {_fmt(b.get('covered_90'))} |")
        if "error" in result:
            lines.append(f"| {method} | - | - | - | - | {result['error']} | - |")
    summary = (study.done("backtest") or {}).get("result", {}).get("summary")
    if summary:
        lines += ["", "Every budget above the third held out in turn:", "",
                  "| method | points | mean abs error | 90% coverage |", "|---|---|---|---|"]
        for method, s in summary.items():
            lines.append(f"| {method} | {s.get('n')} | {_fmt(s.get('mean_abs_rel_error'), '.2%')} | {_fmt(s.get('coverage_90'), '.0%')} |")
    lines += ["", "## Figures", ""]
    for png in sorted(study.figures.glob("*.png")):
        lines.append(f"![{png.stem}](figures/{png.name})")
    lines += ["", "## Rung health", "", health_table(table), "", "## Ladder", "", _markdown_table(table), ""]
    return "\n".join(lines)


def _gates_section(study: Study) -> list[str]:
    from delphi.prereg.gates import gate_table

    if not study.gates.is_file():
        return []
    report = json.loads(study.gates.read_text())
    verdict = "all passed" if report["passed"] else (
        f"FAILED ({', '.join(report['failed'])})" + ("; the study went on with force: true" if report.get("forced") else ""))
    return ["## Gates (evaluated before the hero trained)", "", f"Gates: {verdict}.", "", gate_table(report["gates"]), ""]


def _rehearsal_section(study: Study) -> list[str]:
    r = _rehearsal(study)
    if r is None:
        return []
    return ["## Dress rehearsal", "",
            f"At {r['compute']:.3g} FLOPs ({r.get('multiple', float('nan')):g}x the top budget): predicted {r['predicted']:.4f}"
            f" (90% {_fmt(r.get('loss_interval_90'))}), actual {r['actual']:.4f}, error {r['rel_error']:+.2%}.", ""]


def _probes_section(study: Study) -> list[str]:
    """The probes beyond the ladder against the primary law, and how the seal used them."""
    runs = probe_runs(study)
    if not runs:
        return []
    from delphi.fits import load_fit
    from delphi.prereg.create import correction_text, score_probes
    from delphi.prereg.format import read

    lines = ["## Probes beyond the ladder", "", f"The {study.spec.primary_fit} law at each probe's own N and D "
             "(error = actual / predicted - 1):", "", "| probe | FLOPs | predicted | actual | error |", "|---|---|---|---|---|"]
    for name, r in score_probes(load_fit(study.fit_path(study.spec.primary_fit)), runs).items():
        lines.append(f"| {name} | {r['compute']:.3g} | {r['predicted']:.4f} | {r['actual']:.4f} | {r['rel_error']:+.2%} |")
    check = (study.done("check") or {}).get("result", {})
    final = read(study.prereg)["prediction"]["final"] if study.prereg.is_file() else {}
    if final:
        lines += ["", correction_text(final, check.get("actual_final_loss"), primary_law=f"the {study.spec.primary_fit} law")["correction_sentence"]]
    return lines + [""]


def _conventions_section(study: Study) -> list[str]:
    if not study.conventions.is_file():
        return []
    data = json.loads(study.conventions.read_text())
    lines = ["## How N is counted", "",
             f"Chosen: **{data['chosen']}** ({data['why']}).", "",
             f"| convention | isoFLOP exponent a [90%] | {data.get('primary_fit', 'primary')} exponent a | backtest mean abs error | note |",
             "|---|---|---|---|---|"]
    for name, row in data["conventions"].items():
        lines.append(f"| {name} | {_fmt(row.get('isoflop_a'), '.3f')} {_fmt(row.get('isoflop_a_interval_90'), '.3f')} "
                     f"| {_fmt(row.get('law_a'), '.3f')} | {_fmt(row.get('backtest_mean_abs_rel_error'), '.2%')} | {row.get('error', '')} |")
    return lines + [""]


def health_table(table: pd.DataFrame) -> str:
    """One row per rung: what its health bounds check, and whether it met them (the columns of
    delphi.ladder.collect's rung health view that the table has), after a line naming any bound the
    ladder spec set looser than the defaults."""
    from delphi.ladder.collect import HEALTH_TABLE_COLUMNS, relaxed_in_table

    if "health_ok" not in table:
        return "(the results table has no health columns)"
    cols = [c for c in HEALTH_TABLE_COLUMNS if c in table and c != "health_relaxed"]
    relaxed = relaxed_in_table(table)
    rows = [f"The ladder spec's health bounds are looser than the defaults (issue 10): {', '.join(relaxed)}.", ""] if relaxed else []
    rows += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.sort_values(["budget", "run_id"] if "run_id" in table else ["budget"])[cols].iterrows():
        rows.append("| " + " | ".join(str(r[c]) if c in ("run_id", "cell_id") else _fmt(r[c], ".3g") for c in cols) + " |")
    return "\n".join(rows)


def _markdown_table(table: pd.DataFrame) -> str:
    cols = [c for c in ("run_id", "budget", "d_model", "n_layers", "params", "tokens", "steps", "lr", "loss", "status") if c in table]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table[cols].iterrows():
        rows.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(rows)
