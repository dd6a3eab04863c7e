"""Scaling-law fitting: isoFLOP, parametric (Approach 3), VPNLS, frontier and MoE laws,
with bootstrap uncertainty and backtests. See docs/design.md §6.

    from delphi.fits import load_results, fit_vpnls
    table = load_results("results.csv")
    fit = fit_vpnls(table, n_bootstrap=1000, seed=0)
    fit.predict(compute=1e21)   # loss, params (N*), tokens (D*), intervals
"""

import sys
import types

# Imported on first use (PEP 562): `delphi.fits.commands` is imported to build the CLI's
# parser, which runs this file, and scipy/pandas/statsmodels cost ~2 s that `--help` must not pay.
_LAZY = {
    "backtest": "delphi.fits.backtest",
    "all_holdouts": "delphi.fits.backtest",
    "FlopsFamily": "delphi.fits.allocation",
    "PARAM_CONVENTIONS": "delphi.fits.allocation",
    "optimal_allocation": "delphi.fits.allocation",
    "isoflop_exponent_by_convention": "delphi.fits.isoflop",
    "load_results": "delphi.fits.data",
    "fit_frontier": "delphi.fits.frontier",
    "fit_asymptotic": "delphi.fits.frontier",
    "fit_approach1": "delphi.fits.isoflop",
    "fit_approach2": "delphi.fits.isoflop",
    "fit_moe": "delphi.fits.moe",
    "fit_approach3": "delphi.fits.parametric",
    "fit_vpnls": "delphi.fits.parametric",
    "FitResult": "delphi.fits.results",
    "fit_from_json": "delphi.fits.results",
    "load_fit": "delphi.fits.results",
}

# Name used on the command line -> (module, fitting function(table, **options) -> FitResult).
_FITTER_NAMES = {
    "isoflop": "fit_approach2",
    "envelope": "fit_approach1",
    "parametric": "fit_approach3",
    "vpnls": "fit_vpnls",
    "frontier": "fit_frontier",
    "asymptotic": "fit_asymptotic",
    "moe": "fit_moe",
}
FIT_METHODS = tuple(_FITTER_NAMES)  # the methods `delphi fit` and a study's `fits:` accept


def __getattr__(name: str):
    import importlib

    if name == "FITTERS":
        value = {method: __getattr__(fn) for method, fn in _FITTER_NAMES.items()}
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'delphi.fits' has no attribute {name!r}")
    globals()[name] = value
    return value


class _FitsPackage(types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        # Importing the submodule `delphi.fits.backtest` binds it here as `backtest`; the
        # function of that name (what `from delphi.fits import backtest` means) wins over the module.
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _FitsPackage


__all__ = [
    "FITTERS",
    "FitResult",
    "FlopsFamily",
    "PARAM_CONVENTIONS",
    "all_holdouts",
    "backtest",
    "isoflop_exponent_by_convention",
    "optimal_allocation",
    "fit_approach1",
    "fit_approach2",
    "fit_approach3",
    "fit_asymptotic",
    "fit_frontier",
    "fit_from_json",
    "fit_moe",
    "fit_vpnls",
    "load_fit",
    "load_results",
]
