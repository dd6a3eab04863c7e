"""Stage seals (issue 29): under the law alone (`hero.probe_correction: false`) a study seals every
prediction beyond the ladder -- its own probes and the hero -- before any of them has a step, each
judged by the ladder's gates; the probes and hero stages then train against those seals, never
rewriting them, and a study dir from before the stage resumes without sealing anything twice."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from delphi import prereg_format as fmt
from delphi.errors import CheckFailed, DelphiError
from delphi.study.spec import load_study
from delphi.study.stages import STAGE_NAMES, run_study, stage_seals
from delphi.study.state import Study
from delphi.train.rundir import METRICS_FILE
from tests.test_study import _micro_study

PROBE_MULTIPLES = (1.25, 1.6)  # below the micro study's hero at 2x its top budget
PROBES = ("probe1.25x", "probe1.6x")


def _law_alone_study(tmp_path: Path) -> Path:
    """The micro study of tests/test_study.py with two probes of its own and the law alone. Its
    one-seed ladder fails gates, so `force: true` carries it to the seals (recorded in each)."""
    study = _micro_study(tmp_path)
    raw = yaml.safe_load(study.read_text())
    raw["hero"] |= {"rehearsal_multiple": None, "probe_multiples": list(PROBE_MULTIPLES), "probe_correction": False}
    raw["force"] = True
    study.write_text(yaml.safe_dump(raw))
    return study


def _seal_files(out: Path) -> dict[str, bytes]:
    files = [out / "probes" / f"{name}.prereg.yaml" for name in PROBES] + [out / "preregistration.yaml"]
    return {str(f.relative_to(out)): f.read_bytes() for f in files}


def test_the_law_alone_seals_every_prediction_before_any_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("DELPHI_PEAK_FLOPS_F32", "1e11")  # skip the per-run matmul peak measurement
    assert STAGE_NAMES.index("dress_rehearsal") < STAGE_NAMES.index("seals") < STAGE_NAMES.index("probes")
    study_file, out = _law_alone_study(tmp_path), tmp_path / "out"
    assert run_study(study_file, out, stop_after="dress_rehearsal")["stopped_after"] == "dress_rehearsal"
    gates = json.loads((out / "gates.json").read_text())
    assert "deferred" not in gates  # nothing waits for the probes: the seals come before them

    # Without force, a gate that refuses a probe's seal stops the study before anything trains and
    # seals nothing: the probes are predictions judged by the ladder's gates, not forced evidence.
    spec, ladder, prereg, calibrations, probes = load_study(study_file)
    refused_dir = tmp_path / "refused"
    shutil.copytree(out, refused_dir)
    refused = Study(refused_dir, replace(spec, force=False), ladder, prereg, calibrations, probes)
    (refused_dir / "probes" / PROBES[0]).mkdir(parents=True)
    (refused_dir / "probes" / PROBES[0] / METRICS_FILE).write_text("{}\n")  # a probe that started unsealed
    with pytest.raises(
        DelphiError, match=rf"{refused_dir / 'probes' / PROBES[0]}: the probe started before its preregistration"
    ):
        stage_seals(refused)
    shutil.rmtree(refused_dir / "probes" / PROBES[0])
    with pytest.raises(
        CheckFailed,
        match=rf"gates failed before any run beyond the ladder trained: .*rung_health.* at the "
        rf"seal of {PROBES[0]}; {PROBES[0]} was NOT sealed",
    ):
        stage_seals(refused)
    assert not list(refused_dir.rglob("*.prereg.yaml")) and not (refused_dir / "preregistration.yaml").exists()
    assert json.loads((refused_dir / "probes" / f"{PROBES[0]}.prereg.gates.json").read_text())["passed"] is False

    # --stop-after seals: every seal written, no run beyond the ladder has a step.
    assert run_study(study_file, out, stop_after="seals")["stopped_after"] == "seals"
    sealed = _seal_files(out)
    for name in PROBES:
        assert (out / "probes" / f"{name}.yaml").is_file() and not (out / "probes" / name).exists()
    assert not (out / "hero").exists()
    assert [p for p in out.rglob(METRICS_FILE) if p.relative_to(out).parts[0] != "ladder"] == []
    for rel in sealed:
        doc = fmt.read(out / rel)
        assert fmt.seal_status(doc)["ok"]
        final = doc["prediction"]["final"]
        assert not final.get("probe_correction")  # the ladder's law alone
        assert doc["forced"] is True  # the study's own force (its one-seed ladder fails gates), recorded
        assert "SEALED WITH --force" in " ".join(doc["assumptions"])
        assert not doc["provenance"].get("probe_summaries_sha256")  # no run beyond the ladder is evidence
    marker = json.loads((out / "stages" / "seals.json").read_text())["result"]
    assert [p["name"] for p in marker["probes"]] == list(PROBES) and marker["hero"]["prereg"] == str(
        out / "preregistration.yaml"
    )
    assert [p["flops"] for p in marker["probes"]] == pytest.approx([m * 8e9 for m in PROBE_MULTIPLES], rel=0.05)
    assert marker["hero"]["final"]["loss"] == fmt.read(out / "preregistration.yaml")["prediction"]["final"]["loss"]

    # Resumed: the probes train against their seals and the hero's seal is found, none rewritten.
    assert run_study(study_file, out, stop_after="prereg")["stopped_after"] == "prereg"
    assert _seal_files(out) == sealed
    trained = json.loads((out / "stages" / "probes.json").read_text())["result"]["probes"]
    assert [p["name"] for p in trained] == list(PROBES)
    for name in PROBES:
        assert json.loads((out / "probes" / name / "status.json").read_text())["status"] == "completed"
    assert json.loads((out / "stages" / "prereg.json").read_text())["result"]["note"] == "sealed earlier"

    # A study dir from before the seals stage (every other marker, none for seals) resumes without
    # sealing or training anything again.
    (out / "stages" / "seals.json").unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and "stages" not in p.parts}
    assert run_study(study_file, out, stop_after="prereg")["stopped_after"] == "prereg"
    assert _seal_files(out) == sealed
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    assert all(
        p["note"] == "sealed earlier"
        for p in json.loads((out / "stages" / "seals.json").read_text())["result"]["probes"]
    )


def test_a_trajectory_from_probes_needs_probes_trained_before_the_law_alone_seals(tmp_path):
    """Under the law alone the hero is sealed before the study's own probes train, so a trajectory
    shaped like a probe needs gates.probes (runs finished before the study)."""
    raw = {
        "name": "x",
        "ladder": str(Path(__file__).resolve().parents[1] / "studies" / "ladder_tiny.yaml"),
        "hero": {"compute_multiple": 10, "probe_multiples": [3], "trajectory": "probes"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(
        DelphiError, match=r"hero.trajectory: probes with hero.probe_correction: false needs gates.probes"
    ):
        load_study(tmp_path / "s.yaml")
    raw["hero"]["probe_correction"] = True
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    load_study(tmp_path / "s.yaml")
