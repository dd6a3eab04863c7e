"""Issue 43, part 2: `delphi fit backtest` prints and writes, for each held-out budget, the calibrated
interval (delphi/fits/data/beyond_calibration.json) beside the law's own, with its extrapolation factor;
`--no-calibration` gives the output of before, byte for byte (tests/golden/backtest_no_calibration,
captured from the code before this change); a bad calibration file is exit 2 before any fit.

Data: the public isoFLOP table tests/data/isoflops.csv (provenance in tests/data/README.md)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from delphi.cli import main
from delphi.fits import calibration as cal
from delphi.fits import calibration_file

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
GOLDEN = REPO / "tests" / "golden" / "backtest_no_calibration"
LLAMA = "experiment == 'llama_3__exp_loss' and not outlier"
CHINCHILLA = "experiment == 'epochai_chinchilla__massivetext__chinchilla' and not outlier"
# The golden cases: the argv after `delphi fit backtest tests/data/isoflops.csv`, and before `--json --out FILE`.
CASES = {
    "llama3_exp_vpnls_holdout3": ["--query", LLAMA, "--method", "vpnls", "--holdout", "3"],
    "chinchilla_isoflop_cut3e19": ["--query", CHINCHILLA, "--method", "isoflop", "--cut", "3e19"],
    "llama3_exp_isoflop_bootstrap20": [
        "--query",
        LLAMA,
        "--method",
        "isoflop",
        "--holdout",
        "2",
        "--bootstrap",
        "20",
        "--workers",
        "1",
    ],
    "llama3_exp_all_holdouts": ["--query", LLAMA, "--method", "isoflop", "vpnls", "envelope", "--all-holdouts"],
    "llama3_exp_envelope_holdout2": ["--query", LLAMA, "--method", "envelope", "--holdout", "2"],
}
# Chinchilla (Epoch) fitted on 6e18 and 1e19: held out at 3x, 6x, 30x, 60x and 100x the top fitted budget.
CHINCHILLA_CUT = CASES["chinchilla_isoflop_cut3e19"]


def _run(argv: list, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _backtest(tmp_path: Path, capsys, *argv) -> tuple[dict, str, Path]:
    out = tmp_path / "bt.json"
    code, _, err = _run(["fit", "backtest", ISOFLOPS, *argv, "--out", out], capsys)
    assert code == 0, err
    return json.loads(out.read_text()), err, out


def _refused(code: int, err: str, name: str) -> None:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("delphi: error:")]
    assert len(lines) == 1 and name in lines[0], err
    assert "Traceback" not in err


def _calibration_copy(tmp_path: Path, change) -> Path:
    data = json.loads(calibration_file.DEFAULT_PATH.read_text())
    change(data)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- calibrate_point (pure)


def test_calibrate_point_is_the_calibrated_prediction_with_its_status() -> None:
    calibration = calibration_file.load_checked_calibration()
    point = cal.calibrate_point("isoflop", 2.0, [1.98, 2.02], 10.0, calibration)
    same = cal.calibrated_prediction("isoflop", 2.0, [1.98, 2.02], 10.0, calibration)
    assert point["applied"] and point["status"] == cal.CALIBRATED
    assert point["loss"] == pytest.approx(same["loss"]) and point["loss_90"] == pytest.approx(same["loss_90"])
    assert point["uncalibrated_loss"] == 2.0 and point["uncalibrated_interval_90"] == [1.98, 2.02]
    assert point["factor"] == 10.0 and point["max_calibrated_factor"] == pytest.approx(100 / 3)
    lo, hi = point["loss_90"]
    assert lo < point["loss"] < hi and hi - lo > 0.04  # wider than the law's own 90% interval at 10x
    assert "calibrated 90% [" in cal.describe_calibrated(point) and "10x" in cal.describe_calibrated(point)

    beyond = cal.calibrate_point("isoflop", 2.0, [1.98, 2.02], 60.0, calibration)
    assert not beyond["applied"] and beyond["status"] == cal.BEYOND_RANGE and "loss_90" not in beyond
    assert "60x" in beyond["reason"] and "max_calibrated_factor 33.33x" in beyond["reason"]
    assert "uncalibrated" in cal.describe_calibrated(beyond)
    # exactly at the furthest calibrated factor is still calibrated
    assert cal.calibrate_point("isoflop", 2.0, None, 1e21 / 3e19, calibration)["applied"]

    none = cal.calibrate_point(None, 2.0, [1.98, 2.02], 3.0, calibration, fit_label="the envelope fit by approach1")
    assert none["status"] == cal.NO_ENTRY and "the envelope fit by approach1" in none["reason"]
    assert none["max_calibrated_factor"] is None
    assert cal.calibrate_point("isoflop", 2.0, None, 1.0, calibration)["status"] == cal.NOT_BEYOND
    assert cal.calibrate_point("isoflop", math.nan, None, 3.0, calibration)["status"] == cal.NO_PREDICTION


# --------------------------------------------------------------------------- the default: both intervals, labelled


def _without_calibration(result: dict) -> dict:
    """The result less what calibration adds (the calibrated intervals, and the point that decides beside the law's)."""
    out = {k: v for k, v in result.items() if k not in ("calibration", "interval_coverage", "best_point")}
    for key in ("budgets", "rows"):
        if key in out:
            out[key] = [
                {k: v for k, v in b.items() if k not in ("calibrated", "best_point", "loss_is")}
                if isinstance(b, dict)
                else b
                for b in out[key]
            ]
    return out


def test_default_prints_and_writes_the_calibrated_interval_beside_the_laws(tmp_path: Path, capsys) -> None:
    result, err, _ = _backtest(tmp_path, capsys, *CASES["llama3_exp_vpnls_holdout3"])
    # Everything the backtest wrote before is there unchanged: the point and interval are the law's own.
    golden = json.loads((GOLDEN / "llama3_exp_vpnls_holdout3.out.json").read_text())
    assert _without_calibration(result) == golden
    top = result["train_budgets"][-1]
    for b in result["budgets"]:
        c = b["calibrated"]
        assert c["applied"] and c["method"] == "vpnls" and c["factor"] == pytest.approx(b["budget"] / top)
        assert c["uncalibrated_loss"] == b["predicted_loss"] and c["uncalibrated_interval_90"] == b["loss_interval_90"]
        assert c["covered_90"] == (c["loss_90"][0] <= b["observed_best_loss"] <= c["loss_90"][1])
        assert f"budget {b['budget']:.3g} ({b['budget'] / top:.3g}x the largest fitted budget {top:.3g})" in err
    assert result["calibration"]["applied"] and result["calibration"]["source_check"]["verified"]
    assert result["calibration"]["table_is_calibration_source"] is True and "in-sample" in err
    counts = result["interval_coverage"]["vpnls"]
    assert counts["held_out"] == 3
    assert counts["uncalibrated_90"] == {"with_interval": 3, "covered": sum(b["covered_90"] for b in result["budgets"])}
    assert counts["calibrated_90"]["with_interval"] == 3
    assert counts["calibrated_90"]["covered"] == sum(b["calibrated"]["covered_90"] for b in result["budgets"])
    assert err.count("law's own 90% (uncalibrated): [") == 3 and err.count("calibrated 90% [") == 3
    assert "(centre " in err and "vpnls calibration at 3x" in err
    assert f"law's own interval (uncalibrated) covered {counts['uncalibrated_90']['covered']} of 3" in err


def test_beyond_the_calibrated_limit_prints_the_laws_interval_uncalibrated(tmp_path: Path, capsys) -> None:
    result, err, _ = _backtest(tmp_path, capsys, *CHINCHILLA_CUT)
    assert _without_calibration(result) == json.loads((GOLDEN / "chinchilla_isoflop_cut3e19.out.json").read_text())
    status = {round(b["calibrated"]["factor"]): b["calibrated"]["status"] for b in result["budgets"]}
    assert status == {
        3: "calibrated",
        6: "calibrated",
        30: "calibrated",
        60: "beyond_calibrated_range",
        100: "beyond_calibrated_range",
    }
    for factor in (60, 100):
        line = next(line for line in err.splitlines() if f"({factor}x the largest fitted budget" in line)
        block = err[err.index(line) :].splitlines()[:3]
        assert block[1].startswith("  law's own 90% (uncalibrated): [")
        assert "calibrated 90%: none" in block[2] and "uncalibrated" in block[2]
        assert f"{factor}x is beyond isoflop's furthest calibrated factor (max_calibrated_factor 33.33x)" in block[2]
    far = result["budgets"][-1]["calibrated"]
    assert far["max_calibrated_factor"] == pytest.approx(100 / 3) and "loss_90" not in far and far["covered_90"] is None
    counts = result["interval_coverage"]["isoflop"]
    assert counts["held_out"] == 5 and counts["calibrated_90"]["with_interval"] == 3
    assert counts["calibrated_90"]["not_calibrated"] == {"beyond_calibrated_range": 2}
    assert "2 beyond the calibrated range" in err


def test_a_method_without_a_calibration_entry_keeps_its_own_interval(tmp_path: Path, capsys) -> None:
    result, err, _ = _backtest(tmp_path, capsys, *CASES["llama3_exp_envelope_holdout2"])
    for b in result["budgets"]:
        assert b["calibrated"]["status"] == "no_calibration_entry" and b["loss_interval_90"] is not None
    assert (
        err.count(
            "calibrated 90%: none; the law's own interval stands, uncalibrated: no calibration entry for "
            "the envelope fit by approach1"
        )
        == 2
    )
    assert result["interval_coverage"]["envelope"]["calibrated_90"] == {
        "with_interval": 0,
        "covered": 0,
        "not_calibrated": {"no_calibration_entry": 2},
    }


def test_all_holdouts_counts_both_intervals_per_method(tmp_path: Path, capsys) -> None:
    result, err, _ = _backtest(tmp_path, capsys, *CASES["llama3_exp_all_holdouts"])
    assert _without_calibration(result) == json.loads((GOLDEN / "llama3_exp_all_holdouts.out.json").read_text())
    for method in ("isoflop", "vpnls", "envelope"):
        rows = [r for r in result["rows"] if r["method"] == method]
        counts = result["interval_coverage"][method]
        assert counts["held_out"] == len(rows) == 15
        assert counts["uncalibrated_90"]["covered"] == sum(bool(r["covered_90"]) for r in rows)
        assert counts["calibrated_90"]["covered"] == sum(bool(r["calibrated"]["covered_90"]) for r in rows)
        assert f"  {method}: 90% coverage of 15 held-out point(s)" in err
    assert result["interval_coverage"]["envelope"]["calibrated_90"]["with_interval"] == 0
    assert result["interval_coverage"]["isoflop"]["calibrated_90"]["with_interval"] == 15


def test_another_calibration_file(tmp_path: Path, capsys) -> None:
    def tighter_limit(data: dict) -> None:
        data["methods"]["isoflop"]["max_factor"] = 5.0

    path = _calibration_copy(tmp_path, tighter_limit)
    result, err, _ = _backtest(tmp_path, capsys, *CHINCHILLA_CUT, "--calibration", path)
    assert result["calibration"]["path"] == str(path)
    assert result["calibration"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    status = [b["calibrated"]["status"] for b in result["budgets"]]
    assert status == ["calibrated"] + ["beyond_calibrated_range"] * 4
    assert "6x is beyond isoflop's furthest calibrated factor (max_calibrated_factor 5x)" in err


def test_source_data_not_in_this_checkout_is_reported_unchecked(tmp_path: Path, capsys) -> None:
    def elsewhere(data: dict) -> None:
        data["inputs"] = {"somewhere/else.csv": "0" * 64}

    path = _calibration_copy(tmp_path, elsewhere)
    result, err, _ = _backtest(tmp_path, capsys, *CHINCHILLA_CUT, "--calibration", path)
    assert result["calibration"]["source_check"] == {
        "inputs": [
            {"path": "somewhere/else.csv", "sha256": "0" * 64, "verified": False, "note": "not found here; not checked"}
        ],
        "verified": False,
    }
    assert "not found here, not checked" in err and result["calibration"]["table_is_calibration_source"] is False


# --------------------------------------------------------------------------- --no-calibration: the old output, byte for byte


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_calibration_is_the_output_of_before(name: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bt.json"
    code, stdout, err = _run(
        ["fit", "backtest", ISOFLOPS, *CASES[name], "--no-calibration", "--json", "--out", out], capsys
    )
    assert code == 0, err
    assert out.read_bytes() == (GOLDEN / f"{name}.out.json").read_bytes()
    assert stdout == (GOLDEN / f"{name}.stdout.json").read_text()
    assert err == (GOLDEN / f"{name}.stderr.txt").read_text()


# --------------------------------------------------------------------------- bad input: exit 2, one line, nothing written


def _schema(data: dict) -> None:
    data["schema_version"] += 1


def _kind(data: dict) -> None:
    data["kind"] = "something_else"


def _recorded_hash(data: dict) -> None:
    data["inputs"] = {name: "f" * 64 for name in data["inputs"]}


def _no_inputs(data: dict) -> None:
    del data["inputs"]


def _not_a_hash(data: dict) -> None:
    data["inputs"] = {name: "b04d6112" for name in data["inputs"]}


def _not_a_number(data: dict) -> None:
    data["methods"]["isoflop"]["max_factor"] = "far"


BAD_CALIBRATIONS = {
    "schema": (_schema, "schema_version"),
    "kind": (_kind, "'kind'"),
    "recorded hash": (_recorded_hash, "source hash mismatch"),
    "no inputs": (_no_inputs, "'inputs'"),
    "not a sha256": (_not_a_hash, "not a sha256"),
    "not a number": (_not_a_number, "methods.isoflop.max_factor"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALIBRATIONS))
@pytest.mark.parametrize("mode", [[], ["--all-holdouts"], ["--beyond"]], ids=["default", "all-holdouts", "beyond"])
def test_a_bad_calibration_file_is_refused_before_any_fit(case: str, mode: list, tmp_path: Path, capsys) -> None:
    change, name = BAD_CALIBRATIONS[case]
    path = _calibration_copy(tmp_path, change)
    out = tmp_path / "bt.json"
    code, stdout, err = _run(
        [
            "fit",
            "backtest",
            ISOFLOPS,
            "--query",
            CHINCHILLA,
            "--method",
            "isoflop",
            *mode,
            "--calibration",
            path,
            "--out",
            out,
        ],
        capsys,
    )
    _refused(code, err, name)
    assert str(path) in err and not out.exists() and stdout == ""
    assert "budget" not in err  # no fit ran


def test_source_data_with_other_bytes_is_refused(tmp_path: Path, capsys) -> None:
    changed = tmp_path / "isoflops.csv"
    changed.write_bytes(ISOFLOPS.read_bytes() + b"\n")
    recorded = hashlib.sha256(ISOFLOPS.read_bytes()).hexdigest()
    path = _calibration_copy(tmp_path, lambda data: data.update(inputs={str(changed): recorded}))
    out = tmp_path / "bt.json"
    code, _, err = _run(["fit", "backtest", ISOFLOPS, *CHINCHILLA_CUT, "--calibration", path, "--out", out], capsys)
    _refused(code, err, "source hash mismatch")
    assert str(changed) in err and recorded[:12] in err and not out.exists()


@pytest.mark.parametrize(
    "argv, name",
    [
        (["--no-calibration", "--calibration", "{cal}"], "--no-calibration"),
        (["--calibration", "{missing}"], "not found"),
        (["--loso"], "--loso goes with --beyond"),
        (["--probes", "1", "--calibration", "{cal}"], "--calibration goes with"),
    ],
    ids=["both", "missing file", "loso", "probes"],
)
def test_conflicting_flags_are_refused(argv: list, name: str, tmp_path: Path, capsys) -> None:
    good = _calibration_copy(tmp_path, lambda data: None)
    argv = [a.format(cal=good, missing=tmp_path / "missing.json") for a in argv]
    out = tmp_path / "bt.json"
    code, _, err = _run(
        ["fit", "backtest", ISOFLOPS, "--query", CHINCHILLA, "--method", "isoflop", *argv, "--out", out], capsys
    )
    _refused(code, err, name)
    assert not out.exists()


def test_predict_shows_the_calibrated_interval_beside_the_laws_own(tmp_path, capsys):
    """Issue 43: `predict` beyond the fitted budgets prints both intervals; the point stays the law's."""
    fit = tmp_path / "fit.json"
    code, _, _ = _run(["fit", "vpnls", ISOFLOPS, "--query", LLAMA, "--bootstrap", "20", "--out", str(fit)], capsys)
    assert code == 0
    code, stdout, err = _run(["predict", str(fit), "--compute", "1e22", "--json"], capsys)
    assert code == 0 and "law's own 90% (uncalibrated)" in err and "calibrated 90% [" in err
    result = json.loads(stdout)
    assert result["calibrated"]["applied"] and result["calibrated"]["uncalibrated_loss"] == result["loss"]
    code, stdout, err = _run(["predict", str(fit), "--compute", "1e22", "--json", "--no-calibration"], capsys)
    assert code == 0 and "calibrated" not in json.loads(stdout) and "calibrated" not in err
    code, _, err = _run(
        ["predict", str(fit), "--compute", "1e22", "--no-calibration", "--calibration", str(fit)], capsys
    )
    assert code == 2 and "contradict" in err
