"""Exact-FLOP allocation: the optimum under C = flops_per_token(N) D, families, conventions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from delphi.errors import DelphiError
from delphi.fits import fit_vpnls, load_results
from delphi.fits.allocation import FlopsFamily, optimal_allocation
from delphi.fits.isoflop import isoflop_exponent_by_convention
from delphi.fits.laws import chinchilla_loss, chinchilla_optimum
from delphi.fits.results import FitResult, fit_from_json

PAPER_RESULTS = Path(__file__).resolve().parents[1] / "paper" / "editions" / "v1" / "data" / "results.csv"
TRUTH = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al. 2022, rounded


def small_model_family() -> FlopsFamily:
    """fpt(N) far from 6N: attention and embedding FLOPs dominate small models (C/6ND ~ 5 at 1e3)."""
    n = np.geomspace(1e3, 1e9, 25)
    fpt = 6 * n + 2.4e5 * n**0.2
    return FlopsFamily(tuple(n), tuple(fpt), "nonembedding", "synthetic 6N + 2.4e5 N^0.2")


def test_exact_allocation_spends_the_budget_and_is_a_constrained_minimum():
    family = small_model_family()
    loss_fn = lambda n, d: chinchilla_loss(TRUTH, n, d)  # noqa: E731
    for compute in (1e11, 1e13, 1e16):
        out = optimal_allocation(loss_fn, compute, family)
        n, d, loss = float(out["params"]), float(out["tokens"]), float(out["loss"])
        assert out["allocation"] == "exact"
        assert abs(float(family(n)) * d / compute - 1) < 1e-6  # costs C exactly
        assert loss == pytest.approx(float(loss_fn(n, d)))
        for step in (1.001, 1.01, 1.1):  # neighbours on the constraint are no better
            for m in (n * step, n / step):
                assert float(loss_fn(m, compute / family(m))) >= loss - 1e-12
        # and the 6ND point, priced at the real FLOPs, is not the optimum: it costs more than C
        six = chinchilla_optimum(TRUTH, compute)
        assert float(family(six["params"]) * six["tokens"]) > 1.05 * compute


def test_without_family_matches_closed_form():
    loss_fn = lambda n, d: chinchilla_loss(TRUTH, n, d)  # noqa: E731
    c = np.array([1e19, 1e21, 5.76e23])
    out = optimal_allocation(loss_fn, c, None)
    ref = chinchilla_optimum(TRUTH, c)
    assert out["allocation"] == "6ND"
    np.testing.assert_allclose(out["params"], ref["params"], rtol=1e-5)  # a flat minimum: N* to ~sqrt(eps)
    np.testing.assert_allclose(out["loss"], ref["loss"], rtol=1e-12)


def test_no_interior_optimum_is_nan():
    # B = 0: loss falls with N forever; no allocation within any plausible D/N range
    out = optimal_allocation(
        lambda n, d: 2 + 400 * np.asarray(n) ** -0.3 + 0 * np.asarray(d), 1e20, small_model_family()
    )
    assert np.isnan(out["params"]) and np.isnan(out["loss"])


def test_family_interpolates_log_log_and_round_trips():
    fam = FlopsFamily((1e3, 1e4, 1e5), (1e4, 1e5, 2e6), "active", "test")
    assert float(fam(1e4)) == pytest.approx(1e5)
    assert float(fam(np.sqrt(1e3 * 1e4))) == pytest.approx(np.sqrt(1e4 * 1e5))
    assert float(fam(1e6)) == pytest.approx(2e6 * 20)  # end-segment slope (log 20 per decade) extrapolated
    assert FlopsFamily.from_json(fam.to_json()) == fam
    with pytest.raises(DelphiError, match="strictly increasing"):
        FlopsFamily((1e4, 1e3), (1.0, 2.0), "active", "bad")
    with pytest.raises(DelphiError, match="convention"):
        FlopsFamily((1e3, 1e4), (1.0, 2.0), "total", "bad")


def test_fit_result_predicts_with_its_family_and_serialises_it():
    fit = FitResult(kind="parametric", method="vpnls", params=dict(TRUTH))
    assert fit.predict(compute=1e13)["allocation"] == "6ND"
    exact = fit.with_family(small_model_family())
    pred = exact.predict(compute=1e13)
    assert pred["allocation"] == "exact"
    assert float(small_model_family()(pred["params"])) * pred["tokens"] == pytest.approx(1e13, rel=1e-6)
    back = fit_from_json(exact.to_json())
    assert back.family == exact.family and back.predict(compute=1e13)["params"] == pytest.approx(pred["params"])
    with pytest.raises(DelphiError, match="positive finite"):
        exact.predict(compute=-1.0)


@pytest.mark.skipif(not PAPER_RESULTS.is_file(), reason="paper ladder results not in this checkout")
def test_paper_ladder_conventions_and_family_from_table():
    raw = pd.read_csv(PAPER_RESULTS)
    exps = isoflop_exponent_by_convention(raw)
    # issue 10, measured on this table: a = 0.91 (non-embedding), 0.71 (active), 0.68 (fpt/6)
    assert exps["nonembedding"]["a"] == pytest.approx(0.91, abs=0.02)
    assert exps["active"]["a"] == pytest.approx(0.71, abs=0.02)
    assert exps["fpt6"]["a"] == pytest.approx(0.68, abs=0.02)
    for convention in ("nonembedding", "active", "fpt6"):
        table = load_results(PAPER_RESULTS, params_convention=convention)
        family = table.attrs["flops_family"]
        assert family.convention == convention
        np.testing.assert_allclose(family(table["params"]) * table["tokens"], table["flops"], rtol=1e-6)
    fpt6 = load_results(PAPER_RESULTS, params_convention="fpt6").attrs["flops_family"]
    np.testing.assert_allclose(fpt6(np.array([1e4, 1e7])), 6 * np.array([1e4, 1e7]), rtol=1e-9)


@pytest.mark.skipif(not PAPER_RESULTS.is_file(), reason="paper ladder results not in this checkout")
def test_family_file_beside_results_is_used_and_checked(tmp_path):
    import json

    table = pd.read_csv(PAPER_RESULTS)
    path = tmp_path / "results.csv"
    table.to_csv(path, index=False)
    fam = FlopsFamily.from_table(table, "nonembedding", source="ladder spec test")
    (tmp_path / "results.csv.family.json").write_text(json.dumps(fam.to_json()))
    lines: list[str] = []
    loaded = load_results(path, warn=lines.append)
    assert loaded.attrs["flops_family"] == fam and "results.csv.family.json" in lines[0]
    fit = fit_vpnls(loaded)
    assert fit.to_json()["allocation"] == "exact" and fit.to_json()["family"] == "moe"
    with pytest.raises(DelphiError, match="counts N as 'nonembedding'"):
        load_results(
            path, family=fam.__class__(fam.params, fam.flops_per_token, "nonembedding", "x"), params_convention="active"
        )
