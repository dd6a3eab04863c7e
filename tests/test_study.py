"""`delphi study`: stages run in order, record completion, and resume without redoing work;
`delphi paper build` regenerates the paper from its committed data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.data.store import prepare_store
from delphi.editions import edition_tree

REPO = Path(__file__).resolve().parents[1]


def _micro_study(tmp_path: Path) -> Path:
    """A 3-budget dense isoFLOP ladder of 9 rungs of a few seconds each, on a private store."""
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(40):
        (src / f"m{i:02d}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(300)))
    prepare_store(str(src), tmp_path / "store")
    raw = yaml.safe_load((REPO / "studies" / "ladder_tiny.yaml").read_text())
    raw.update(name="micro", budgets=[2e9, 4e9, 8e9], seq_len=32)
    raw["isoflop"].update(sizes=3, span=4.0, min_span=2.0, center_coefficient=0.05, center_exponent=0.5)
    raw["shape"]["widths"] = [8, 12, 16, 24, 32]
    raw["batch"].update(min_steps=40, min_seqs=2, max_seqs=8)
    raw["run"].update(
        store=str(tmp_path / "store"), eval_tokens=512, evals_per_run=2, logs_per_run=4, checkpoints_per_run=2
    )
    (tmp_path / "ladder.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    study = {
        "name": "micro",
        "ladder": "ladder.yaml",
        "fits": ["vpnls", "isoflop"],
        "primary_fit": "isoflop",
        "bootstrap": 0,
        "hero": {"compute_multiple": 2, "tolerance": 0.5, "rehearsal_multiple": 1.5},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp_path / "study.yaml"


def _delphi(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}  # skip the per-run matmul peak measurement
    return subprocess.run(
        [sys.executable, "-m", "delphi.cli", *args, "--json"], env=env, capture_output=True, text=True, timeout=600
    )


def _study(*args: str) -> subprocess.CompletedProcess:
    return _delphi("study", *args)


def test_study_stages_resume_without_redoing_finished_runs(tmp_path):
    study, first_dir, out = _micro_study(tmp_path), tmp_path / "first", tmp_path / "out"
    planned = _study(str(study), "--out", str(first_dir), "--stop-after", "plan")
    assert planned.returncode == 0, planned.stderr
    preflight = json.loads((first_dir / "stages" / "plan.json").read_text())["result"]["hero_preflight"]
    assert preflight["hero"]["expected"]["inside"] and preflight["rehearsal"]["expected"]["inside"]
    assert "preflight hero at 1.6e+10 FLOPs" in planned.stderr

    # A long ladder in stages: one budget, then a compact snapshot (what gets committed) carried to
    # a fresh study dir, where the study trains only the other budgets.
    stage = _delphi("ladder", "run", str(first_dir / "ladder"), "--budgets", "2e9")
    assert stage.returncode == 0, stage.stderr
    assert json.loads(stage.stdout)["rungs"] == 3
    assert _delphi("ladder", "run", str(first_dir / "ladder"), "--budgets", "3e9").returncode == 2
    snap = _delphi("paper", "snapshot", "--from-study", str(first_dir), "--to", str(tmp_path / "snap"))
    assert snap.returncode == 0, snap.stderr
    assert len(json.loads(snap.stdout)["ladder_runs"]) == 3
    # The compact form from the start: the runs' curves in one table, no directory per run.
    assert (tmp_path / "snap" / "curves.csv.gz").is_file() and not (tmp_path / "snap" / "ladder" / "runs").exists()
    unpacked = _delphi("paper", "unpack", str(tmp_path / "snap"), "--to", str(out))
    assert unpacked.returncode == 0, unpacked.stderr
    assert not list(out.rglob("checkpoints")) and not (out / "ladder" / "logs").exists()
    carried = {r.name: (r / "summary.json").stat().st_mtime_ns for r in (out / "ladder" / "runs").iterdir()}

    first = _study(str(study), "--out", str(out), "--stop-after", "ladder")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["stopped_after"] == "ladder"
    assert [p.stem for p in sorted((out / "stages").glob("*.json"))] == ["ladder", "plan", "prepare"]
    runs = sorted((out / "ladder" / "runs").iterdir())
    assert len(runs) == 9 and all(json.loads((r / "status.json").read_text())["status"] == "completed" for r in runs)
    assert {r: (out / "ladder" / "runs" / r / "summary.json").stat().st_mtime_ns for r in carried} == carried

    # As if the ladder stage had been killed after all but one rung: rerunning trains only that rung.
    (out / "stages" / "ladder.json").unlink()
    shutil.rmtree(runs[0])
    kept = {r.name: (r / "summary.json").stat().st_mtime_ns for r in runs[1:]}
    second = _study(str(study), "--out", str(out), "--stop-after", "fit")
    assert second.returncode == 0, second.stderr
    assert "prepare: done earlier, skipped" in second.stderr
    assert (runs[0] / "summary.json").is_file()
    assert {r.name: (r / "summary.json").stat().st_mtime_ns for r in runs[1:]} == kept
    fit = json.loads((out / "fits" / "vpnls.json").read_text())
    assert fit["kind"] == "parametric" and fit["allocation"] == "exact"  # the ladder family's exact FLOPs
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 9
    conventions = json.loads((out / "fits" / "conventions.json").read_text())
    assert set(conventions["conventions"]) == {"nonembedding", "active", "fpt6"}
    assert conventions["chosen"] in conventions["conventions"] and "backtest" in conventions["why"]
    assert fit["diagnostics"]["params_convention"] == conventions["chosen"]

    # One seed per rung and three budgets: the gates fail, and the study stops before the hero, saying so.
    third = _study(str(study), "--out", str(out))
    assert third.returncode == 1, third.stderr
    assert "gates failed before the hero trained" in third.stderr and "gate FAIL seeds" in third.stderr
    refusal = json.loads(third.stdout)  # --json: the refusal is the study's result (issue 53, cause 16)
    assert refusal["ok"] is False and refusal["stopped_at"] == "gates" and "seeds" in refusal["failed_gates"]
    # the cheap gates come first: no compute is spent on a dress rehearsal of a refused ladder
    assert "dress rehearsal at" not in third.stderr and not (out / "rehearsal").exists()
    gates = json.loads((out / "gates.json").read_text())
    assert (
        gates["passed"] is False
        and "seeds" in gates["failed"]
        and "dress_rehearsal" not in [g["name"] for g in gates["gates"]]
    )
    assert not (out / "hero").exists() and not (out / "preregistration.yaml").exists()
    assert not (out / "stages" / "gates.json").exists()  # a rerun evaluates the gates again

    # The directory belongs to this study: a different study file is refused before anything runs.
    other = yaml.safe_load(study.read_text()) | {"bootstrap": 11}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    refused = _study(str(tmp_path / "other.yaml"), "--out", str(out))
    assert refused.returncode == 2 and "holds a different study" in refused.stderr


def test_study_bad_input(tmp_path, capsys):
    assert cli_main(["study", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "x", "ladder": "nope.yaml"}))
    assert cli_main(["study", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "x", "fits": ["vpnls"], "primary_fit": "frontier"}))
    assert cli_main(["study", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert cli_main(["study", "--out", str(tmp_path / "o"), "--stop-after", "lunch"]) == 2
    assert "unknown stage" in capsys.readouterr().err
    # a rehearsal at or past the hero, an unknown parameter convention, a gate threshold out of range
    for bad in (
        {"hero": {"compute_multiple": 3, "rehearsal_multiple": 3}},
        {"params_convention": "embedding"},
        {"gates": {"min_seeds": 0}},
        {"gates": {"lobo_tolerance": 2.0}},
        {"seed": -1},
    ):
        (tmp_path / "s.yaml").write_text(
            yaml.safe_dump({"name": "x", "ladder": str(REPO / "studies" / "ladder_tiny.yaml")} | bad)
        )
        assert cli_main(["study", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2, bad
    assert not (tmp_path / "o").exists()


def test_study_preflight_refuses_a_hero_no_ladder_range_covers(tmp_path):
    """A hero far past the ladder (1000x) would leave its steps range even at the expected optimum:
    the study stops at the plan, before any rung trains, and says why."""
    study = _micro_study(tmp_path)
    raw = yaml.safe_load(study.read_text())
    raw["hero"] = {"compute_multiple": 1000, "tolerance": 0.5}
    study.write_text(yaml.safe_dump(raw))
    refused = _study(str(study), "--out", str(tmp_path / "out"))
    assert (
        refused.returncode == 1
        and "preflight: the hero at 8e+12 FLOPs would leave the ladder's ranges or depths (steps" in refused.stderr
    )
    assert (
        not (tmp_path / "out" / "ladder" / "runs").exists() and not (tmp_path / "out" / "stages" / "plan.json").exists()
    )


def test_study_refuses_to_train_on_another_corpus_than_its_first_rungs(tmp_path):
    """A study continued elsewhere whose store has other contents (another machine's packages) stops
    before training, naming both hashes."""
    import pytest

    from delphi.errors import DelphiError
    from delphi.study.spec import load_study
    from delphi.study.stages import run_study
    from delphi.study.state import Study
    from delphi.study.store import check_store_unchanged

    study_file = _micro_study(tmp_path)
    run_study(study_file, tmp_path / "out", stop_after="prepare")
    spec, ladder, prereg, _, _ = load_study(study_file)
    study = Study(tmp_path / "out", spec, ladder, prereg)
    check_store_unchanged(study)  # the same store: nothing to say
    marker = json.loads(study.marker("prepare").read_text())
    marker["result"]["sha256"] = "0" * 64
    marker["result"]["bytes_by_package"]["m00.py"] -= 73  # as if one file had changed on another machine
    study.marker("prepare").write_text(json.dumps(marker))
    with pytest.raises(
        DelphiError,
        match="trained on store sha256 0{64}, but .* now holds sha256 [0-9a-f]{64} "
        r"\(another machine or other installed packages; packages that differ from sha256 0{12}: m00.py \+73 bytes\)",
    ):
        check_store_unchanged(study)
    # --accept-store goes on with exactly the store it names, and records both.
    now = json.loads((tmp_path / "store" / "meta.json").read_text())["sha256"]
    with pytest.raises(DelphiError, match=f"--accept-store {now}"):
        check_store_unchanged(Study(tmp_path / "out", spec, ladder, prereg, accept_store="1" * 64))
    assert not (tmp_path / "out" / "store_accepted.json").exists()
    check_store_unchanged(Study(tmp_path / "out", spec, ladder, prereg, accept_store=now))
    record = json.loads((tmp_path / "out" / "store_accepted.json").read_text())
    assert record["pinned_sha256"] == "0" * 64 and [a["sha256"] for a in record["accepted"]] == [now]
    assert record["accepted"][0]["hero_step"] is None and record["accepted"][0]["bytes_by_package"]
    check_store_unchanged(Study(tmp_path / "out", spec, ladder, prereg, accept_store=now))  # the same store again
    assert json.loads((tmp_path / "out" / "store_accepted.json").read_text()) == record
    # A third machine is told what differs from the store the study last went on with, and its
    # store, once accepted, is appended: the file keeps every store the study trained on.
    sizes = record["accepted"][0]["bytes_by_package"]
    record["accepted"][0].update(sha256="2" * 64, bytes_by_package={**sizes, "m01.py": sizes["m01.py"] + 9})
    (tmp_path / "out" / "store_accepted.json").write_text(json.dumps(record))
    with pytest.raises(DelphiError, match=r"packages that differ from sha256 2{12}: m01.py -9 bytes"):
        check_store_unchanged(study)
    check_store_unchanged(Study(tmp_path / "out", spec, ladder, prereg, accept_store=now))
    accepted = json.loads((tmp_path / "out" / "store_accepted.json").read_text())["accepted"]
    assert [a["sha256"] for a in accepted] == ["2" * 64, now]
    # The one-store file of earlier versions reads as a history of one.
    from delphi.study.store import read_store_acceptances

    (tmp_path / "old.json").write_text(json.dumps({"pinned_sha256": "0" * 64, "accepted_sha256": "3" * 64}))
    assert read_store_acceptances(tmp_path / "old.json") == {"accepted": [{"sha256": "3" * 64, "train_tokens": None}]}


def test_accept_store_that_is_not_a_sha256_exits_2_before_anything_is_written(tmp_path, capsys):
    assert cli_main(["study", "--out", str(tmp_path / "out"), "--accept-store", "xyz"]) == 2
    assert "--accept-store: 'xyz' is not a store's sha256" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_study_seed_offsets_the_ladder_seeds(tmp_path):
    """Study seed k trains run seeds + k * STUDY_SEED_STRIDE: three study seeds, three ladders."""
    from delphi.study.spec import STUDY_SEED_STRIDE, load_study
    from delphi.study.state import Study, ladder_spec

    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"name": "x", "ladder": str(REPO / "studies" / "ladder_tiny.yaml"), "seed": 2})
    )
    spec, ladder_path, prereg, _, _ = load_study(tmp_path / "s.yaml")
    seeds = ladder_spec(Study(tmp_path / "o", spec, ladder_path, prereg)).run.seeds
    base = yaml.safe_load((REPO / "studies" / "ladder_tiny.yaml").read_text())["run"].get("seeds", [0])
    assert list(seeds) == [s + 2 * STUDY_SEED_STRIDE for s in base]


def test_study_lr_calibration_is_resolved_checked_and_pinned(tmp_path):
    """gates.lr_calibration: reports relative to the study file; a missing one is exit-2 material naming
    the key; the gates stage merges them into the study dir, where the gates and the seal read them."""
    import pytest

    from delphi.errors import DelphiError
    from delphi.study.spec import load_study
    from delphi.study.state import Study, lr_calibration_paths, pin_lr_calibration

    raw = {
        "name": "x",
        "ladder": str(REPO / "studies" / "ladder_tiny.yaml"),
        "gates": {"lr_calibration": ["cal/a.json", "cal/b.json"]},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "a.json").write_text('{"points": [{"d_model": 32}]}')
    with pytest.raises(DelphiError, match=r"gates.lr_calibration: .*cal/b.json not found"):
        load_study(tmp_path / "s.yaml")
    (tmp_path / "cal" / "b.json").write_text('{"points": [{"d_model": 160}]}')
    spec, ladder, prereg, calibrations, _ = load_study(tmp_path / "s.yaml")
    assert calibrations == ((tmp_path / "cal" / "a.json").resolve(), (tmp_path / "cal" / "b.json").resolve())
    study = Study(tmp_path / "out", spec, ladder, prereg, calibrations)
    with pytest.raises(DelphiError, match="the gates stage writes it"):
        lr_calibration_paths(study)
    assert [pin_lr_calibration(study)] == lr_calibration_paths(study) == [study.lr_calibration]
    assert [p["d_model"] for p in json.loads(study.lr_calibration.read_text())["points"]] == [32, 160]
    (tmp_path / "cal" / "b.json").write_text('{"points": [{"d_model": 160}, {"d_model": 192}]}')  # extended
    pin_lr_calibration(study)
    assert [p["d_model"] for p in json.loads(study.lr_calibration.read_text())["points"]] == [32, 160, 192]
    assert pin_lr_calibration(Study(tmp_path / "o2", spec, ladder, prereg)) is None


def test_study_probes_are_finished_runs_pinned_into_the_study_dir(tmp_path):
    """gates.probes: finished run dirs relative to the study file; one that is not a finished run is
    an error naming the key; the gates stage copies config and summary into the study dir."""
    import pytest

    from delphi.errors import DelphiError
    from delphi.study.snapshot import compact_files
    from delphi.study.spec import load_study
    from delphi.study.state import Study, pin_probes, probe_runs

    raw = {"name": "x", "ladder": str(REPO / "studies" / "ladder_tiny.yaml"), "gates": {"probes": ["p/probe3x"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "p" / "probe3x").mkdir(parents=True)
    with pytest.raises(DelphiError, match=r"gates.probes: .*probe3x is not a finished run dir"):
        load_study(tmp_path / "s.yaml")
    for name in ("config.yaml", "status.json", "summary.json", "metrics.jsonl"):
        shutil.copy(
            edition_tree(REPO / "paper" / "editions" / "v4") / "probe3x" / name, tmp_path / "p" / "probe3x" / name
        )
    spec, ladder, prereg, calibrations, probes = load_study(tmp_path / "s.yaml")
    assert probes == ((tmp_path / "p" / "probe3x").resolve(),)
    study = Study(tmp_path / "out", spec, ladder, prereg, calibrations, probes)
    with pytest.raises(DelphiError, match="the gates stage copies them"):
        probe_runs(study)
    pin_probes(study)
    assert probe_runs(study) == [study.probes_dir / "probe3x"]
    assert (study.probes_dir / "probe3x" / "summary.json").read_bytes() == (
        edition_tree(REPO / "paper" / "editions" / "v4") / "probe3x" / "summary.json"
    ).read_bytes()
    # A snapshot keeps finished runs only: the probe's status comes along, so the evidence is committed.
    assert Path("probes/probe3x/summary.json") in compact_files(study.out)
    # A link keeps its own name (paper/editions/v5/hero30x -> study/hero).
    (tmp_path / "p" / "hero30x").symlink_to("probe3x")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw | {"gates": {"probes": ["p/hero30x"]}}))
    assert [p.name for p in load_study(tmp_path / "s.yaml")[4]] == ["hero30x"]
    # Correcting by the probes needs probes.
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw | {"gates": {}, "hero": {"probe_correction": True}}))
    with pytest.raises(
        DelphiError, match=r"hero.probe_correction: true needs probes \(gates.probes or hero.probe_multiples\)"
    ):
        load_study(tmp_path / "s.yaml")
    for hero, message in (
        ({"trajectory": "probes"}, "hero.trajectory: probes needs probes"),
        ({"trajectory": "spline"}, "hero.trajectory: 'spline', expected one of"),
        ({"probe_carry": "cubic"}, r"hero.probe_carry: 'cubic', expected one of \['linear', 'local_slope'\]"),
    ):
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw | {"gates": {}, "hero": hero}))
        with pytest.raises(DelphiError, match=message):
            load_study(tmp_path / "s.yaml")
    # The pinned copy carries the probe's eval curve too, for a trajectory taken from its shape.
    assert (study.probes_dir / "probe3x" / "metrics.jsonl").is_file()


def test_report_sections_come_from_the_files(tmp_path):
    """The gate, convention and rung-health tables of report.md are rendered from what the stages wrote."""
    import pandas as pd

    from delphi.prereg.gates import Gate, gate_report
    from delphi.study.report import conventions_section, gates_section, health_table
    from delphi.study.spec import StudySpec
    from delphi.study.state import Study

    study = Study(tmp_path, StudySpec(), tmp_path / "ladder.yaml")
    assert gates_section(study) == [] and conventions_section(study) == []
    (tmp_path / "fits").mkdir()
    gates = [
        Gate("seeds", False, 1, ">= 2 seeds in every cell", "one seed"),
        Gate("fit_status", True, "ok", "status ok", "ok"),
    ]
    study.gates.write_text(json.dumps(gate_report(gates, forced=True)))
    text = "\n".join(gates_section(study))
    assert "FAILED (seeds); the study went on with force: true" in text and "| seeds | FAIL | 1 |" in text
    study.conventions.write_text(
        json.dumps(
            {
                "chosen": "fpt6",
                "why": "lowest backtest error",
                "primary_fit": "vpnls",
                "conventions": {
                    "fpt6": {"isoflop_a": 0.68, "law_a": 0.55, "backtest_mean_abs_rel_error": 0.004},
                    "nonembedding": {"isoflop_a": 0.91, "error": "fit failed"},
                },
            }
        )
    )
    text = "\n".join(conventions_section(study))
    assert "Chosen: **fpt6**" in text and "| fpt6 | 0.680 - | 0.550 | 0.40% |" in text and "fit failed" in text
    table = pd.DataFrame(
        {
            "run_id": ["a", "b"],
            "budget": [1e12, 1e12],
            "steps": [500, 900],
            "drop_frac_mean": [0.01, 0.05],
            "health_ok": [True, False],
            "health_issues": ["", "max_drop_frac"],
        }
    )
    rendered = health_table(table)
    assert (
        "drop_frac_mean" in rendered.splitlines()[0] and "| b | 1e+12 | 900 | 0.05 | no | max_drop_frac |" in rendered
    )
    assert "no health columns" in health_table(table.drop(columns=["health_ok"]))


def test_the_verdict_table_prints_predicted_and_actual_to_4_decimals():
    """Issue 43 §3: "1.503" against "1.5" read as numbers of different precision; both get 4 decimals."""
    from delphi.study.report import verdict_table

    row = verdict_table(
        {
            "predicted_final_loss": 1.5032,
            "actual_final_loss": 1.5,
            "rel_error": -0.0021,
            "covered_90": True,
            "verdict": "passed",
        }
    )[-1]
    assert row == "| hero final val loss (nats/byte) | 1.5032 | 1.5000 | -0.21% | yes | passed |"
    assert "| - | - |" in verdict_table({})[-1]  # no check result yet: dashes, not a crash


def _method_choice(method: str, fitted: str) -> dict:
    return {
        "method": method,
        "rule": "lowest calibrated error",
        "similar_sources": [{"source": "marin/comma"}],
        "table": [
            {
                "method": method,
                "n": 18,
                "mean_abs_rel_error": 0.0081,
                "mean_abs_rel_error_uncalibrated": 0.0205,
                "coverage_50": 0.44,
                "coverage_90": 0.89,
            }
        ],
        "fitted_method": fitted,
        "agrees": method == fitted,
    }


def test_the_report_names_the_law_that_predicts_and_why():
    """Issue 43 §3: the report says which law made the sealed prediction (the primary law) and why
    (primary_fit fixed, or auto and the evidence), and that the method-choice table is public-sweep
    evidence that may name another law when the study fixed its own: no bare "method choice: vpnls;
    the study's primary law is isoflop"."""
    from delphi.fits.calibration import report_lines
    from delphi.study.report import primary_law_lines

    fixed = primary_law_lines("isoflop", "isoflop")[0]
    assert fixed.startswith("The sealed prediction was made by the study's primary law, the isoflop law.")
    assert "the study file fixes it (`primary_fit: isoflop`)" in fixed and "may name another law" in fixed
    auto = primary_law_lines("vpnls", "auto", {"probe_correction": {"carry": "linear"}})[0]
    assert "the vpnls law, corrected by its error trend at the probes" in auto
    assert "`primary_fit: auto`" in auto and "the fit stage chose vpnls once" in auto

    final = {
        "calibrated": {
            "applied": False,
            "reason": "no calibration here",
            "method_choice": _method_choice("vpnls", "isoflop"),
        }
    }
    text = "\n".join(report_lines(final, primary_fit="isoflop", primary_law="isoflop"))
    assert "the study's primary law is" not in text
    assert "Public-sweep evidence for which law extrapolates best on sweeps like this one." in text
    assert (
        "**vpnls**. Similar sweeps: marin/comma. It differs from the study's primary law, isoflop, which made the sealed "
        "prediction all the same: the study fixes `primary_fit: isoflop`, and a fixed primary law is not re-chosen"
    ) in text
    assert "| vpnls | 18 | 0.81% | 2.05% | 44% | 89% |" in text
    text = "\n".join(report_lines(final, primary_fit="auto", primary_law="isoflop"))
    assert "with `primary_fit: auto` the fit stage chose it once, among the laws this study fits" in text
    final["calibrated"]["method_choice"] = _method_choice("vpnls", "vpnls")
    text = "\n".join(report_lines(final, primary_fit="auto", primary_law="vpnls"))
    assert "It names the study's primary law, vpnls, the law that made the sealed prediction." in text
    assert "isoflop" not in text


@pytest.mark.parametrize("edition", ["v1", "v3", "v5", "v6", "v7", "v8"])
def test_paper_build_regenerates_each_edition_from_its_compact_data(tmp_path, monkeypatch, edition):
    """Each edition `delphi paper build` renders (v8 is the current one, paper/paper.md) is exactly what its template
    and its compact data (paper/editions/vN: curves and files tables, no run dirs) give."""
    from delphi.editions import built_editions

    monkeypatch.chdir(REPO)  # the text quotes the data path as given
    source, data = built_editions("paper")[edition]
    assert (source == Path("paper")) == (edition == "v8") and not list(data.rglob("metrics.jsonl"))
    paper = tmp_path / "paper"
    paper.mkdir()
    shutil.copy(source / "template.md", paper / "template.md")
    assert cli_main(["paper", "build", "--paper-dir", str(paper), "--data", str(data)]) == 0
    text = (paper / "paper.md").read_text()
    assert "$" not in text.replace("$$", "")  # every placeholder filled
    assert text == (source / "paper.md").read_text()  # the committed paper is what the data gives
    assert {p.name for p in (paper / "figures").glob("*.png")} >= {"isoflop.png", "prediction.png", "frontier.png"}


def test_paper_build_knows_which_editions_it_renders(capsys):
    """v2 and v4 were written by hand (a README): kept as text, not rendered; asking for one says so."""
    from delphi.editions import built_editions, current_edition

    assert list(built_editions(REPO / "paper")) == ["v1", "v3", "v5", "v6", "v7", "v8"]
    assert current_edition(REPO / "paper").name == "v8"
    assert cli_main(["paper", "build", "--paper-dir", str(REPO / "paper"), "--edition", "v2"]) == 2
    assert "not an edition `delphi paper build` renders" in capsys.readouterr().err


def test_paper_build_refuses_two_data_sources_and_missing_data(tmp_path, capsys):
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "template.md").write_text("# $verdict\n")
    assert cli_main(["paper", "build", "--paper-dir", str(paper), "--data", "x", "--from-study", "y"]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli_main(["paper", "build", "--paper-dir", str(paper), "--data", str(tmp_path / "nothing")]) == 2
    assert "no study.json" in capsys.readouterr().err
    assert not (paper / "paper.md").exists()


def test_a_run_stopped_by_a_signal_is_not_a_stage_done():
    """A hero stopped by SIGTERM returns a summary (status failed, "stopped by signal"): the study
    must stop there, not check the preregistration against a partial run (it once went on to the
    check stage); a diverged hero is an outcome, checked as a failure."""
    import pytest

    from delphi.errors import CheckFailed
    from delphi.study.seeds import finished

    stopped = {"status": "failed", "reason": "stopped by signal SIGTERM at step 8312; continue with --resume"}
    with pytest.raises(CheckFailed, match="the hero stopped before its end .*SIGTERM at step 8312.* resume"):
        finished(stopped, "the hero")
    assert finished({"status": "diverged"}, "the hero")["status"] == "diverged"
    assert finished({"status": "completed"}, "the hero")["status"] == "completed"


def test_the_paper_says_how_a_corrected_seal_came_from_the_law():
    """The sixth edition sealed the isoFLOP law x its probe trend: the paper's sentence gives the
    law's own number, the probes' errors, the carried correction and, with an outcome, both errors."""
    from delphi.fits.probes import correction_text
    from delphi.prereg_format import read

    final = read(REPO / "preregistrations" / "paper-v6-hero-60x.yaml")["prediction"]["final"]
    text = correction_text(final, 1.0, primary_law="the isoFLOP power law (Approach 2)")
    assert (
        text["prediction_rule"]
        == "corrected the primary law, the isoFLOP power law (Approach 2), by its error trend at them"
    )
    sentence = text["correction_sentence"]
    for part in (
        "the law predicted 0.8732",
        "-1.99% at 3x, +2.96% at 10x, +8.69% at 30x",
        "+10.7% per decade",
        "+11.68% with an sd of 1.62%",
        "sealed 0.9752 = 0.8732 x (1 +11.68%)",
        f"would have been {1 / 0.873221852575211 - 1:+.2%}",
        f"it is {1 / 0.9752299528466102 - 1:+.2%}",
    ):
        assert part in sentence, part
    plain = correction_text({"loss": 1.0}, None, primary_law="VPNLS")
    assert plain["correction_sentence"] == "The sealed number is VPNLS's own prediction."


def test_study_trains_its_own_probes_and_seals_the_corrected_hero(tmp_path):
    """hero.probe_multiples: after the ladder's gates, the study sizes, seals and trains each probe
    (its preregistration written before its first step), then seals the hero corrected by the
    probes' error trend, its trajectory shaped like the longest probe. The micro ladder has one seed,
    so the ladder's gates fail and `force: true` carries the study on (recorded); the prediction's
    gates are deferred while the probes are untrained."""
    import pytest

    from delphi import prereg_format as fmt

    study = _micro_study(tmp_path)
    raw = yaml.safe_load(study.read_text())
    raw["hero"] |= {
        "compute_multiple": 2.5,
        "rehearsal_multiple": None,
        "probe_multiples": [1.25, 1.5, 2],
        "probe_correction": True,
        "trajectory": "probes",
    }
    raw["force"] = True
    study.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    done = _study(str(study), "--out", str(out), "--stop-after", "prereg")
    assert done.returncode == 0, done.stderr
    assert "gate DEFERRED interval_width: evaluated at the seal" in done.stderr
    gates = json.loads((out / "gates.json").read_text())
    assert {g["name"] for g in gates["deferred"]["gates"]} == {"lobo_spread", "interval_width", "method_agreement"}
    for name in ("probe1.25x", "probe1.5x", "probe2x"):
        seal = fmt.read(out / "probes" / f"{name}.prereg.yaml")
        summary = json.loads((out / "probes" / name / "summary.json").read_text())
        assert seal["forced"] and fmt.seal_status(seal)["ok"] and summary["status"] == "completed"
    hero = fmt.read(out / "preregistration.yaml")
    final = hero["prediction"]["final"]
    assert set(final["probe_correction"]["probes"]) == {"probe1.25x", "probe1.5x", "probe2x"}
    assert final["loss"] == pytest.approx(final["uncorrected"]["loss"] * (1 + final["probe_correction"]["carried_rel"]))
    assert hero["prediction"]["trajectory"]["model"]["shape_run"].endswith("probe2x")
    assert any(g["name"] == "probes" for g in hero["gates"]) and hero["forced"]
    # Bad input: probes at or beyond the hero, or two of one multiple.
    for multiples, message in (
        ([3], "must lie below hero.compute_multiple"),
        ([1.5, 1.5], "expected distinct multiples > 1"),
    ):
        raw["hero"]["probe_multiples"] = multiples
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
        refused = _study(str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "bad"))
        assert refused.returncode == 2 and message in refused.stderr and not (tmp_path / "bad").exists()


