"""A study directory: its paths and stage markers (`Study`), its pinned spec, and what the stages
and the report read back from it (the study's ladder, its results table, earlier stages' results)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.config_schema import from_dict, to_dict
from delphi.errors import DelphiError
from delphi.fits import load_results
from delphi.io import atomic_write_bytes, atomic_write_json
from delphi.ladder.family import flops_family
from delphi.ladder.lr_calibration import merge_reports
from delphi.ladder.spec import LadderSpec, ladder_spec_from_dict, ladder_spec_to_dict, load_ladder_spec
from delphi.study.spec import AUTO_PRIMARY, STUDY_SEED_STRIDE, StudySpec, probe_names
from delphi.train.rundir import CONFIG_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE


class Study:
    """Paths of a study directory and its stage markers."""

    def __init__(
        self,
        out: str | Path,
        spec: StudySpec,
        ladder_spec_path: Path,
        prereg: Path | None = None,
        lr_calibration_sources: tuple[Path, ...] = (),
        probe_sources: tuple[Path, ...] = (),
        accept_store: str | None = None,
    ) -> None:
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

    @property
    def primary_fit(self) -> str:
        """The law that sizes the hero and makes the prediction: the spec's, or with `primary_fit: auto`
        the one the fit stage chose and recorded in stages/fit.json (a resumed study never re-chooses)."""
        if self.spec.primary_fit != AUTO_PRIMARY:
            return self.spec.primary_fit
        done = self.done("fit")
        resolved = done["result"].get("primary_fit") if done is not None else None
        if resolved is None:
            raise DelphiError(
                f"{self.marker('fit')}: primary_fit: auto is resolved by the fit stage, which has not "
                "completed; rerun the study to run it"
            )
        return resolved

    def fit_path(self, method: str) -> Path:
        return self.fits_dir / f"{method}.json"

    def marker(self, stage: str) -> Path:
        return self.out / "stages" / f"{stage}.json"

    def done(self, stage: str) -> dict | None:
        path = self.marker(stage)
        return json.loads(path.read_text()) if path.is_file() else None


def say(text: str) -> None:
    print(f"[study] {text}", file=sys.stderr, flush=True)


def pin_study(study: Study) -> None:
    """Record the resolved study and ladder spec; refuse to continue a different study in the same dir."""
    pinned = {"study": to_dict(study.spec), "ladder": ladder_spec_to_dict(ladder_spec(study))}
    path = study.out / STUDY_FILE
    if path.is_file():
        recorded = json.loads(path.read_text())
        try:  # keys added to StudySpec or LadderSpec since the directory was pinned take their defaults
            recorded["study"] = to_dict(from_dict(StudySpec, recorded.get("study"), str(path)))
            recorded["ladder"] = ladder_spec_to_dict(ladder_spec_from_dict(recorded.get("ladder")))
        except DelphiError:
            pass
        current = json.loads(json.dumps(pinned))
        unjudged = study.done("gates") is None
        if _identity(recorded, unjudged) != _identity(current, unjudged):
            raise DelphiError(
                f"--out: {study.out} holds a different study (study.json differs); choose a new directory"
            )
        if recorded == current:
            return
        if _without_check_points(recorded) == _without_check_points(current):
            say(
                "the recipe check's points changed (they plan no run of this study; gate recipe judges the new "
                f"report): {path} records them"
            )
        else:
            say(f"the study's gates or runs beyond the ladder changed before its gates ran: {path} records them")
    atomic_write_json(path, pinned)


# What a study may change until its gates stage has run (nothing was judged or sealed yet): the
# gates' settings and the runs beyond the ladder; the ladder, fits and hero sizing stay pinned.
JUDGEMENT_KEYS = ("gates", "force", "probe_preregistration")
JUDGEMENT_HERO_KEYS = ("seeds", "tolerance", "probe_multiples")


def _identity(pinned: dict, unjudged: bool) -> dict:
    pinned = _without_check_points(pinned)
    if not unjudged:
        return pinned
    study = {k: v for k, v in (pinned.get("study") or {}).items() if k not in JUDGEMENT_KEYS}
    study["hero"] = {k: v for k, v in (study.get("hero") or {}).items() if k not in JUDGEMENT_HERO_KEYS}
    return {**pinned, "study": study}


def _without_check_points(pinned: dict) -> dict:
    """A pinned study without its ladder's `recipe.check`: the recipe check's sweep design trains in its
    own directory, never in the study's, so extending it (a hero longer than its longest horizon) is
    the same study (`delphi.ladder.recipe_check` treats the check points so for --prior too)."""
    recipe = (pinned.get("ladder") or {}).get("recipe")
    if not isinstance(recipe, dict) or "check" not in recipe:
        return pinned
    return {**pinned, "ladder": {**pinned["ladder"], "recipe": {k: v for k, v in recipe.items() if k != "check"}}}


STUDY_FILE = "study.json"  # the pinned study and ladder spec: a directory holds one study


def ladder_spec(study: Study) -> LadderSpec:
    """The study's ladder: the ladder spec with its run seeds offset by the study seed (seed_offset)."""
    spec = load_ladder_spec(study.ladder_spec_path)
    offset = seed_offset(study.spec.seed)
    if offset == 0:
        return spec
    run = replace(
        spec.run,
        seeds=tuple(s + offset for s in spec.run.seeds),
        top_seeds=tuple(s + offset for s in spec.run.top_seeds),
    )
    return replace(spec, run=run)


