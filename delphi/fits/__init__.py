"""Scaling-law fitting: isoFLOP, parametric (Approach 3), VPNLS, frontier and MoE laws,
with bootstrap uncertainty and backtests. See DESIGN.md section 6.

    from delphi.fits import load_results, fit_vpnls
    table = load_results("results.csv")
    fit = fit_vpnls(table, n_bootstrap=1000, seed=0)
    fit.predict(compute=1e21)   # loss, params (N*), tokens (D*), intervals
"""

from delphi.fits.backtest import backtest
from delphi.fits.data import load_results
from delphi.fits.frontier import fit_frontier
from delphi.fits.isoflop import fit_approach1, fit_approach2
from delphi.fits.moe import fit_moe
from delphi.fits.parametric import fit_approach3, fit_vpnls
from delphi.fits.results import FitResult, fit_from_json, load_fit

# Name used on the command line -> fitting function(table, **options) -> FitResult.
FITTERS = {
    "isoflop": fit_approach2,
    "envelope": fit_approach1,
    "parametric": fit_approach3,
    "vpnls": fit_vpnls,
    "frontier": fit_frontier,
    "moe": fit_moe,
}

__all__ = [
    "FITTERS", "FitResult", "backtest", "fit_approach1", "fit_approach2", "fit_approach3", "fit_frontier",
    "fit_from_json", "fit_moe", "fit_vpnls", "load_fit", "load_results",
]
