"""The paper's markdown tables and intervals, each rendered from a study's data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd


def interval_text(pair: Any) -> str:
    if not pair or pair[0] is None:
        return "n/a"
    return f"[{float(pair[0]):.4g}, {float(pair[1]):.4g}]"


def backtest_table(backtest: dict) -> str:
    rows = [
        "| method | held-out budget | predicted best loss | observed best loss | relative error | 90% interval covered |",
        "|---|---|---|---|---|---|",
    ]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            rows.append(
                f"| {method} | {b['budget']:.3g} | {b['predicted_loss']:.4f} | {b['observed_best_loss']:.4f} "
                f"| {b['rel_error']:+.2%} | {b.get('covered_90')} |"
            )
    return "\n".join(rows)


def ladder_table(table: pd.DataFrame) -> str:
    cols = ["run_id", "budget", "d_model", "n_layers", "params", "tokens", "loss"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.sort_values(["budget", "params"]).iterrows():
        cells = [
            str(r["run_id"]),
            f"{r['budget']:.3g}",
            str(int(r["d_model"])),
            str(int(r["n_layers"])),
            f"{int(r['params']):,}",
            f"{int(r['tokens']):,}",
            f"{r['loss']:.4f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def trajectory_table(check: dict) -> str:
    points = check.get("points") or []
    if not points:
        return "(no eval points)"
    seeded = any("seed" in p for p in points)  # a multi-seed seal: each seed's curve in turn
    rows = [
        "| " + ("seed | " if seeded else "") + "tokens | predicted | 90% band | actual | relative error |",
        "|---|" + ("---|" if seeded else "") + "---|---|---|---|",
    ]
    for p in points:
        rows.append(
            "| " + (f"{p.get('seed')} | " if seeded else "") + f"{p['tokens']:.3g} | {p['predicted']:.4f} "
            f"| [{p['lo90']:.4f}, {p['hi90']:.4f}] | {p['actual']:.4f} | {p['rel_error']:+.2%} |"
        )
    return "\n".join(rows)


def gates_table(gates: list[dict]) -> str:
    if not gates:
        return "(no gates recorded)"
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  thresholds quote |error|
    rows = ["| gate | passed | value | threshold | detail |", "|---|---|---|---|---|"]
    for g in gates:
        value = g.get("value")
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        rows.append(
            f"| {g['name']} | {'yes' if g.get('passed') else '**no**'} | {cell(shown)} | {cell(g.get('threshold', ''))} "
            f"| {cell(g.get('detail', ''))} |"
        )
    return "\n".join(rows)


def cell_table(table: pd.DataFrame) -> str:
    """One row per cell (a shape at a budget, its seeds pooled): size, horizon and health."""
    if "cell_id" not in table:
        return "(the results table has no cells: one seed per rung, no health columns)"
    rows = [
        "| cell | role | budget | d_model | layers | seeds | steps | tokens/param | evals | max dropped share | loss (mean +- sd) | healthy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, g in table.sort_values(["budget", "params"]).groupby("cell_id", sort=False):
        r = g.iloc[0]
        sd = f"{g['loss'].std(ddof=1):.4f}" if len(g) > 1 else "n/a"
        rows.append(
            f"| {cell} | {r.get('role', 'isoflop')} | {r['budget']:.3g} | {int(r['d_model'])} | {int(r['n_layers'])} | {len(g)} "
            f"| {int(r['steps']):,} | {float(r['tokens_per_param']):.0f} | {int(g['n_evals'].min())} "
            f"| {float(g['drop_frac_mean'].max()):.2%} | {g['loss'].mean():.4f} +- {sd} | {'yes' if g['health_ok'].all() else '**no**'} |"
        )
    return "\n".join(rows)


def coverage_table(path: Path) -> str:
    """Every held-out budget the ladder allows (`delphi fit backtest --all`), per method."""
    if not path.is_file():
        return "(no all-holdouts backtest in the data)"
    summary = json.loads(path.read_text())["summary"]
    rows = ["| method | held-out points | mean abs error | 90% coverage |", "|---|---|---|---|"]
    for method, s in summary.items():
        coverage = f"{s['coverage_90']:.0%}" if s.get("coverage_90") is not None else "n/a"
        rows.append(f"| {method} | {s['n']} | {s['mean_abs_rel_error']:.2%} | {coverage} |")
    return "\n".join(rows)