def seed_offset(study_seed: int) -> int:
    """What the study seed adds to every ladder run seed: studies with different seeds train
    different inits and data orders (a robustness check), seed 0 the spec's own."""
    return STUDY_SEED_STRIDE * study_seed


def chosen_convention(study: Study) -> str:
    """The parameter-count convention the fits use: the study's, or the one the fit stage chose."""
    done = study.done("fit")
    if done is not None and done["result"].get("params_convention"):
        return done["result"]["params_convention"]
    return study.spec.params_convention or "nonembedding"


def load_table(study: Study, convention: str | None = None) -> pd.DataFrame:
    """The results table with N counted as `convention` and the ladder family's exact FLOPs attached."""
    convention = convention or chosen_convention(study)
    return load_results(
        study.results, params_convention=convention, family=flops_family(ladder_spec(study), convention)
    )


def hero_compute(study: Study) -> float:
    if study.spec.hero.compute is not None:
        return float(study.spec.hero.compute)
    return study.spec.hero.compute_multiple * max(ladder_spec(study).budgets)


def rehearsal_result(study: Study) -> dict | None:
    done = study.done("dress_rehearsal")
    if done is None or done["result"].get("skipped"):
        return None
    return done["result"]


def primary_backtest(study: Study) -> dict | None:
    path = study.fits_dir / "backtest.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get(study.primary_fit)


def probe_runs(study: Study) -> list[Path]:
    """The pinned copies of gates.probes (a study continued from a snapshot has them), then the
    study's own probes (hero.probe_multiples) that have finished."""
    runs = [study.probes_dir / name for name in probe_names(study.spec)]
    missing = [str(r) for r in runs[: len(study.spec.gates.probes)] if not (r / SUMMARY_FILE).is_file()]
    if missing:
        raise DelphiError(f"{', '.join(missing)}: missing; the gates stage copies them from gates.probes")
    return [r for r in runs if (r / SUMMARY_FILE).is_file()]


def lr_calibration_paths(study: Study) -> list[Path] | None:
    """The merged copy, when the study names calibrations (a study continued from a snapshot has it)."""
    if not study.spec.gates.lr_calibration:
        return None
    if not study.lr_calibration.is_file():
        raise DelphiError(f"{study.lr_calibration}: missing; the gates stage writes it from gates.lr_calibration")
    return [study.lr_calibration]


def format_value(x: Any, spec: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return f"[{format_value(x[0], spec)}, {format_value(x[1], spec)}]"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def pin_lr_calibration(study: Study) -> Path | None:
    """Merge gates.lr_calibration into one report in the study dir, where the gates and the seal read
    it: the study's data then hold the evidence. Written afresh by the gates stage (a calibration may
    be extended while the ladder trains); the seal reads the copy the gates saw."""
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
