"""Backtest coverage table: every budget above the third held out, every method, every public source.

For each source x dataset x condition group of the public isoFLOP data (Open-Athena's
isoflops.csv, see tests/data or ../shared/reference-data) with at least MIN_BUDGETS
budgets, and for the old paper ladder (paper/editions/v1/data/results.csv, scored at its exact FLOPs
with the family of its own shapes), run `delphi.fits.backtest.all_holdouts`: for each cut
k >= 3 fit on budgets[:k] and predict every higher budget's best loss. Reports the mean
|relative error| and the share of held-out points inside their 90% predictive interval
(bootstrap of the fit, widened by the training residual scatter; see delphi/fits/backtest.py).

Choices: outlier-flagged rows are dropped (the curation's flags); budgets left with fewer
than 3 points are dropped for every method alike (an isoFLOP parabola needs 3). External
tables have no FLOPs family, so they are scored under C = 6 N D, as their authors counted.

    .venv/bin/python benchmarks/backtests.py [--bootstrap 50] [--out benchmarks/backtests]

writes OUT_rows.csv (one row per held-out point) and OUT_summary.csv (per group x method).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import pandas as pd

from delphi.fits import FITTERS, load_results
from delphi.fits.backtest import all_holdouts, summarise

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_CANDIDATES = (
    ROOT / "tests" / "data" / "isoflops.csv",
    ROOT.parent / "shared" / "reference-data" / "isoflops.csv",
)
PAPER_LADDER = ROOT / "paper" / "v1" / "data" / "results.csv"
METHODS = ("isoflop", "vpnls", "parametric", "frontier")
MIN_BUDGETS = 4  # at least one budget above the third
MIN_POINTS_PER_BUDGET = 3


def reference_groups(path: Path) -> list[tuple[str, pd.DataFrame]]:
    raw = pd.read_csv(path)
    raw = raw[~raw["outlier"].astype(bool)]
    groups = []
    for (source, dataset, condition), g in raw.groupby(["source", "dataset", "condition"], dropna=False, sort=True):
        counts = g.groupby("budget")["loss"].transform("size")
        g = g[counts >= MIN_POINTS_PER_BUDGET]
        if g["budget"].nunique() >= MIN_BUDGETS:
            name = "/".join(str(x) for x in (source, dataset, condition) if isinstance(x, str))
            groups.append((name, g[["params", "tokens", "budget", "loss"]].reset_index(drop=True)))
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", type=int, default=50, help="bootstrap refits per fit (default 50)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--only", help="run only groups whose name contains this")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "backtests")
    args = parser.parse_args(argv)

    reference = next((p for p in REFERENCE_CANDIDATES if p.is_file()), None)
    tables: list[tuple[str, pd.DataFrame]] = []
    if reference is not None:
        tables += [(name, load_results(g)) for name, g in reference_groups(reference)]
    else:
        print("reference isoflops.csv not found; only the paper ladder", file=sys.stderr)
    if PAPER_LADDER.is_file():
        tables.append(("delphi_paper_ladder_2026", load_results(PAPER_LADDER)))
    if args.only:
        tables = [(n, t) for n, t in tables if args.only in n]

    fit_fns = {m: partial(FITTERS[m], n_bootstrap=args.bootstrap, seed=0, workers=1) for m in args.methods}
    rows, summary = [], []
    for name, table in tables:
        start = time.perf_counter()
        result = all_holdouts(table, fit_fns)
        for r in result["rows"]:
            rows.append({"group": name, **r})
        for method, s in summarise(result["rows"]).items():
            summary.append(
                {
                    "group": name,
                    "method": method,
                    "budgets": table["budget"].nunique(),
                    "allocation": "exact" if table.attrs.get("flops_family") else "6ND",
                    **s,
                }
            )
        print(f"{name}: {table['budget'].nunique()} budgets, {time.perf_counter() - start:.0f} s", file=sys.stderr)
        for s in summary[-len(fit_fns) :]:
            print(
                f"  {s['method']:>10}: n={s['n']:3d} mean|err|={_pct(s['mean_abs_rel_error'])} "
                f"cov90={_pct(s['coverage_90'])}  one-step: mean|err|={_pct(s['one_step_mean_abs_rel_error'])} "
                f"cov90={_pct(s['one_step_coverage_90'])}",
                file=sys.stderr,
            )
    overall = summarise([{**r, "method": r["method"]} for r in rows if r["group"] != "delphi_paper_ladder_2026"])
    for method, s in overall.items():
        summary.append({"group": "ALL_PUBLIC", "method": method, "budgets": None, "allocation": "6ND", **s})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from delphi.io import atomic_write_text

    atomic_write_text(Path(f"{args.out}_rows.csv"), pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(Path(f"{args.out}_summary.csv"), pd.DataFrame(summary).to_csv(index=False))
    print(f"wrote {args.out}_rows.csv and {args.out}_summary.csv (bootstrap {args.bootstrap})", file=sys.stderr)
    return 0


def _pct(v: float | None) -> str:
    return "   n/a" if v is None or v != v else f"{100 * v:5.2f}%"


if __name__ == "__main__":
    raise SystemExit(main())
