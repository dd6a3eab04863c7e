"""A lab's prior on the irreducible loss E (delphi.fits.e_prior): every law with an E (frontier,
asymptotic, parametric, VPNLS) takes it pinned (--E NUMBER) or as a Gaussian prior (--E-prior MEAN,SD);
the fit records it with the law refitted with E free and at E -+ sd, and every forecast from it says
how much the prior decides.

Data: Marin's comma sweep in the public isoFLOP table tests/data/isoflops.csv (tests/data/README.md).
With its outliers dropped the asymptotic law's free E falls on its bound 0; with its top three budgets
held out, the frontier law with E free erred +2.30% on average (observed/predicted - 1: -2.24%), with E
pinned anywhere in 1.4-1.6 under 0.6%.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.fits import backtest, load_fit, load_results
from delphi.fits.calibration import calibration_key
from delphi.fits.data import TableOptions
from delphi.fits.e_prior import EPrior, forecast_at_refits, parse_prior, prior_of
from delphi.fits.frontier import fit_asymptotic, fit_frontier
from delphi.fits.parametric import fit_approach3, fit_vpnls
from delphi.prereg.measure import law_name, refit_options

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
COMMA = "source == 'marin_202603' and dataset == 'comma'"
FITTERS = {"frontier": fit_frontier, "asymptotic": fit_asymptotic, "parametric": fit_approach3, "vpnls": fit_vpnls}


@pytest.fixture(scope="module")
def comma():
    return load_results(ISOFLOPS, TableOptions(query=COMMA))


@pytest.mark.parametrize("law", sorted(FITTERS))
def test_every_law_with_an_E_takes_it_pinned_or_with_a_prior(comma, law) -> None:
    free = FITTERS[law](comma)
    pinned = FITTERS[law](comma, E_prior=EPrior(1.6))
    assert pinned.params["E"] == pytest.approx(1.6) and "E" not in pinned.diagnostics.at_bound
    record = pinned.extra.E_prior
    assert record["mode"] == "pinned" and record["refits"]["E_free"]["E"] == pytest.approx(free.params["E"])
    # A prior as wide as the data's own doubt leaves E where the data put it; a tight one pins it.
    wide = FITTERS[law](comma, E_prior=EPrior(1.6, 100.0))
    tight = FITTERS[law](comma, E_prior=EPrior(1.6, 1e-4))
    assert wide.params["E"] == pytest.approx(free.params["E"], abs=0.02)
    assert tight.params["E"] == pytest.approx(1.6, abs=1e-3)
    prior = FITTERS[law](comma, E_prior=EPrior(1.6, 0.1))
    assert set(prior.extra.E_prior["refits"]) == {"E_free", "E_minus_sd", "E_plus_sd"}
    assert prior.extra.E_prior["refits"]["E_minus_sd"]["E"] == pytest.approx(1.5)
    # The public calibration is of the laws with E free: a law under a lab's E has no entry, and the
    # gates refit it under the same prior.
    assert calibration_key(prior.kind, prior.method) is None and prior_of(prior) == EPrior(1.6, 0.1)
    assert refit_options(prior)["E_prior"] == EPrior(1.6, 0.1) and law_name(prior) == law
    # How much the prior decides, at 10x the largest budget: the forecast under each refit.
    decided = forecast_at_refits(prior, lambda f: f.predict(compute=3e21)["loss"])
    assert decided["loss"] == pytest.approx(prior.predict(compute=3e21)["loss"])
    assert decided["refits"]["E_free"]["loss"] == pytest.approx(free.predict(compute=3e21)["loss"], rel=1e-6)
    assert "E ~ Normal(1.6, sd 0.1)" in decided["text"] and "at E - sd" in decided["text"]


def test_the_prior_survives_the_fit_file_and_the_bootstrap(comma, tmp_path) -> None:
    fit = fit_vpnls(comma, E_prior=EPrior(1.6, 0.1), n_bootstrap=20, seed=0, workers=1)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit.to_json()))
    back = load_fit(path)
    assert back.method == "vpnls-E-prior" and prior_of(back) == EPrior(1.6, 0.1)
    assert back.extra.E_prior["refits"] == fit.extra.E_prior["refits"]
    draws = np.asarray(back.samples["E"])
    assert np.all(draws >= 0) and np.median(draws) == pytest.approx(fit.params["E"], rel=0.1)
    data = json.loads(path.read_text())
    data["E_prior"] = {"mode": "prior", "mean": 1.6, "sd": -1}
    path.write_text(json.dumps(data))
    with pytest.raises(DelphiError, match="sd = -1"):
        load_fit(path)


def test_the_asymptotic_law_on_its_bound_and_under_a_prior(tmp_path, capsys) -> None:
    """On comma without its outliers the asymptotic law puts E on its bound 0; `predict` says so. With
    the lab's prior (Marin's L_inf = 1.6 for its MoE laws, sd 0.1) E is off the bound, and the output
    says how much of the forecast the prior decides."""
    query = COMMA + " and not outlier"
    free, prior = tmp_path / "free.json", tmp_path / "prior.json"
    assert main(["fit", "asymptotic", str(ISOFLOPS), "--query", query, "--out", str(free)]) == 0
    assert load_fit(free).diagnostics.at_bound == ("E",)
    capsys.readouterr()
    assert main(["predict", str(free), "--compute", "3e21", "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert any("E = 0" in w and "bound" in w for w in result["warnings"]) and "warning: the frontier fit" in out.err
    assert (
        main(["fit", "asymptotic", str(ISOFLOPS), "--query", query, "--E-prior", "1.6,0.1", "--out", str(prior)]) == 0
    )
    err = capsys.readouterr().err
    fit = load_fit(prior)
    assert fit.method == "frontier-prior-weighted" and fit.status == "ok" and 1.4 < fit.params["E"] < 1.7
    assert "at C=3e+21 FLOPs: E ~ Normal(1.6, sd 0.1)" in err and "with E free (E = 0)" in err
    assert main(["predict", str(prior), "--compute", "3e21", "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["E_prior"]["refits"]["E_free"]["E"] == 0 and "E prior: E ~ Normal(1.6" in out.err
    assert not any("bound" in w for w in result["warnings"])


def test_pinning_E_reproduces_the_frontier_backtest_on_marins_comma_sweep(comma) -> None:
    """The top three budgets held out: E free misses by +2.30% on average (-2.24% as observed/predicted
    - 1), E pinned at 1.4, 1.5 or 1.6 by under 0.6% (measured here; the issue's MoE sweep, within 0.25%,
    is not in this repository)."""

    def mean_error(E):
        result = backtest(comma, partial(fit_frontier, E=E, with_sensitivity=False), holdout=3)
        return float(np.mean([b["rel_error"] for b in result["budgets"]]))

    assert mean_error("free") == pytest.approx(0.0230, abs=5e-4)
    for E in (1.4, 1.5, 1.6):
        assert 0 < mean_error(E) < 0.006


def test_backtest_takes_the_prior_for_every_law_with_an_E(tmp_path, capsys) -> None:
    out = tmp_path / "bt.json"
    code = main(
        [
            "fit",
            "backtest",
            str(ISOFLOPS),
            "--query",
            COMMA,
            "--method",
            "frontier",
            "--holdout",
            "3",
            "--E",
            "1.5",
            "--no-calibration",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert json.loads(out.read_text())["method"] == "frontier-fixed"
    code = main(
        [
            "fit",
            "backtest",
            str(ISOFLOPS),
            "--query",
            COMMA,
            "--method",
            "vpnls",
            "isoflop",
            "--all-holdouts",
            "--E-prior",
            "1.6,0.1",
            "--out",
            str(tmp_path / "all.json"),
            "--force",
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "note: --E/--E-prior applies to the laws with an E (vpnls); isoflop has none" in err


@pytest.mark.parametrize(
    "argv, names",
    [
        (["fit", "vpnls", "--E", "1.6", "--E-prior", "1.6,0.1"], ("--E 1.6", "--E-prior")),
        (["fit", "vpnls", "--E-prior", "1.6"], ("--E-prior", "MEAN,SD")),
        (["fit", "vpnls", "--E-prior", "1.6,0"], ("--E-prior", "sd = 0")),
        (["fit", "parametric", "--E", "-1"], ("--E -1", ">= 0")),
        (["fit", "asymptotic", "--E", "profile"], ("--E profile", "frontier")),
        (["fit", "frontier", "--E-prior", "9,0.1"], ("E ~ Normal(9", "below the lowest loss")),
        (["fit", "parametric", "--E", "0"], ("approach3", "E pinned at 0")),
    ],
)
def test_a_bad_E_is_refused_with_one_line(tmp_path, capsys, argv, names) -> None:
    out = tmp_path / "fit.json"
    try:
        code = main([*argv[:2], str(ISOFLOPS), "--query", COMMA, *argv[2:], "--out", str(out)])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("delphi: error:")]
    assert code == 2 and len(lines) == 1 and all(n in lines[0] for n in names), err
    assert not out.exists()


def test_parse_prior() -> None:
    assert parse_prior("1.6, 0.1") == EPrior(1.6, 0.1)
    with pytest.raises(DelphiError, match="expected MEAN,SD"):
        parse_prior("1.6,0.1,3")
