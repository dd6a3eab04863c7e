"""A study file: the study, hero and gates specs, and how a study file is read (`load_study`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from delphi.config_schema import from_dict
from delphi.editions import resolve_data
from delphi.errors import DelphiError
from delphi.fits import FIT_METHODS
from delphi.fits.allocation import PARAM_CONVENTIONS
from delphi.fits.intervals import PointCorrection
from delphi.fits.probes import NOISE_SCOPES, PROBE_CARRIES
from delphi.io import read_yaml
from delphi.prereg.gates import GATE_NAMES, GateThresholds
from delphi.train.config import SEED_LIMIT
from delphi.train.rundir import CONFIG_FILE, SUMMARY_FILE

DEFAULT_STUDY = "default_study.yaml"  # package data in delphi/defaults/
# How N is counted (PARAM_CONVENTIONS): the study fits under each and keeps the one its backtest
# favours, since the conventions' isoFLOP exponents differ on one ladder.
# A dress rehearsal at ~3x the top budget sits between the ladder and a >= 10x hero.
DEFAULT_REHEARSAL_MULTIPLE = 3.0
# Study seed k trains the ladder's run seeds + k * STUDY_SEED_STRIDE: disjoint from seed 0's as long as
# a spec lists fewer seeds than the stride.
STUDY_SEED_STRIDE = 1000
TRAJECTORY_SOURCES = ("curve_law", "probes")
# Gates on the hero's prediction, which the study's own probes (hero.probe_multiples) correct: while
# those are untrained the gates stage shows them and the seal decides them.
PREDICTION_GATES = ("lobo_spread", "interval_width", "method_agreement", "probes")
# The laws that can size a hero (they predict N*(C); delphi.fits.calibration.PRIMARY_CAPABLE, not
# imported: reading a study file must not import scipy), and `primary_fit: auto`, which the fit stage
# resolves once among them by the public-sweep evidence (delphi.fits.method_choice.choose_primary).
PRIMARY_LAWS = ("isoflop", "parametric", "vpnls")
AUTO_PRIMARY = "auto"


@dataclass(frozen=True)
class HeroSpec:
    compute: float | None = None  # FLOPs; None: compute_multiple x the largest ladder budget
    compute_multiple: float = 10.0
    tolerance: float = 0.01  # relative error of the final loss that counts as a pass
    eval_every: int | None = None  # None: the ladder's evals_per_run, spaced as on its rungs
    # The dress rehearsal's compute as a multiple of the top ladder budget; None: no rehearsal.
    rehearsal_multiple: float | None = DEFAULT_REHEARSAL_MULTIPLE
    # Seal the primary law x (1 + its error trend at gates.probes carried to the hero), not the law
    # alone (delphi.fits.probes.correct_by_probes); needs >= 3 probes for gate probes to pass.
    probe_correction: bool = False
    # How the correction carries the law's error beyond the probes (delphi.fits.probes.PROBE_CARRIES):
    # "linear" (least squares through every probe) or "local_slope" (the two furthest).
    probe_carry: str = "linear"
    # Whose seed spread is one run's noise at the hero and the probes (delphi.fits.probes.NOISE_SCOPES):
    # "pooled" over every budget, or "top_budget" (the measured scale nearest the runs beyond the ladder).
    noise_scope: str = "pooled"
    # The hero's train config checkpoint_every_s: a checkpoint_every checkpoint is skipped while the
    # last save is less than this many seconds ago (a throttle, not a clock; 0: every checkpoint_every).
    checkpoint_every_s: float = 0.0
    # Where the sealed trajectory's shape comes from: "curve_law" (the LR-annealing law fitted on the
    # ladder's curves) or "probes" (the longest probe, normalised to its final loss).
    trajectory: str = "curve_law"
    # Probes of the study's own, as multiples of the top ladder budget (e.g. [3, 10, 30]), each sized
    # like the hero. Under the law alone (probe_correction: false) they are predictions like the
    # hero's: stage seals seals them all and the hero, under the same gates, before any trains.
    # With probe_correction each is sealed (with --force: the gates judge the hero) and trained in
    # turn, then counts as evidence like gates.probes.
    probe_multiples: tuple[float, ...] = ()
    # Seeds of every run beyond the ladder (probes and hero), each run's config with seed and
    # data.seed set to it: with two or more, each run trains them side by side (one process each)
    # and its seal predicts their mean final loss. Empty: one run, at the study seed.
    seeds: tuple[int, ...] = ()
    # A measured bias of the primary law on this design, sealed as a correction (delphi.fits.intervals);
    # None: the law's own point. Not with probe_correction (the probes measure the same error).
    point_correction: PointCorrection | None = None


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
    # A `delphi ladder recipe-check` report (relative to the study file): gate recipe.
    recipe_check: str | None = None
    interval_width_factor: float = 1.5  # 90% half-width <= 1.5 x tolerance
    min_seeds: int = 2  # >= 2 seeds per rung
    # Gates forced one by one, {gate: reason}: a seal passes over these alone failing, and seals each
    # reason (every other gate must still pass; `force: true` forces all, with no reason).
    force: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StudySpec:
    name: str = "study"
    ladder: str = "ladder_default.yaml"  # ladder spec, relative to the study file
    fits: tuple[str, ...] = ("isoflop", "parametric", "vpnls", "frontier")
    # The law that sizes the hero and makes the prediction; "auto": chosen by the fit stage (Study.primary_fit).
    primary_fit: str = "vpnls"
    bootstrap: int = 200
    seed: int = 0  # bootstrap, hero and rehearsal seed; offsets the ladder's run seeds (seed_offset)
    workers: int | None = None  # ladder processes; None: one per core
    hero: HeroSpec = field(default_factory=HeroSpec)
    author: str | None = None
    rationale: str = ""
    # Where the sealed preregistration goes, relative to the study file (None: inside --out).
    # The project's own study writes into preregistrations/ so that git history dates it.
    preregistration: str | None = None
    # Where each of hero.probe_multiples' seals goes, in the preregistration's directory: a file name
    # with "{multiple}" (e.g. "paper-v8-probe-{multiple}x.yaml"); None: STUDY/probes/NAME.prereg.yaml.
    probe_preregistration: str | None = None
    gates: GatesSpec = field(default_factory=GatesSpec)
    force: bool = False  # seal and train the hero even if a gate fails (recorded in the preregistration)
    conventions: tuple[str, ...] = PARAM_CONVENTIONS  # parameter counts compared by the fit stage
    params_convention: str | None = None  # None: the convention whose backtest is best

    def thresholds(self):
        g = self.gates
        return GateThresholds(
            tolerance_rel=self.hero.tolerance,
            backtest_tolerance_rel=g.backtest_tolerance,
            lobo_tolerance_rel=g.lobo_tolerance,
            rehearsal_tolerance_rel=g.rehearsal_tolerance,
            agreement_tolerance_rel=g.agreement_tolerance,
            interval_width_factor=g.interval_width_factor,
            min_seeds=g.min_seeds,
        )

    def validate(self, where: str) -> "StudySpec":
        for method in self.fits:
            if method not in FIT_METHODS:
                raise DelphiError(
                    f"{where}: fits: unknown method {method!r} (expected one of {', '.join(FIT_METHODS)})"
                )
        if self.primary_fit == AUTO_PRIMARY:
            if not set(PRIMARY_LAWS) & set(self.fits):
                raise DelphiError(
                    f"{where}: primary_fit: auto chooses among {', '.join(PRIMARY_LAWS)}, and fits "
                    f"{list(self.fits)} has none of them"
                )
        else:
            if self.primary_fit not in self.fits:
                raise DelphiError(f"{where}: primary_fit: {self.primary_fit!r} is not among fits {list(self.fits)}")
            if self.primary_fit not in PRIMARY_LAWS:
                raise DelphiError(
                    f"{where}: primary_fit: {self.primary_fit!r} must predict N*(C): isoflop, parametric or vpnls, "
                    f"or be auto"
                )
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
                raise DelphiError(
                    f"{where}: hero.rehearsal_multiple: must be > 1 (or null: no rehearsal), got {hero.rehearsal_multiple}"
                )
            if hero.compute is None and hero.rehearsal_multiple >= hero.compute_multiple:
                raise DelphiError(
                    f"{where}: hero.rehearsal_multiple: {hero.rehearsal_multiple} must be below "
                    f"hero.compute_multiple {hero.compute_multiple} (a rehearsal precedes the hero)"
                )
        if any(not m > 1 for m in hero.probe_multiples) or len(set(hero.probe_multiples)) != len(hero.probe_multiples):
            raise DelphiError(
                f"{where}: hero.probe_multiples: {list(hero.probe_multiples)}, expected distinct multiples > 1"
            )
        if hero.compute is None and any(m >= hero.compute_multiple for m in hero.probe_multiples):
            raise DelphiError(
                f"{where}: hero.probe_multiples: {list(hero.probe_multiples)} must lie below "
                f"hero.compute_multiple {hero.compute_multiple} (probes precede the hero)"
            )
        has_probes = bool(self.gates.probes or hero.probe_multiples)
        if hero.probe_correction and not has_probes:
            raise DelphiError(
                f"{where}: hero.probe_correction: true needs probes (gates.probes or hero.probe_multiples)"
            )
        if hero.probe_carry not in PROBE_CARRIES:
            raise DelphiError(f"{where}: hero.probe_carry: {hero.probe_carry!r}, expected one of {list(PROBE_CARRIES)}")
        if hero.noise_scope not in NOISE_SCOPES:
            raise DelphiError(f"{where}: hero.noise_scope: {hero.noise_scope!r}, expected one of {list(NOISE_SCOPES)}")
        if hero.trajectory not in TRAJECTORY_SOURCES:
            raise DelphiError(
                f"{where}: hero.trajectory: {hero.trajectory!r}, expected one of {list(TRAJECTORY_SOURCES)}"
            )
        if hero.trajectory == "probes" and not has_probes:
            raise DelphiError(f"{where}: hero.trajectory: probes needs probes (gates.probes or hero.probe_multiples)")
        if hero.trajectory == "probes" and not hero.probe_correction and not self.gates.probes:
            raise DelphiError(
                f"{where}: hero.trajectory: probes with hero.probe_correction: false needs gates.probes: "
                "under the law alone the hero is sealed before the study's own probes train (stage seals)"
            )
        if len(set(hero.seeds)) != len(hero.seeds) or any(
            not isinstance(x, int) or not 0 <= x < SEED_LIMIT for x in hero.seeds
        ):
            raise DelphiError(
                f"{where}: hero.seeds: {list(hero.seeds)}, expected distinct integers in [0, 2**63) (a JAX key's range)"
            )
        if (c := hero.point_correction) is not None:
            if not -0.5 < c.rel < 0.5:
                raise DelphiError(
                    f"{where}: hero.point_correction.rel: {c.rel}, expected a relative error in (-0.5, 0.5)"
                )
            if not c.sd_rel >= 0:
                raise DelphiError(f"{where}: hero.point_correction.sd_rel: must be >= 0, got {c.sd_rel}")
            if hero.probe_correction:
                raise DelphiError(
                    f"{where}: hero.point_correction with hero.probe_correction: true; the probes measure the "
                    "law's error on this ladder, so choose one"
                )
            if not c.source.strip():
                raise DelphiError(
                    f"{where}: hero.point_correction.source: needs where the bias was measured (a sentence)"
                )

        for gate, reason in self.gates.force.items():
            if gate not in GATE_NAMES:
                raise DelphiError(
                    f"{where}: gates.force.{gate}: no such gate (expected one of: {', '.join(GATE_NAMES)})"
                )
            if not isinstance(reason, str) or not reason.strip():
                raise DelphiError(f"{where}: gates.force.{gate}: needs the reason to seal (a sentence), got {reason!r}")
        if self.probe_preregistration is not None and (
            "{multiple}" not in self.probe_preregistration
            or "/" in self.probe_preregistration
            or not self.preregistration
        ):
            raise DelphiError(
                f"{where}: probe_preregistration: {self.probe_preregistration!r}, expected a file name with "
                "'{multiple}', written beside `preregistration` (which must be set)"
            )
        if not hero.checkpoint_every_s >= 0:
            raise DelphiError(f"{where}: hero.checkpoint_every_s: must be >= 0 seconds, got {hero.checkpoint_every_s}")
        if not self.conventions or any(c not in PARAM_CONVENTIONS for c in self.conventions):
            raise DelphiError(
                f"{where}: conventions: {list(self.conventions)}, expected a non-empty subset of {list(PARAM_CONVENTIONS)}"
            )
        if self.params_convention is not None and self.params_convention not in PARAM_CONVENTIONS:
            raise DelphiError(
                f"{where}: params_convention: {self.params_convention!r}, expected one of {list(PARAM_CONVENTIONS)}"
            )
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
            raise DelphiError(
                f"{path}: gates.lr_calibration: {c} not found (write it with `delphi ladder lr-calibrate`)"
            )
    # Absolute, not resolved: a link keeps its own name (paper/editions/v5/hero30x -> study/hero).
    # A probe inside a compact edition (paper/editions/v4/probe3x) is read from its unpacked copy.
    probes = tuple(resolve_data(Path(os.path.normpath((path.parent / p).absolute()))) for p in spec.gates.probes)
    for p in probes:
        if not (p / SUMMARY_FILE).is_file() or not (p / CONFIG_FILE).is_file():
            raise DelphiError(
                f"{path}: gates.probes: {p} is not a finished run dir (needs {CONFIG_FILE} and {SUMMARY_FILE})"
            )
    names = probe_names(spec)
    if len(set(names)) != len(names):
        raise DelphiError(
            f"{path}: gates.probes, hero.probe_multiples: two probes share a name ({', '.join(names)}); "
            "each names its run in the gates"
        )
    return spec, ladder, prereg, calibrations, probes


def own_probe_name(multiple: float) -> str:
    return f"probe{multiple:g}x"


def probe_names(spec: StudySpec) -> list[str]:
    """Each probe's name (its directory under the study's probes/, and in the gates): gates.probes
    by their directory's name, then the study's own (hero.probe_multiples), nearest first."""
    return [Path(p).name for p in spec.gates.probes] + [own_probe_name(m) for m in sorted(spec.hero.probe_multiples)]
