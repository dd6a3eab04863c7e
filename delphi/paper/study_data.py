"""A finished study's data as the paper reads it: its stage results, sealed preregistration, pinned
spec, primary law and probes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from delphi.config_schema import from_dict
from delphi.errors import DelphiError
from delphi.study.spec import StudySpec, probe_names
from delphi.study.state import Study
from delphi.train.rundir import METRICS_FILE, read_metrics


def stage_result(data_dir: Path, name: str) -> dict:
    """The result a study's stage recorded (STUDY/stages/NAME.json)."""
    path = data_dir / "stages" / f"{name}.json"
    if not path.is_file():
        raise DelphiError(f"{path}: stage {name!r} not found; the paper needs a finished study")
    return json.loads(path.read_text())["result"]


UNCHECKED = "not yet checked (the hero has not finished)"


def check_stage(data_dir: Path) -> dict:
    """The hero's check. A study of the law alone has sealed every prediction beyond the ladder at
    stage seals, before any trains: its paper can be built from then on, each run shown as sealed,
    trained or checked (`law_alone_section`), the hero's verdict UNCHECKED until it has one."""
    if not (data_dir / "stages" / "check.json").is_file() and (data_dir / "stages" / "seals.json").is_file():
        return {}
    return stage_result(data_dir, "check")


def prereg_file(data_dir: Path) -> Path:
    """The study's sealed preregistration: `preregistration.yaml` in the data (a study that sealed
    inside its directory, or `--from-study`'s copy), else the file its prereg stage names, looked up
    by name in a `preregistrations/` folder above the data (the project's own studies seal there;
    the stage records the absolute path of the machine that sealed it)."""
    local = data_dir / "preregistration.yaml"
    if local.is_file():
        return local
    named = Path(stage_result(data_dir, "prereg")["prereg"])
    for parent in data_dir.resolve().parents:
        if (candidate := parent / "preregistrations" / named.name).is_file():
            return candidate
    if named.is_file():
        return named
    raise DelphiError(
        f"{data_dir}: preregistration {named.name} not found in the data or in a preregistrations/ folder above it"
    )


def study_view(data_dir: Path, figures_dir: Path) -> Study:
    """A `Study` whose paths point into the paper's data (and figures) directory."""
    pinned = json.loads((data_dir / "study.json").read_text())
    spec = from_dict(StudySpec, pinned["study"], f"{data_dir}/study.json")
    study = Study(data_dir, spec, data_dir / "ladder" / "ladder.yaml", prereg=prereg_file(data_dir))
    study.figures = figures_dir
    return study


def pinned_spec(data_dir: Path) -> StudySpec:
    """The study's spec as its data pinned it (a `delphi.study.StudySpec`)."""
    return from_dict(StudySpec, json.loads((data_dir / "study.json").read_text())["study"], f"{data_dir}/study.json")


def primary_fit_name(data_dir: Path) -> str:
    """The study's primary law: as pinned, or as its fit stage resolved `primary_fit: auto`
    (`delphi.study.state.Study.primary_fit`)."""
    pinned = json.loads((data_dir / "study.json").read_text())["study"]
    return stage_result(data_dir, "fit")["primary_fit"] if pinned["primary_fit"] == "auto" else pinned["primary_fit"]


def probe_dirs(data_dir: Path) -> list[Path]:
    """The probes the study names (gates.probes, then its own hero.probe_multiples) that finished, as
    pinned in its data (`delphi.study.pin_probes`). A copy there that the study does not name (a
    stale copy left by an earlier invocation) is not one of its probes."""
    spec = pinned_spec(data_dir)
    return [run for name in probe_names(spec) if ((run := data_dir / "probes" / name) / "summary.json").is_file()]


def evals_per_run(table: pd.DataFrame, data_dir: Path) -> list[int]:
    """Eval points each ladder run logged: the results table's n_evals, else its metrics.jsonl."""
    if "n_evals" in table and table["n_evals"].notna().all():
        return [int(v) for v in table["n_evals"]]
    counts = []
    for metrics in sorted((data_dir / "ladder").glob(f"runs/*/{METRICS_FILE}")):
        counts.append(sum(1 for r in read_metrics(metrics.parent) if r.get("val_loss") is not None))
    return counts


def sealed_carry(final: dict) -> str | None:
    """How a corrected seal carried the probes' error (a seal that records no `carry`:
    linear); None for a seal of the law alone."""
    correction = final.get("probe_correction")
    return correction.get("carry", "linear") if correction else None


LAW_NAMES = {
    "isoflop": "the isoFLOP power law (Approach 2)",
    "vpnls": "VPNLS (the Chinchilla surface)",
    "parametric": "the parametric surface (Approach 3)",
    "frontier": "the compute frontier with E free",
}
