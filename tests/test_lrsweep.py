"""`delphi mup lr-sweep`: the quadratic-in-log-LR fit on known data, a micro sweep through the real
trainer (files, resume), and bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from delphi.cli import main
from delphi.experiments.lrsweep import LRSweepResult
from delphi.experiments.lrsweep_spec import LRSweepSpec
from delphi.fits.lr_optimum import fit_quadratic

LRS = np.array([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2])


def test_quadratic_fit_recovers_a_known_optimum():
    lr_true, curvature = 9e-3, 0.04
    exact = 2.0 + curvature * (np.log2(LRS) - math.log2(lr_true)) ** 2
    fit = fit_quadratic(LRS, exact)
    assert fit.lr_opt == pytest.approx(lr_true, rel=1e-9)
    assert fit.loss_opt == pytest.approx(2.0, abs=1e-12)
    assert fit.interior and fit.best_lr == 8e-3
    assert len(fit.lrs) == 5  # the best point and two neighbours each side

    noise = np.array([0.004, -0.003, 0.002, -0.004, 0.003, -0.002, 0.001])
    noisy = fit_quadratic(LRS, exact + noise)
    assert noisy.lr_opt == pytest.approx(lr_true, rel=0.15)
    lo, hi = noisy.lr_opt_interval_90
    assert lo < lr_true < hi and lo < noisy.lr_opt < hi and hi / lo < 3

    # A diverged run (NaN) and a blow-up far past the optimum do not drag the fit away.
    wild = exact.copy()
    wild[-1] = np.nan
    wild[0] = 50.0
    assert fit_quadratic(LRS, wild).lr_opt == pytest.approx(lr_true, rel=1e-6)

    # No minimum: a monotone (here concave-increasing) curve gives no optimum, only the best grid LR.
    concave = 2.0 + 0.1 * np.sqrt(np.log2(LRS) - math.log2(LRS[0]))
    no_min = fit_quadratic(LRS, concave)
    assert no_min.lr_opt is None and no_min.best_lr == LRS[0]
    # Three points fit exactly: an optimum but no interval (no residual degrees of freedom).
    three = fit_quadratic(LRS[2:5], exact[2:5])
    assert three.lr_opt == pytest.approx(lr_true, rel=1e-9) and three.lr_opt_interval_90 is None


def test_movement_across_widths():
    spec = LRSweepSpec(widths=(32, 64, 128), lrs=tuple(LRS))
    optima = {32: 8e-3, 64: 1.2e-2, 128: 1.6e-2}
    records = [
        {"width": w, "lr": lr, "loss": 2.0 + 0.05 * (math.log2(lr) - math.log2(optima[w])) ** 2}
        for w in spec.widths
        for lr in LRS
    ]
    result = LRSweepResult(spec=spec, records=records)
    assert result.optimum(64) == pytest.approx(1.2e-2)
    m = result.movement
    assert m["lr_opt_ratio_max_over_min"] == pytest.approx(2.0)
    assert m["lr_opt_slope_vs_width"] == pytest.approx(np.polyfit([5, 6, 7], np.log2(list(optima.values())), 1)[0])
    assert "moved 2.00x" in result.summary()


def micro_args(out: Path, store: Path, **changes: str) -> list[str]:
    flags = {
        "--widths": "16,32",
        "--lrs": "0.01,0.03,0.1",
        "--steps": "8",
        "--layers": "1",
        "--batch-size": "4",
        "--seq-len": "32",
        "--eval-tokens": "512",
        "--store": str(store),
        **changes,
    }
    return ["mup", "lr-sweep", "--out", str(out), *[x for kv in flags.items() for x in kv], "--json"]


def test_micro_sweep_files_and_resume(tmp_path, store, capsys):
    out = tmp_path / "sweep"
    assert main(micro_args(out, store)) == 0
    report = json.loads(capsys.readouterr().out)
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 6 and set(table["width"]) == {16, 32} and table["loss"].notna().all()
    assert (table["status"] == "completed").all()
    saved = json.loads((out / "sweep.json").read_text())
    assert set(saved["fits"]) == {"16", "32"} and saved["movement"]["lr_opt_ratio_max_over_min"] >= 1.0
    assert (out / "sweep.png").stat().st_size > 10_000 and (out / "sweep.svg").is_file()
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(table["run_id"])
    for run in (out / "runs").iterdir():
        assert json.loads((run / "summary.json").read_text())["steps"] == 8
    assert report["runs"] == saved["runs"]

    # A second call trains nothing and reports the same losses.
    assert main(micro_args(out, store)) == 0
    again = json.loads(capsys.readouterr().out)
    assert all(r["skipped"] for r in again["runs"])
    assert [r["loss"] for r in again["runs"]] == [r["loss"] for r in report["runs"]]


@pytest.mark.parametrize(
    "changes",
    [
        {"--widths": "32"},  # one width
        {"--widths": "64,32"},  # not increasing
        {"--widths": "16,24"},  # not a multiple of the head size
        {"--widths": "16,x"},
        {"--lrs": "0.01,0.1"},  # a quadratic needs three
        {"--lrs": "0.01,-0.1,0.2"},
        {"--steps": "0"},
        {"--store": "/no/such/store"},
        {"--seq-len": "100000"},  # a batch longer than the store's validation split
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, store, changes, capsys):
    out = tmp_path / "sweep"
    assert main(micro_args(out, store, **changes)) == 2
    assert "error" in capsys.readouterr().err
    assert not out.exists()


def test_existing_runs_with_other_settings_are_refused(tmp_path, store, capsys):
    out = tmp_path / "sweep"
    args = micro_args(out, store, **{"--widths": "16,32", "--lrs": "0.01,0.03,0.1", "--steps": "4"})
    run = out / "runs" / "w16-lr0.01"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 3\n")
    assert main(args) == 2
    assert "other settings" in capsys.readouterr().err
    assert list(out.iterdir()) == [out / "runs"] and list((out / "runs").iterdir()) == [run]
