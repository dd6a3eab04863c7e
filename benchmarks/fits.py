"""Fit speed on the 240 Epoch Chinchilla points, and the isoflops.csv exponent table.

    .venv/bin/python benchmarks/fits.py [--bootstrap 1000] [--full-grid] [--json]

Reports wall time of Approach 3 (vectorised grid + L-BFGS-B from the best starts),
VPNLS, and N bootstrap refits of each (all cores), in seconds and as a ratio to a
baseline measured in the same run: one numpy lstsq of the 240 x 3 log-linear design
(the cheapest possible "fit" of these points). Targets (DESIGN.md section 8): an
Approach-3-quality fit in seconds, 1000 bootstrap refits in under a minute on 2 cores.
Then fits every source/dataset of isoflops.csv by Approach 2 and VPNLS, with and
without the points its curation flags as outliers, and prints the exponents.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from delphi.fits import fit_approach2, fit_approach3, fit_vpnls, load_results

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-data"


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def baseline_lstsq_seconds(table: pd.DataFrame, repeats: int = 2000) -> float:
    design = np.column_stack([np.ones(len(table)), np.log(table["params"]), np.log(table["tokens"])])
    y = np.log(table["loss"].to_numpy())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.linalg.lstsq(design, y, rcond=None)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--full-grid", action="store_true", help="also time L-BFGS-B from all 4,500 grid starts (~20 s)")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    raw = pd.read_csv(args.reference / "chinchilla_epoch.csv").sort_values("loss").iloc[:-5]
    table = load_results(raw, params_col="Model Size", flops_col="Training FLOP")
    report: dict = {"n_points": len(table), "cores": os.cpu_count()}
    base = baseline_lstsq_seconds(table)
    report["baseline_lstsq_s"] = base

    a3, t_a3 = timed(fit_approach3, table)
    vp, t_vp = timed(fit_vpnls, table)
    report["approach3"] = {"seconds": t_a3, "ratio_to_lstsq": t_a3 / base, "params": a3.params, "a": a3.derived["a"]}
    report["vpnls"] = {"seconds": t_vp, "ratio_to_lstsq": t_vp / base, "params": vp.params, "a": vp.derived["a"]}
    if args.full_grid:
        full, t_full = timed(fit_approach3, table, top_starts=None)
        report["approach3_full_grid"] = {
            "seconds": t_full, "ratio_to_top_starts": t_full / t_a3, "params": full.params,
            "same_minimum": bool(a3.diagnostics["objective_huber_sum"] <= full.diagnostics["objective_huber_sum"] * (1 + 1e-9)),
        }
    if args.bootstrap:
        for name, fn, single in (("approach3", fit_approach3, t_a3), ("vpnls", fit_vpnls, t_vp)):
            boot, t_boot = timed(fn, table, n_bootstrap=args.bootstrap, seed=0)
            report[f"{name}_bootstrap"] = {
                "n": args.bootstrap,
                "seconds": t_boot,
                "ratio_to_lstsq": t_boot / base,
                "ratio_to_single_fit": t_boot / single,
                "failed": boot.diagnostics["bootstrap_failed"],
                "workers": boot.diagnostics["bootstrap_workers"],
                "a_interval_90": boot.intervals["a"],
                "intervals": boot.intervals,
            }

    rows = []
    iso = pd.read_csv(args.reference / "isoflops.csv")
    for experiment, group in iso.groupby("experiment"):
        for label, subset in (("all", group), ("no_outliers", group[~group["outlier"]])):
            t = load_results(subset)
            a2, vp_i = fit_approach2(t), fit_vpnls(t)
            rows.append({
                "experiment": experiment, "points": label, "n": len(t),
                "approach2_a": a2.params["a"], "approach2_b": a2.params["b"],
                "approach2_a_ci90": a2.intervals.get("a"), "budgets_skipped": a2.diagnostics["n_budgets_skipped"],
                "vpnls_a": vp_i.derived["a"], "vpnls_alpha": vp_i.params["alpha"], "vpnls_beta": vp_i.params["beta"],
                "vpnls_E": vp_i.params["E"],
            })
    report["isoflops"] = rows

    if args.json:
        json.dump(report, sys.stdout, default=float)
        print()
        return
    print(f"{report['n_points']} Epoch points, {report['cores']} cores; baseline lstsq {base * 1e6:.1f} us")
    for name in ("approach3", "vpnls", "approach3_full_grid"):
        if name in report:
            r = report[name]
            print(f"{name:>20}: {r['seconds']:.3f} s  params {json.dumps({k: round(v, 5) for k, v in r['params'].items()})}")
    for name in ("approach3_bootstrap", "vpnls_bootstrap"):
        if name in report:
            r = report[name]
            lo, hi = r["a_interval_90"]
            print(f"{name:>20}: {r['n']} refits in {r['seconds']:.1f} s on {r['workers']} workers "
                  f"({r['ratio_to_single_fit']:.0f}x one fit, {r['ratio_to_lstsq']:.3g}x lstsq); a 90% [{lo:.4f}, {hi:.4f}], failed {r['failed']}")
    print(f"\n{'experiment':44} {'points':11} {'n':>4} {'A2 a':>6} {'A2 b':>6} {'VPNLS a':>8} {'alpha':>6} {'beta':>6} {'E':>6}")
    for r in rows:
        print(f"{r['experiment']:44} {r['points']:11} {r['n']:4d} {r['approach2_a']:6.3f} {r['approach2_b']:6.3f} "
              f"{r['vpnls_a']:8.3f} {r['vpnls_alpha']:6.3f} {r['vpnls_beta']:6.3f} {r['vpnls_E']:6.3f}")


if __name__ == "__main__":
    main()