def test_a_study_resumes_after_its_recipe_check_gains_a_point(tmp_path, capsys):
    """The recipe check's sweep (`recipe.check`) trains in its own directory, never in the study's:
    extending it (a fitted hero longer than its longest horizon) is the same study, and study.json
    records the new points; any other change to the ladder is still a different study."""
    from delphi.errors import DelphiError
    from delphi.study.spec import load_study
    from delphi.study.state import STUDY_FILE, Study, pin_study

    shutil.copy(REPO / "studies" / "paper_v8.yaml", tmp_path / "paper_v8.yaml")
    ladder = yaml.safe_load((REPO / "studies" / "ladder_paper_v8.yaml").read_text())

    def pin(change) -> None:
        raw = json.loads(json.dumps(ladder))
        change(raw)
        (tmp_path / "ladder_paper_v8.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        spec, ladder_path, prereg, calibrations, probes = load_study(tmp_path / "paper_v8.yaml")
        pin_study(Study(tmp_path / "out", spec, ladder_path, prereg, calibrations, probes))

    pin(lambda raw: None)
    pin(lambda raw: raw["recipe"]["check"]["horizons"].append(1.5e8))
    assert "the recipe check's points changed" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / STUDY_FILE).read_text())["ladder"]["recipe"]["check"]["horizons"][-1] == 1.5e8
    with pytest.raises(DelphiError, match="holds a different study"):
        pin(lambda raw: raw["recipe"].update(lr={"value": 1e-3, "source": "test"}))
