"""The point the evidence supports (delphi.fits.best_point): the calibrated centre decides on tables
like the calibration's public sources, the law's own on Delphi's ladders and on tables the source
check flags as unlike them; `predict` prints the deciding point first, the law's own beside it, a
parameter on a bound, and whether the seal's cross-check laws agree; `fit backtest` labels its
top-level point and interval as the law's own.

Data: the public isoFLOP table tests/data/isoflops.csv (tests/data/README.md) and the committed
calibration delphi/fits/data/beyond_calibration.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delphi.cli import main
from delphi.fits import best_point as bp
from delphi.fits import calibration as cal
from delphi.fits import calibration_file, method_choice

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
LLAMA = "experiment == 'llama_3__exp_loss' and not outlier"
DCLM = "source == 'marin_202603' and dataset == 'dclm' and not outlier"


def _evidence(**change) -> bp.PointEvidence:
    base = dict(delphi_ladder=False, calibration_status=cal.CALIBRATED, source_distance=0.1, source_reach=2.0)
    return bp.PointEvidence(**(base | change))


def test_decide_point_follows_the_evidence() -> None:
    assert bp.decide_point(_evidence()).decides == bp.CALIBRATED
    ladder = bp.decide_point(_evidence(delphi_ladder=True))
    assert ladder.decides == bp.LAW and "+3.57%" in ladder.why and "+2.07%" in ladder.why
    unlike = bp.decide_point(_evidence(source_distance=3.5))
    assert unlike.decides == bp.LAW and "unlike the calibration's sources" in unlike.why and "3.50" in unlike.why
    beyond = bp.decide_point(_evidence(calibration_status=cal.BEYOND_RANGE, calibration_reason="60x is beyond"))
    assert beyond.decides == bp.LAW and "60x is beyond" in beyond.why
    assert bp.decide_point(_evidence(calibration_status=None)).decides == bp.LAW
    assert "does not record" in bp.decide_point(_evidence(delphi_ladder=None)).why
    assert (
        bp.decide_point(_evidence(corrected_by=bp.POINT_CORRECTION, delphi_ladder=True)).decides == bp.POINT_CORRECTION
    )
    assert bp.decide_point(_evidence(corrected_by=bp.PROBE_CORRECTION)).decides == bp.PROBE_CORRECTION


def test_the_source_check_reaches_as_far_as_the_calibration_was_tested() -> None:
    calibration = calibration_file.load_calibration()
    like = method_choice.source_likeness(calibration["sources"]["llama_3/llama_3/exp_loss"], calibration)
    assert like["like"] and like["distance"] == pytest.approx(0, abs=1e-5)
    assert like["reach"] == pytest.approx(2.37, abs=0.01)  # misfitting, scored leave-one-source-out, from Llama 3
    byte_ladder = {"log10_median_params": 5.0, "n_budgets": 4, "min_budget": 1e11, "max_budget": 1e13}
    assert not method_choice.source_likeness(byte_ladder, calibration)["like"]


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fits")
    out = {}
    for name, query in (("llama", LLAMA), ("dclm", DCLM)):
        out[name] = root / f"{name}.json"
        assert main(["fit", "vpnls", str(ISOFLOPS), "--query", query, "--out", str(out[name])]) == 0
    return out


def _predict(capsys, *argv) -> tuple[dict, str]:
    assert main(["predict", *map(str, argv), "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_predict_prints_the_deciding_point_first_and_the_law_beside_it(fits, capsys) -> None:
    result, err = _predict(capsys, fits["llama"], "--compute", "1e22")
    point = result["point"]
    assert point["decides"] == "calibrated" and point["loss"] == pytest.approx(result["calibrated"]["loss"])
    assert result["loss"] > point["loss"] and "law's own point" in result["loss_is"]  # loss stays the law's
    first = err.splitlines()[0]
    assert (
        first.startswith(f"point: {point['loss']:.4f}, the calibrated centre")
        and f"the law's own point {result['loss']:.4f}" in first
    )
    assert result["laws"]["disagree"] is False and "the laws agree within the 1.00% tolerance" in err


def test_predict_says_when_the_laws_disagree(fits, capsys) -> None:
    """Marin's dclm at 10x: VPNLS and the isoFLOP law 6.9% apart at their own points, 3.5% at their
    calibrated centres."""
    result, err = _predict(capsys, fits["dclm"], "--compute", "3e21")
    laws = result["laws"]
    assert laws["disagree"] and laws["laws"]["isoflop"]["rel"] == pytest.approx(-0.035, abs=0.005)
    assert laws["laws"]["isoflop"]["law_rel"] == pytest.approx(-0.069, abs=0.005)
    assert any("DISAGREE" in w for w in result["warnings"]) and "the laws DISAGREE beyond the 1.00% tolerance" in err
    result, _ = _predict(capsys, fits["dclm"], "--compute", "3e21", "--tolerance", "0.05")
    assert not result["laws"]["disagree"]


def test_predict_without_the_table_or_its_record(fits, tmp_path, capsys) -> None:
    data = json.loads(fits["llama"].read_text())
    data["diagnostics"].pop("table")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    result, err = _predict(capsys, old, "--compute", "1e22")
    assert result["point"]["decides"] == "law" and "does not record what table" in result["point"]["why"]
    assert result["laws"] == {
        "compared": False,
        "why": f"{old} does not record its table's reading; give --results TABLE",
    }
    # Given the table, the laws are compared at their own points (no calibrated centre decides here).
    result, _ = _predict(capsys, old, "--compute", "1e22", "--results", ISOFLOPS, "--query", LLAMA)
    assert (
        result["laws"]["laws"]["isoflop"]["rel"] == pytest.approx(-0.044, abs=0.005)
        and "law_loss" not in result["laws"]["laws"]["isoflop"]
    )
    moved = dict(
        data,
        diagnostics=data["diagnostics"] | {"table": {"ladder_records": False, "columns": {}}, "source": "gone.csv"},
    )
    old.write_text(json.dumps(moved))
    result, _ = _predict(capsys, old, "--compute", "1e22")
    assert "gone.csv is not here" in result["laws"]["why"]


def test_predict_refuses_a_mapping_without_a_table(fits, capsys) -> None:
    try:
        code = main(["predict", str(fits["llama"]), "--compute", "1e22", "--query", LLAMA])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "give --results TABLE" in err and len([l for l in err.splitlines() if "error" in l]) == 1


def test_backtest_labels_the_law_point_and_adds_the_deciding_one(tmp_path, capsys) -> None:
    out = tmp_path / "bt.json"
    assert (
        main(
            [
                "fit",
                "backtest",
                str(ISOFLOPS),
                "--query",
                LLAMA,
                "--method",
                "vpnls",
                "--holdout",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    for b in result["budgets"]:
        assert "law's own point" in b["loss_is"] and b["best_point"]["decides"] == "calibrated"
        assert b["best_point"]["loss"] == pytest.approx(b["calibrated"]["loss"])
    best = result["best_point"]
    assert best["decides"] == "calibrated" and best["mean_abs_rel_error"] < best["law_mean_abs_rel_error"]
    assert "the point that decides: the calibrated centre" in capsys.readouterr().err
