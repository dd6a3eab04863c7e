"""The probe-trend correction on public isoFLOP data: does it generalise beyond our own ladder?

Hypothesis: the sixth edition seals the isoFLOP law x (1 + its error trend at three probes beyond the
ladder, linear in log C). If that rule is more than a fit to one ladder, then on the public isoFLOP
sweeps (`tests/data/isoflops.csv`: 8 experiments from 5 sources) it predicts the budgets beyond
the probes better than the law alone, and gate probes' test (the trend fitted without the furthest
probe predicts it within 3%) picks out the cases where it does.

Method: `delphi.fits.backtest.probe_holdouts` on each experiment (outliers dropped) with the
isoFLOP law (Approach 2), and as cross-checks VPNLS and the compute frontier with E free (no
bootstrap; tables without a FLOPs family allocate under 6ND): every cut with >= 3 training budgets, the next P budgets as
probes (each scored by its best observed loss, as every backtest scores a budget), every budget
beyond them a target, predicted by the law alone and by the law corrected by its trend at the
probes. P = 3, the sixth edition's; and P = 2, which reaches the Marin sweeps (6 budgets each) but
cannot be tested by gate probes (it needs 3). The 90% intervals: the law's is +- z x its training
residual scatter; the corrected one adds the carried error's sd for probes of that scatter each.
Run after the sixth edition's seal and before its hero's outcome; it did not choose the rule.
Expected: the correction lowers the mean |error| where the law's error grows smoothly with C
(sweeps whose frontier bends, as ours does) and does little where the probes' errors are noise.

    python paper/editions/v6/probe_trend_public.py    # writes probe_trend_public{,_summary,_reach}.csv here, prints the summary
"""

from __future__ import annotations

import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.fits import fit_approach2, fit_frontier, fit_vpnls, load_results
from delphi.fits.backtest import probe_holdouts
from delphi.io import atomic_write_text

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "tests" / "data" / "isoflops.csv"
OUT = HERE / "probe_trend_public.csv"  # and probe_trend_public_summary.csv beside it
PROBE_COUNTS = (3, 2)  # the sixth edition's, and two (the Marin sweeps have 6 budgets)
METHODS = {
    "isoflop": fit_approach2,
    "vpnls": partial(fit_vpnls, n_bootstrap=0),
    "frontier": partial(fit_frontier, n_bootstrap=0),
}
TOLERANCE = 0.03  # the sixth edition's
Z90 = 1.6448536269514722  # the central 90% interval's half-width in sds
REACH_BINS = (0, 0.5, 1.0, 1.5, 2.5, 5.0)  # target beyond the last probe, in probe spans (log C)


# A corrected interval narrower than this (relative half-width) counts as zero-width: the frontier
# law's bootstrap collapses on some sweeps to ~1e-10, and z = error / sd there is rounding noise
# (it differed between two CPUs in the 5th digit).
ZERO_WIDTH_REL = 1e-6


def _z_for_90(rows: pd.DataFrame) -> float:
    """The z (in sds of the corrected interval) within which 90% of the corrected errors stay: an
    honest interval needs Z90 = 1.645; less means it was wider than the errors (inf: zero-width)."""
    sd = rows["corrected_half_width_rel"] / Z90
    wide = sd > ZERO_WIDTH_REL / Z90
    z = np.quantile(np.where(wide, rows["corrected_rel_error"].abs() / sd.where(wide, 1.0), np.inf), 0.9)
    return float(np.inf if np.isnan(z) else z)  # nan: the quantile falls between two zero-width rows


def by_reach(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean |error| of the law and the corrected law against how far beyond the last probe the target
    lies, in units of the probes' own span in log C (gate probes allows up to 1)."""
    reach = (np.log(frame["beyond_last_probe"]) / np.log(frame["probe_span"])).round(
        6
    )  # a target one span out is 1, not 1 + 1e-16
    bins = pd.cut(reach, REACH_BINS)
    rows = []
    for (method, interval), part in frame.groupby([frame["method"], bins], observed=True, sort=False):
        rows.append(
            {
                "method": method,
                "reach_in_spans": str(interval),
                "n": len(part),
                "law_mean_abs_rel_error": part["law_rel_error"].abs().mean(),
                "corrected_mean_abs_rel_error": part["corrected_rel_error"].abs().mean(),
                "corrected_coverage_90": part["corrected_covered_90"].mean(),
            }
        )
    return pd.DataFrame(rows).sort_values(["method", "reach_in_spans"], kind="stable", ignore_index=True)


def main(out: Path = OUT) -> int:
    raw = pd.read_csv(DATA)
    rows, summary = [], []
    for method, fit in METHODS.items():
        for n_probes in PROBE_COUNTS:
            for experiment, part in raw[~raw["outlier"]].groupby("experiment"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        result = probe_holdouts(load_results(part), fit, probes=n_probes, tolerance=TOLERANCE)
                    except DelphiError as e:  # too few budgets for this many probes
                        print(f"{method}, {experiment}, {n_probes} probes: skipped ({e})")
                        continue
                rows += [{"method": method, "experiment": experiment, "probes": n_probes} | r for r in result["rows"]]
                summary += [
                    {"method": method, "experiment": experiment, "probes": n_probes, "rows": label} | s
                    for label, s in result["summary"].items()
                    if s["n"]
                ]
    frame = pd.DataFrame(rows)
    frame["probe_errors"] = frame["probe_errors"].map(lambda v: " ".join(f"{e:+.4f}" for e in v))
    frame = frame.drop(columns=["corrected_interval_90", "probe_budgets"])
    atomic_write_text(out, frame.round(6).to_csv(index=False))
    table = pd.DataFrame(summary)
    pooled = [
        {
            "method": m,
            "experiment": "all",
            "probes": p,
            "rows": label,
            "n": len(part),
            "law_mean_abs_rel_error": part["law_rel_error"].abs().mean(),
            "corrected_mean_abs_rel_error": part["corrected_rel_error"].abs().mean(),
            "law_coverage_90": part["law_covered_90"].mean(),
            "corrected_coverage_90": part["corrected_covered_90"].mean(),
            "corrected_better": (part["corrected_rel_error"].abs() < part["law_rel_error"].abs()).mean(),
            "law_mean_half_width_rel": part["law_half_width_rel"].mean(),
            "corrected_mean_half_width_rel": part["corrected_half_width_rel"].mean(),
            # the z (in sds of the corrected interval) that 90% of the errors stay within: Z90 = 1.645 is honest
            "corrected_z_for_90": _z_for_90(part),
        }
        for (m, p), by_p in frame.groupby(["method", "probes"], sort=False)
        for label, part in (("all", by_p), ("tested", by_p[by_p["tested"]]))
        if len(part)
    ]
    table = pd.concat([pd.DataFrame(pooled), table], ignore_index=True)
    atomic_write_text(out.with_name("probe_trend_public_summary.csv"), table.round(4).to_csv(index=False))
    reach = by_reach(frame[frame["probes"] == 3])
    atomic_write_text(out.with_name("probe_trend_public_reach.csv"), reach.round(4).to_csv(index=False))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
