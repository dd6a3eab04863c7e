"""Results tables, Approach 1/2, frontier, MoE law, bootstrap, backtest, JSON and CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.fits import (
    backtest,
    fit_approach1,
    fit_approach2,
    fit_frontier,
    fit_moe,
    fit_vpnls,
    load_fit,
    load_results,
)
from delphi.fits.bootstrap import bootstrap, resample_indices
from delphi.fits.data import TableOptions
from delphi.fits.laws import chinchilla_optimum

REFERENCE = Path(__file__).resolve().parent / "data"  # copies of the public reference tables (tests/data/README.md)
TRUTH = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al. 2022, rounded


def isoflop_design(
    truth: dict[str, float], budgets=(1e18, 1e19, 1e20, 1e21), half_width=1.0, points=9, drift=0.0
) -> pd.DataFrame:
    """Noise-free isoFLOP curves sampled symmetrically in log N about the true optimum."""
    rows = []
    for i, c in enumerate(budgets):
        n_star = chinchilla_optimum(truth, c)["params"]
        for u in np.linspace(-half_width, half_width, points):
            n = n_star * 10 ** (u + drift * i)
            d = c / (6 * n)
            loss = truth["E"] + truth["A"] * n ** -truth["alpha"] + truth["B"] * d ** -truth["beta"]
            rows.append({"params": n, "tokens": d, "flops": c, "budget": c, "loss": loss, "run_id": f"r{len(rows)}"})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- tables
def test_load_results_maps_columns_and_derives_tokens(tmp_path):
    df = pd.DataFrame({"N": [1e6, 2e6, 4e6], "C": [6e15, 6e15, 6e15], "L": [3.0, 2.9, 3.1]})
    table = load_results(df, TableOptions(columns=(("params", "N"), ("flops", "C"), ("loss", "L"))))
    np.testing.assert_allclose(table["tokens"], df["C"] / (6 * df["N"]))
    assert (table["budget"] == 6e15).all() and table.attrs["budget_derived"]


@pytest.mark.parametrize("bad", [np.nan, np.inf, "abc"])
def test_invalid_loss_is_an_error_naming_the_row_unless_dropped(tmp_path, bad):
    df = isoflop_design(TRUTH).astype({"loss": object})
    df.loc[3, "loss"] = bad
    path = tmp_path / "r.csv"
    df.to_csv(path, index=False)
    with pytest.raises(DelphiError, match=r"row 3 .*--drop-invalid"):
        load_results(path)
    lines: list[str] = []
    table = load_results(path, TableOptions(drop_invalid=True), warn=lines.append)
    assert len(table) == len(df) - 1 and table.attrs["dropped"] == {"nan_or_inf": 1}
    assert any("row 3" in line for line in lines) and len(table.attrs["sha256"]) == 64


def test_all_losses_equal_is_degenerate():
    df = isoflop_design(TRUTH).assign(loss=2.5)
    with pytest.raises(DelphiError, match="all .* losses are equal"):
        load_results(df)


def test_derive_budget_groups_scattered_flops():
    epoch = REFERENCE / "isoflops.csv"
    if not epoch.is_file():
        pytest.skip("reference data not found")
    raw = pd.read_csv(epoch).query("experiment == 'llama_3__raw_loss'")
    derived = load_results(raw.drop(columns=["budget"]).assign(flops=6 * raw.params * raw.tokens))
    assert derived["budget"].nunique() == raw["budget"].nunique()


@pytest.mark.parametrize(
    "frame, message",
    [
        (pd.DataFrame({"params": [], "tokens": [], "loss": []}), "no rows"),
        (pd.DataFrame({"params": [1e6, 2e6], "loss": [3.0, 2.0]}), "tokens"),
        (pd.DataFrame({"params": [1e6, 2e6], "tokens": [1e9, 1e9], "loss": [3.0, -1.0]}), "loss = -1.0"),
    ],
)
def test_bad_tables(frame, message):
    with pytest.raises(DelphiError, match=message):
        load_results(frame)


# ----------------------------------------------------------------------------- Approach 1 / 2
def test_approach2_recovers_exponents_and_shows_intercept_bias():
    """alpha > beta: the parabola vertex overestimates N* by a constant factor; a is exact."""
    a_true = TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])
    fit = fit_approach2(load_results(isoflop_design(TRUTH)))
    assert fit.params["a"] == pytest.approx(a_true, abs=1e-6)
    assert fit.params["b"] == pytest.approx(1 - a_true, abs=1e-6)
    n_true = chinchilla_optimum(TRUTH, 1e20)["params"]
    n_fit = fit.predict(compute=1e20)["params"]
    assert n_fit / n_true > 1.01  # biased up, as the sign of alpha - beta predicts
    # and the sign flips when beta > alpha
    swapped = dict(TRUTH, alpha=TRUTH["beta"], beta=TRUTH["alpha"])
    fit_s = fit_approach2(load_results(isoflop_design(swapped)))
    assert fit_s.predict(compute=1e20)["params"] / chinchilla_optimum(swapped, 1e20)["params"] < 0.99
    # equal exponents: no bias
    equal = dict(TRUTH, beta=TRUTH["alpha"])
    fit_e = fit_approach2(load_results(isoflop_design(equal)))
    assert fit_e.predict(compute=1e20)["params"] / chinchilla_optimum(equal, 1e20)["params"] == pytest.approx(
        1, abs=1e-6
    )


def test_approach2_drifting_grid_biases_exponent():
    fit = fit_approach2(load_results(isoflop_design(TRUTH, drift=0.15)))
    assert abs(fit.params["a"] - TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])) > 1e-3


def test_approach2_per_budget_optima_and_intervals():
    fit = fit_approach2(load_results(isoflop_design(TRUTH)))
    data = fit.to_json()
    assert len(data["optima"]) == 4 and {"params_opt", "tokens_opt", "loss_opt", "loss_opt_se"} <= set(
        data["optima"][0]
    )
    lo, hi = fit.intervals["a"]
    assert lo <= fit.params["a"] <= hi


def test_approach2_curvature_prices_a_run_off_its_optimum():
    """The parabolas' curvature, a power law in C, gives what a run 2-3x off N* pays over the
    optimum at a budget inside the ladder and at 10x past it (Chinchilla truth, half-width 0.5 dex);
    the JSON round trip keeps it. Without the law (an older fit file) the run gets L*(C) alone."""
    fit = fit_approach2(load_results(isoflop_design(TRUTH, half_width=0.5)))
    again = load_fit_json(fit.to_json())
    truth = lambda n, d: TRUTH["E"] + TRUTH["A"] * n ** -TRUTH["alpha"] + TRUTH["B"] * d ** -TRUTH["beta"]  # noqa: E731
    for compute in (1e20, 1e22):
        n_fit = fit.predict(compute=compute)["params"]
        at_optimum = truth(n_fit, compute / (6 * n_fit))
        for k in (2.0, 3.0):
            n = k * n_fit
            run = again.predict_run(params=n, tokens=compute / (6 * n), flops=compute)
            true_excess = truth(n, compute / (6 * n)) - at_optimum
            assert run["off_optimum_penalty"] == pytest.approx(true_excess, rel=0.05), (compute, k)
            assert "curvature" in run["how"]
    # Many runs at once (the study's residual figure): the same as one by one.
    n = n_fit * np.array([0.5, 1.0, 2.0, 3.0])
    many = again.predict_run(params=n, tokens=1e22 / (6 * n), flops=np.full(4, 1e22))
    one_by_one = [again.predict_run(params=v, tokens=1e22 / (6 * v), flops=1e22)["loss"] for v in n]
    assert np.asarray(many["loss"]) == pytest.approx(one_by_one)
    old = load_fit_json({k: v for k, v in fit.to_json().items() if k != "curvature_law"})
    run = old.predict_run(params=3 * n_fit, tokens=1e22 / (18 * n_fit), flops=1e22)
    assert "off_optimum_penalty" not in run and run["loss"] == pytest.approx(fit.predict(compute=1e22)["loss"])


def load_fit_json(data: dict):
    from delphi.fits.results import fit_from_json

    return fit_from_json(json.loads(json.dumps(data)))


@pytest.mark.parametrize("method", ["approach2", "vpnls"])
def test_every_isoflops_source_fits(method):
    path = REFERENCE / "isoflops.csv"
    if not path.is_file():
        pytest.skip("reference data not found")
    raw = pd.read_csv(path)
    for experiment, rows in raw.groupby("experiment"):
        for subset in (rows, rows[~rows["outlier"]]):
            table = load_results(subset)
            fit = fit_approach2(table) if method == "approach2" else fit_vpnls(table)
            a = fit.params["a"] if method == "approach2" else fit.derived["a"]
            assert 0.3 < a < 0.7, (experiment, a)


def test_approach1_envelope():
    df = isoflop_design(TRUTH)
    fit = fit_approach1(load_results(df))
    assert fit.kind == "envelope" and fit.diagnostics.n_envelope_points >= 3
    losses = [p["loss"] for p in fit.extra.frontier_points]
    assert all(np.diff(losses) < 0)


# ----------------------------------------------------------------------------- frontier
def frontier_table(E=1.5, A=40.0, gamma=0.08, noise=0.0) -> pd.DataFrame:
    budgets = np.geomspace(1e17, 1e21, 7)
    wiggle = noise * np.sin(2.3 * np.arange(7))  # deterministic "noise"
    rows = [
        {
            "params": 1e7 * (i + 1),
            "tokens": c / 6e7 / (i + 1),
            "flops": c,
            "budget": c,
            "loss": (E + A * c**-gamma) * (1 + wiggle[i]),
        }
        for i, c in enumerate(budgets)
    ]
    return load_results(pd.DataFrame(rows))


def test_frontier_free_fixed_profile():
    table = frontier_table()
    free = fit_frontier(table)
    assert free.params["E"] == pytest.approx(1.5, rel=1e-5) and free.params["gamma"] == pytest.approx(0.08, rel=1e-4)
    fixed = fit_frontier(table, E=1.0)
    assert fixed.params["E"] == 1.0 and fixed.diagnostics.rss > free.diagnostics.rss
    prof = fit_frontier(table, E="profile", target_compute=[1e23])
    assert prof.params["E"] == pytest.approx(1.5, rel=1e-4)
    assert prof.predict(compute=1e23)["loss"] == pytest.approx(1.5 + 40 * 1e23**-0.08, rel=1e-4)
    noisy = fit_frontier(frontier_table(noise=0.002), E="profile", target_compute=[1e23])
    lo, hi = noisy.intervals["E"]
    assert lo < noisy.params["E"] < hi and hi - lo > 0.01
    sens = noisy.extra.sensitivity
    # a higher floor predicts a higher loss far out: the prediction depends on E and says so
    assert sens["dloss_dE"][0] > 0
    low, high = sens["predicted_loss_range_over_E_interval"][0]
    assert low < sens["predicted_loss"][0] < high


def test_frontier_needs_three_budgets():
    with pytest.raises(DelphiError, match="need at least 3"):
        fit_frontier(load_results(frontier_table().iloc[:2]))


# ----------------------------------------------------------------------------- MoE
def test_moe_granularity_law_recovery():
    truth = {"E": 1.7, "G": 150.0, "gamma": 0.5, "A": 300.0, "B": 400.0, "alpha": 0.33, "beta": 0.3}
    n, d, g = (
        a.ravel()
        for a in np.meshgrid(np.geomspace(1e7, 1e10, 6), np.geomspace(1e9, 1e12, 6), [1.0, 2.0, 4.0, 8.0, 16.0])
    )
    loss = (
        truth["E"]
        + (truth["G"] * g ** -truth["gamma"] + truth["A"]) * n ** -truth["alpha"]
        + truth["B"] * d ** -truth["beta"]
    )
    fit = fit_moe(load_results(pd.DataFrame({"params": n, "tokens": d, "granularity": g, "loss": loss})))
    for k, v in truth.items():
        assert fit.params[k] == pytest.approx(v, rel=1e-3), k
    finer = fit.predict(compute=1e21, granularity=16)["loss"]
    assert finer < fit.predict(compute=1e21, granularity=1)["loss"]
    with pytest.raises(DelphiError, match="granularity"):
        fit.predict(compute=1e21)


# ----------------------------------------------------------------------------- bootstrap
def test_clustered_resampling_keeps_runs_whole():
    df = pd.DataFrame({"run_id": np.repeat(["a", "b", "c", "d"], 3), "x": np.arange(12)})
    for idx in resample_indices(df, 20, seed=0):
        counts = df.iloc[idx].groupby("run_id").size()
        assert set(counts % 3) == {0}  # whole runs only


def test_bootstrap_parallel_matches_serial():
    table = load_results(isoflop_design(TRUTH))
    serial, _ = bootstrap(_toy_refit, table, 50, seed=7, workers=1)
    parallel, info = bootstrap(_toy_refit, table, 50, seed=7, workers=2)
    assert info["bootstrap_workers"] == 2 and serial == parallel


def _toy_refit(table: pd.DataFrame) -> dict[str, float]:
    return {"mean_loss": float(table["loss"].mean())}


# ----------------------------------------------------------------------------- backtest
def test_backtest_on_exact_law_has_tiny_error():
    table = load_results(isoflop_design(TRUTH, budgets=(1e17, 1e18, 1e19, 1e20, 1e21)))
    result = backtest(table, fit_vpnls, holdout=1)
    assert result["cut"] == 1e21 and result["train_budgets"][-1] == 1e20
    assert abs(result["budgets"][0]["rel_error"]) < 0.01
    assert result["runs_mean_abs_rel_error"] < 1e-6


# ----------------------------------------------------------------------------- JSON + CLI
def test_json_round_trip_keeps_intervals(tmp_path):
    table = load_results(isoflop_design(TRUTH))
    fit = fit_approach2(table, n_bootstrap=20, seed=1, workers=1)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit.to_json()))
    back = load_fit(path)
    assert back.params == fit.params and back.kind == "isoflop"
    assert back.predict(compute=1e22) == fit.predict(compute=1e22)
    data = fit.to_json()
    assert {
        "kind",
        "method",
        "params",
        "intervals",
        "diagnostics",
        "input_sha256",
        "n_points",
        "seed",
        "version",
    } <= set(data)


def test_cli_fit_and_predict(tmp_path, capsys):
    csv = tmp_path / "results.csv"
    isoflop_design(TRUTH).rename(columns={"params": "N"}).to_csv(csv, index=False)
    out = tmp_path / "fit.json"
    assert main(["fit", "vpnls", str(csv), "--params-col", "N", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["params"]["alpha"] == pytest.approx(TRUTH["alpha"], rel=1e-4)
    assert json.loads(out.read_text())["params"] == printed["params"]
    assert main(["predict", str(out), "--compute", "5.76e23", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["params"] == pytest.approx(chinchilla_optimum(TRUTH, 5.76e23)["params"], rel=1e-3)
    assert main(["predict", str(out), "--params", "1e9", "--tokens", "2e10", "--json"]) == 0
    assert "loss" in json.loads(capsys.readouterr().out)


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], Path]]:
    good = isoflop_design(TRUTH)
    cases = {
        "empty": "",
        "one_budget": good[good["budget"] == 1e19].to_csv(index=False),
        "missing_column": good.drop(columns=["loss"]).to_csv(index=False),
        "negative_loss": good.assign(loss=lambda d: d["loss"].where(d.index != 5, -2.0)).to_csv(index=False),
        "one_params": good.assign(params=1e8).to_csv(index=False),
    }
    paths = {}
    for name, text in cases.items():
        p = tmp_path / f"{name}.csv"
        p.write_text(text)
        paths[name] = p
    return paths


@pytest.mark.parametrize("method", ["isoflop", "vpnls"])
def test_cli_bad_inputs_exit_2_and_write_nothing(tmp_path, capsys, method):
    for name, path in _bad_inputs(tmp_path).items():
        out = tmp_path / f"{name}.json"
        code = main(["fit", method, str(path), "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2, (name, err)
        assert err.startswith("delphi: error:"), err
        assert not out.exists()
