"""`delphi fit coverage` (issue 43 §4): empirical 50%/90% coverage of Delphi's intervals, counted
from committed files; exact counts on hand-made files; bad input is exit 2 naming file and column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.fits import coverage as cov
from delphi.fits import coverage_rows as cov_rows
from delphi.fits.beyond import EXTRAPOLATION_BINS

ROOT = Path(__file__).resolve().parent.parent


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- the committed files


@pytest.fixture(scope="module")
def committed():
    return cov.coverage_table(ROOT)


def test_every_row_names_a_file_of_the_repository(committed):
    rows = committed["rows"]
    assert {r["section"] for r in rows} >= {"default_study", "public_sweeps", "preregistrations"}
    for r in rows:
        assert (ROOT / r["source"]).exists(), r["source"]
        assert r["covered_90"] is not None and r["covered_90"]["n"] <= r["n"]
        expected = (
            cov_rows.TOO_FEW
            if r["covered_90"]["n"] < cov.MIN_POINTS
            else (cov_rows.WITHIN if 0.85 <= r["covered_90"]["k"] / r["covered_90"]["n"] <= 0.95 else cov_rows.OUTSIDE)
        )
        assert r["flag"] == expected
    assert committed["markdown"].count("\n") == len(rows) + 1


def test_default_study_row_is_the_current_editions_seeds(committed):
    row = committed["rows"][0]
    rows = list(csv.DictReader((ROOT / cov.SUMMARY).open(newline="")))
    plain = {r["edition"] for r in rows if r["actual"] and r["edition"].isdigit()}
    edition = max(plain, key=int)
    assert row["edition"] == edition and f"edition {edition}" in row["label"]
    newest = {}
    for r in rows:
        if r["edition"] == edition and r["actual"]:
            newest[r["study_seed"]] = r
    assert row["n"] == len(newest)
    hits = sum(float(r["sealed_90_lo"]) <= float(r["actual"]) <= float(r["sealed_90_hi"]) for r in newest.values())
    assert row["covered_90"] == {"k": hits, "n": len(newest)}
    hits_50 = sum(float(r["sealed_50_lo"]) <= float(r["actual"]) <= float(r["sealed_50_hi"]) for r in newest.values())
    assert row["covered_50"] == {"k": hits_50, "n": len(newest)}  # the summary records the 50% interval since edition 7


def test_public_sweep_rows_match_the_committed_bin_tables(committed):
    """The pooled per-bin counts are the sums of benchmarks/results/beyond/bins_after.csv (calibrated)
    and bins_before.csv (fit-only), which backtest_beyond.py wrote from the same rows."""
    rows = {(r["bin"], r["interval"]): r for r in committed["rows"] if r["section"] == "public_sweeps"}
    assert {b for b, _ in rows} == {b[0] for b in EXTRAPOLATION_BINS} | {"all"}
    for name, interval in (("bins_after.csv", "calibrated"), ("bins_before.csv", "fit-only")):
        table = list(csv.DictReader((ROOT / "benchmarks/results/beyond" / name).open(newline="")))
        for label in {r["bin"] for r in table}:
            part = [r for r in table if r["bin"] == label]
            n = sum(int(r["n"]) for r in part)
            row = rows[(label, interval)]
            assert row["n"] == n
            for level in ("50", "90"):
                k = sum(round(float(r[f"coverage_{level}"]) * int(r["n"])) for r in part)
                assert row[f"covered_{level}"] == {"k": k, "n": n}, (label, interval, level)
    assert any("agree with the LOSO table" in n and "48" in n for n in committed["notes"])


def test_prereg_rows_count_every_sealed_outcome(committed):
    directory = ROOT / cov.PREREGISTRATIONS
    outcomes = [
        p for p in directory.glob("*.outcome.json") if (directory / p.name.replace(".outcome.json", ".yaml")).is_file()
    ]
    row = next(r for r in committed["rows"] if r["section"] == "preregistrations")
    assert row["n"] == len(outcomes) == row["covered_90"]["n"]
    assert row["covered_90"]["k"] == sum(json.loads(p.read_text())["covered_90"] for p in outcomes)
    assert not any("recomputed" in n for n in committed["notes"])  # the outcomes' booleans agree with the recount
    with_competing = [p for p in outcomes if "competing" in json.loads(p.read_text())]
    competing = [r for r in committed["rows"] if r["section"] == "competing"]
    assert len(competing) == (1 if with_competing else 0)
    if competing:
        laws = sum(len(json.loads(p.read_text())["competing"]) for p in with_competing)
        assert competing[0]["n"] == laws


def test_the_command_prints_the_table_and_json(capsys):
    code, out, err = _run(["fit", "coverage"], capsys)
    assert code == 0 and out == ""
    assert err.startswith("| intervals | source | n | 50% covered | 90% covered | 90% flag |")
    code, out, _ = _run(["fit", "coverage", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["markdown"] in err and len(data["rows"]) >= 12


# --------------------------------------------------------------------------- hand-made files, exact counts

SUMMARY_HEAD = [
    "run",
    "edition",
    "study_seed",
    "predicted",
    "sealed_50_lo",
    "sealed_50_hi",
    "sealed_90_lo",
    "sealed_90_hi",
    "actual",
    "sealed_90_covered",
    "verdict",
]


def _summary(path: Path, rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_HEAD)
        w.writerows(rows)
    return path


def _world(root: Path) -> Path:
    """A repository tree with a tiny summary, public-sweep rows, calibration and preregistrations."""
    (root / "benchmarks/default_study").mkdir(parents=True)
    _summary(
        root / cov.SUMMARY,
        [
            ["e1-s0", "1", "0", 1.0, 0.99, 1.01, 0.9, 1.1, 1.0, "True", "passed"],
            ["e2-s0-old", "2", "0", 1.0, 0.99, 1.01, 0.9, 1.1, 1.0, "True", "passed"],  # superseded by e2-s0
            ["e2-s1", "2", "1", 1.0, 0.99, 1.01, 0.9, 1.1, 1.05, "False", "passed"],  # 90 in, 50 out; boolean wrong
            ["e2-s2-refused", "2", "2", 1.0, 0.99, 1.01, 0.9, 1.1, "", "", "refused by gates"],
            ["e2-s0", "2", "0", 1.0, 0.99, 1.01, 0.9, 1.1, 1.2, "False", "failed"],  # newest seed 0: out, out
            ["e2b-s3", "2b", "3", 1.0, 0.99, 1.01, 0.9, 1.1, 1.0, "True", "passed"],  # a variant round
        ],
    )
    # Public sweeps: two sources, one law; factors in 1-3x (3 points), 3-10x (1), >30x (1).
    (root / "benchmarks/results/beyond").mkdir(parents=True)
    head = [
        "source",
        "method",
        "factor",
        "bin",
        "observed_best_loss",
        "lo_50",
        "hi_50",
        "lo_90",
        "hi_90",
        "cal_lo_50",
        "cal_hi_50",
        "cal_lo_90",
        "cal_hi_90",
        "calibration_sources",
    ]
    rows = [  # observed 1.0 throughout: (fit-only 50, 90), (calibrated 50, 90) covered as noted
        ["a", "iso", 2.0, "1-3x", 1.0, 0.9, 1.1, 0.8, 1.2, 0.9, 1.1, 0.8, 1.2, "b"],  # T T / T T
        ["a", "iso", 3.0, "1-3x", 1.0, 1.01, 1.1, 0.8, 1.2, 0.95, 1.05, 0.9, 1.1, "b"],  # F T / T T
        ["b", "iso", 2.5, "1-3x", 1.0, 1.01, 1.1, 1.01, 1.2, 1.01, 1.05, 0.9, 1.1, "a"],  # F F / F T
        ["b", "iso", 5.0, "3-10x", 1.0, 1.01, 1.1, 1.01, 1.2, 1.01, 1.05, 1.01, 1.1, "a"],  # F F / F F
        ["b", "iso", 40.0, ">30x", 1.0, 0.9, 1.1, "", "", 0.9, 1.1, 0.8, 1.2, "a"],  # T - / T T (no fit-only 90%)
    ]
    with (root / cov.BEYOND_ROWS).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(rows)
    (root / cov.CALIBRATION).parent.mkdir(parents=True)
    (root / cov.CALIBRATION).write_text(
        json.dumps(
            {
                "loso": [
                    {"source": "a", "method": "iso", "n": 2, "coverage_50": 1.0, "coverage_90": 1.0},
                    {"source": "b", "method": "iso", "n": 3, "coverage_50": 1 / 3, "coverage_90": 2 / 3},
                ]
            }
        )
    )
    pre = root / cov.PREREGISTRATIONS
    pre.mkdir()

    def seal(name, loss_50, loss_90, outcome, competing=None):
        prediction = {"final": {"loss": 1.0, "loss_50": loss_50, "loss_90": loss_90}}
        if competing:
            prediction["competing"] = competing
        (pre / f"{name}.yaml").write_text(yaml.safe_dump({"prediction": prediction}))
        if outcome is not None:
            (pre / f"{name}.outcome.json").write_text(json.dumps(outcome))

    seal(
        "a", [0.99, 1.01], [0.9, 1.1], {"actual_final_loss": 1.05, "covered_50": False, "covered_90": False}
    )  # 90 wrong
    seal(
        "b",
        [0.95, 1.05],
        [0.9, 1.1],
        {
            "actual_final_loss": 1.0,
            "covered_50": True,
            "covered_90": True,
            "competing": {"x": {"covered_90": True}, "y": {"covered_90": False}},
        },
        competing={
            "x": {"loss": 1.0, "loss_50": [0.99, 1.01], "loss_90": [0.9, 1.1]},
            "y": {"loss": 1.3, "loss_50": [1.2, 1.4], "loss_90": [1.1, 1.5]},
            "z": {"error": "no prediction (a fit failed)"},
        },
    )
    seal("c", [0.95, 1.05], [0.9, 1.1], None)  # sealed, not yet run
    seal("d", None, [0.8, 0.9], {"actual_final_loss": 1.0})  # no 50% interval sealed; 90 out
    seal("e", [0.95, 1.05], [0.9, 1.1], {"verdict": "invalid: the run predates the preregistration"})
    (pre / "orphan.outcome.json").write_text(json.dumps({"actual_final_loss": 1.0}))
    return root


def test_hand_made_files_give_exact_counts(tmp_path, capsys):
    root = _world(tmp_path)
    code, out, err = _run(["fit", "coverage", "--root", root, "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    rows = data["rows"]
    study = rows[0]
    assert study["edition"] == "2" and study["n"] == 2 and study["runs"] == ["e2-s0", "e2-s1"]
    assert study["covered_90"] == {"k": 1, "n": 2} and study["covered_50"] == {"k": 0, "n": 2}
    assert study["flag"] == cov_rows.TOO_FEW
    assert any("e2-s1: sealed_90_covered says False, recomputed True" in n for n in data["notes"])
    assert any("e2-s0-old" in n for n in data["notes"]) and any("e2-s2-refused" in n for n in data["notes"])

    sweeps = {(r["bin"], r["interval"]): r for r in rows if r["section"] == "public_sweeps"}
    assert set(sweeps) == {(b, i) for b in ("1-3x", "3-10x", ">30x", "all") for i in ("calibrated", "fit-only")}
    assert (sweeps[("1-3x", "calibrated")]["covered_50"], sweeps[("1-3x", "calibrated")]["covered_90"]) == (
        {"k": 2, "n": 3},
        {"k": 3, "n": 3},
    )
    assert (sweeps[("1-3x", "fit-only")]["covered_50"], sweeps[("1-3x", "fit-only")]["covered_90"]) == (
        {"k": 1, "n": 3},
        {"k": 2, "n": 3},
    )
    assert sweeps[("3-10x", "calibrated")]["covered_90"] == {"k": 0, "n": 1}
    assert sweeps[(">30x", "fit-only")]["covered_90"] is None and sweeps[(">30x", "fit-only")]["n"] == 1
    assert sweeps[("all", "calibrated")]["covered_90"] == {"k": 4, "n": 5}
    assert sweeps[("all", "fit-only")]["covered_90"] == {"k": 2, "n": 4}
    assert any("agree with the LOSO table" in n and "all 2" in n for n in data["notes"])

    primary = next(r for r in rows if r["section"] == "preregistrations")
    assert primary["seals"] == ["a", "b", "d"] and primary["source"] == "preregistrations/"
    assert primary["covered_90"] == {"k": 2, "n": 3} and primary["covered_50"] == {"k": 1, "n": 2}
    assert any("a.outcome.json: covered_90 says False, recomputed True" in n for n in data["notes"])
    assert any("orphan.outcome.json" in n for n in data["notes"]) and any("e.outcome.json" in n for n in data["notes"])
    competing = next(r for r in rows if r["section"] == "competing")
    assert (
        competing["n"] == 2
        and competing["covered_90"] == {"k": 1, "n": 2}
        and competing["covered_50"] == {"k": 1, "n": 2}
    )
    assert any("'z'" in n for n in data["notes"])
    assert "| 2/3 (67%) |" in data["markdown"] and data["markdown"].count("| not recorded |") == 1  # >30x fit-only 90%

    code, _, err = _run(["fit", "coverage", "--root", root, "--edition", "2b"], capsys)
    assert code == 0 and "edition 2b: one hero per study seed (3)" in err


def test_the_reseal_rows_count_the_shipped_resample_once_per_correction(tmp_path):
    path = tmp_path / "reseal.csv"
    header = "run,study_seed,resample,lo90,hi90,lo50,hi50,actual\n"
    path.write_text(
        header
        + "r0,0,seeds,1.0,1.1,1.04,1.06,1.2\n"
        + "r0,0,cells,1.0,1.3,1.15,1.25,1.2\n"
        + "r1,1,cells,1.0,1.04,1.01,1.03,1.05\n"
    )
    (row,) = cov.reseal_rows(path, tmp_path)  # no correction column: the law's own point
    assert row["n"] == 2 and row["covered_90"] == {"k": 1, "n": 2} and row["covered_50"] == {"k": 1, "n": 2}
    assert "post hoc" in row["label"] and "law's own point" in row["label"] and row["runs"] == ["r0", "r1"]
    path.write_text(
        header.replace("\n", ",correction\n")
        + "r0,0,cells,1.0,1.3,1.15,1.25,1.2,none\n"
        + "r1,1,cells,1.0,1.04,1.01,1.03,1.05,none\n"
        + "r1,1,cells,1.0,1.06,1.01,1.03,1.05,leave-one-seed-out\n"
    )
    plain, corrected = cov.reseal_rows(path, tmp_path)
    assert plain["n"] == 2 and corrected["n"] == 1 and corrected["covered_90"] == {"k": 1, "n": 1}
    assert "leave-one-seed-out" in corrected["label"] and corrected["runs"] == ["r1"]
    path.write_text(header + "r0,0,cells,1.0,1.3,1.1,1.15,abc\n")
    with pytest.raises(DelphiError, match="reseal.csv.*actual"):
        cov.reseal_rows(path, tmp_path)


def test_a_stale_row_table_is_a_note_not_an_error(tmp_path):
    root = _world(tmp_path)
    (root / cov.CALIBRATION).write_text(
        json.dumps(
            {
                "loso": [
                    {"source": "a", "method": "iso", "n": 2, "coverage_50": 1.0, "coverage_90": 1.0},
                    {"source": "b", "method": "iso", "n": 4, "coverage_50": 0.25, "coverage_90": 0.5},
                ]
            }
        )
    )
    notes = cov.coverage_table(root)["notes"]
    assert any("disagree with the LOSO table" in n and "b iso" in n for n in notes)


def test_flags_and_editions():
    assert cov_rows.flag_90({"k": 9, "n": 10}) == cov_rows.WITHIN
    assert cov_rows.flag_90({"k": 8, "n": 10}) == cov_rows.OUTSIDE
    assert cov_rows.flag_90({"k": 10, "n": 10}) == cov_rows.OUTSIDE
    assert cov_rows.flag_90({"k": 9, "n": 9}) == cov_rows.TOO_FEW
    assert cov.current_edition(["3", "4", "5", "5b", "5c", "10a"]) == "5"
    assert cov.current_edition(["5b", "5c"]) == "5c"
    assert cov.fraction(None) == "not recorded" and cov.fraction({"k": 1, "n": 3}) == "1/3 (33%)"


# --------------------------------------------------------------------------- bad input: exit 2, one line


def _refused(code, err, *words):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("delphi: error:"), err
    for w in words:
        assert str(w) in lines[0], (w, err)


def test_a_summary_without_a_needed_column(tmp_path, capsys):
    root = _world(tmp_path)
    path = root / cov.SUMMARY
    rows = list(csv.DictReader(path.open(newline="")))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, [c for c in SUMMARY_HEAD if c != "actual"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], path, "'actual'")


@pytest.mark.parametrize("what", ["summary", "beyond", "calibration", "preregistrations"])
def test_a_missing_input(tmp_path, capsys, what):
    root = _world(tmp_path)
    path = {
        "summary": cov.SUMMARY,
        "beyond": cov.BEYOND_ROWS,
        "calibration": cov.CALIBRATION,
        "preregistrations": cov.PREREGISTRATIONS,
    }[what]
    target = root / path
    if target.is_dir():
        for p in target.iterdir():
            p.unlink()
        target.rmdir()
    else:
        target.unlink()
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], target)


def test_bad_cells_and_keys_name_file_and_column(tmp_path, capsys):
    root = _world(tmp_path)
    rows = (root / cov.BEYOND_ROWS).read_text().splitlines()
    header = rows[0].split(",")
    (root / cov.BEYOND_ROWS).write_text("\n".join([",".join(c for c in header if c != "cal_lo_90")] + rows[1:]) + "\n")
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], cov.BEYOND_ROWS.name, "'cal_lo_90'")

    root = _world(tmp_path / "second")
    (root / cov.BEYOND_ROWS).write_text((root / cov.BEYOND_ROWS).read_text().replace(",2.5,", ",x,"))
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], cov.BEYOND_ROWS.name, "line 4", "'factor'")

    root = _world(tmp_path / "third")
    (root / cov.PREREGISTRATIONS / "a.yaml").write_text(yaml.safe_dump({"prediction": {"final": {"loss": 1.0}}}))
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], "a.yaml", "loss_90")

    root = _world(tmp_path / "fourth")
    _summary(root / cov.SUMMARY, [["r", "1", "0", 1.0, "", "", 0.9, 1.1, "lots", "", "passed"]])
    _refused(*_run(["fit", "coverage", "--root", root], capsys)[::2], "summary.csv", "line 2", "'actual'")
