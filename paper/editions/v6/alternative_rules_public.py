"""Which way of carrying a law's error at the probes should the next edition seal? (after the outcome)

Hypothesis: the sixth edition's hero missed its corrected seal by +1.02% on the high side, and the
unsealed alternatives committed before the outcome did better: a quadratic trend through the three
probes -0.07%, the last two probes' local slope +0.43% (`final_opinions.csv`). If that is more than
one lucky hero, the same rules also beat the sealed linear trend on the public isoFLOP sweeps.

Method: `delphi.fits.backtest.probe_holdouts` on each public experiment (`tests/data/isoflops.csv`,
outliers dropped), as `probe_trend_public.py` runs it, with 3 and 4 probes, for the isoFLOP law
(Approach 2) and VPNLS. Each target beyond the probes is predicted by the law x (1 + e(x)), where
x = log10(C / top training budget) and e is the law's relative error at the probes, carried by:
- `none`: the law alone;
- `last`: the furthest probe's error, unchanged (no trend);
- `linear`: least squares linear in x (the sixth edition's sealed rule; `ProbeTrend`, carry "linear");
- `local_slope`: the line through the two furthest probes (`ProbeTrend`, carry "local_slope");
- `quadratic`: least squares quadratic in x (exact through three probes).
Targets are grouped by reach: how far beyond the last probe, in the probes' own span in log C
(gate probes allows up to one). The sixth edition's own case (probes at 3x, 10x, 30x; hero at 60x) is
scored the same way from its sealed file and outcome. Run after the sixth edition's outcome: it
chooses nothing retroactively; it is evidence for the seventh edition's rule, which must be
written down before that edition's seal.
Expected: if the errors accelerate in general, `quadratic` and `local_slope` beat `linear` on
targets within one probe span, and overshoot further out (a quadratic carried far diverges).

    python paper/editions/v6/alternative_rules_public.py    # writes alternative_rules_public.csv here, prints it
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits import fit_approach2, fit_vpnls, load_results
from delphi.fits.backtest import probe_holdouts
from delphi.fits.probes import ProbeTrend
from delphi.io import atomic_write_text
from delphi.prereg_format import read

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DATA = ROOT / "tests" / "data" / "isoflops.csv"
SEAL = ROOT / "preregistrations" / "paper-v6-hero-60x.yaml"
OUTCOME = SEAL.with_suffix(".outcome.json")
OUT = HERE / "alternative_rules_public.csv"
METHODS = {"isoflop": fit_approach2, "vpnls": partial(fit_vpnls, n_bootstrap=0)}
PROBE_COUNTS = (3, 4)
TOLERANCE = 0.03  # the sixth edition's
REACH_BINS = (0, 1.0, 5.0)
OWN = "delphi paper v6, 60x hero"  # target beyond the last probe, in probe spans (log C): gate probes allows 1


def _library(carry: str) -> Callable[[np.ndarray, np.ndarray, float], float]:
    """A carry of `delphi.fits.backtest.ProbeTrend` (x are log10 C, so its top budget is 1)."""

    def carried(x: np.ndarray, e: np.ndarray, at: float) -> float:
        return ProbeTrend(1.0, tuple(map(str, range(len(x)))), tuple(x), tuple(e), carry).at(10**at)

    return carried


RULES: dict[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "none": lambda x, e, at: 0.0,
    "last": lambda x, e, at: float(e[-1]),
    "linear": _library("linear"),
    "local_slope": _library("local_slope"),
    "quadratic": lambda x, e, at: float(np.polyval(np.polyfit(x, e, 2), at)),
}


def score(x: np.ndarray, e: np.ndarray, at: float, law_loss: float, observed: float) -> dict[str, float]:
    """Each rule's relative error (predicted / observed - 1) at one target."""
    return {rule: law_loss * (1 + carry(x, e, at)) / observed - 1 for rule, carry in RULES.items()}


def public_rows() -> pd.DataFrame:
    raw = pd.read_csv(DATA)
    rows = []
    for method, fit in METHODS.items():
        for n_probes in PROBE_COUNTS:
            for experiment, part in raw[~raw["outlier"]].groupby("experiment"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        result = probe_holdouts(load_results(part), fit, probes=n_probes, tolerance=TOLERANCE)
                    except DelphiError:  # too few budgets for this many probes
                        continue
                for r in result["rows"]:
                    if "error" in r:
                        continue
                    x = np.log10(np.array(r["probe_budgets"]))
                    reach = math.log(r["beyond_last_probe"]) / math.log(r["probe_span"])
                    rows.append(
                        {
                            "method": method,
                            "probes": n_probes,
                            "experiment": experiment,
                            "budget": r["budget"],
                            "reach_in_spans": round(reach, 6),
                        }
                        | score(
                            x,
                            np.array(r["probe_errors"]),
                            math.log10(r["budget"]),
                            r["law_loss"],
                            r["observed_best_loss"],
                        )
                    )
    return pd.DataFrame(rows)


def own_row() -> dict:
    """The sixth edition: the isoFLOP law's errors at its three probes, carried to its 60x hero."""
    final = read(SEAL)["prediction"]["final"]
    probes = final["probe_correction"]["probes"].values()
    x = np.array([p["log10_multiple"] for p in probes])
    e = np.array([p["rel_error"] for p in probes])
    at = math.log10(read(SEAL)["hero"]["flops"] / final["probe_correction"]["top_budget"])
    observed = json.loads(OUTCOME.read_text())["actual_final_loss"]
    order = np.argsort(x)
    return {
        "method": "isoflop",
        "probes": 3,
        "experiment": OWN,
        "budget": read(SEAL)["hero"]["flops"],
        "reach_in_spans": round((at - x.max()) / (x.max() - x.min()), 6),
    } | score(x[order], e[order], at, final["uncorrected"]["loss"], observed)


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean |error| and mean error of each rule, by law, probe count and reach (the own case: its one row)."""
    bins = pd.cut(frame["reach_in_spans"], REACH_BINS).astype(str).where(frame["experiment"] != OWN, OWN)
    out = []
    for (method, probes, reach), rows in frame.groupby([frame["method"], frame["probes"], bins], sort=True):
        out.append(
            {"method": method, "probes": probes, "reach_in_spans": reach, "n": len(rows)}
            | {f"{rule}_mean_abs": rows[rule].abs().mean() for rule in RULES}
            | {f"{rule}_mean": rows[rule].mean() for rule in RULES}
        )
    return pd.DataFrame(out)


def main(out: Path = OUT) -> int:
    table = summarise(pd.concat([public_rows(), pd.DataFrame([own_row()])], ignore_index=True))
    atomic_write_text(out, table.round(4).to_csv(index=False))
    print(
        "mean |predicted / observed - 1| of each rule; reach: targets beyond the last probe in probe spans "
        "(gate probes allows 1)"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
