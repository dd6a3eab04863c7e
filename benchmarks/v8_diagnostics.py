"""Why the eighth edition's gates refuse its seal: two cheap experiments, read from committed data.

    .venv/bin/python benchmarks/v8_diagnostics.py [--out DIR]

The first ladder (5 budgets 3e11-1e13, the top five of paper/next/v8/ladder) fails gates backtest, lobo_spread,
interval_width and frontier_slopes: fitted on its lower budgets, every law in (N, D) predicts the
top budget's loss too low (docs/notebook.md §8.17). Two hypotheses, each with its experiment:

  H2, the recipe: the top budget's rungs sit off their LR optimum where the recipe check never
      looked (paper/next/v8/diag_top_lr: the 1e13 rungs d48-d160, seed 0, projection LR x0.5 or
      x2). Expected if true: some multiplier beats the rung's seed mean by more than the noise.
  H1a, the span: 1.52 decades cannot pin the law's curvature (two budgets below the ladder,
      5.2e10 and 1.25e11, 28 rungs, 2.5e12 FLOPs; 2.28 decades in all; since 2026-12-04 the
      ladder's own two lowest budgets in paper/next/v8/ladder, docs/notebook.md §8.20).
      Expected if true: the held-out top budget and the leave-one-budget-out spread of the 30x
      prediction shrink when the fit spans more.

Prints (and with --out writes DIR/v8_diagnostics.json) every number §8.18 and §8.19 quote.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from delphi.fits import FITTERS, load_results  # noqa: E402
from delphi.fits.backtest import backtest  # noqa: E402
from delphi.ladder.collect import collect_ladder  # noqa: E402
from delphi.ladder.family import flops_family  # noqa: E402
from delphi.ladder.spec import load_ladder_spec  # noqa: E402

V8 = ROOT / "paper" / "next" / "v8"
BEYOND = (3e13, 1e14, 3e14)  # the sealed multiples: 3x, 10x, 30x the top budget
# The first ladder's lowest budget: the two below it joined the ladder after the first fits (§8.19-8.20).
FIRST_LADDER_BUDGET = 3e11
LAWS = ("isoflop", "vpnls", "parametric", "frontier")
CONVENTION = "nonembedding"  # the convention the study's fit stage chose (lowest backtest of three)


def unpack(packed: Path, dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "delphi.cli", "paper", "unpack", str(packed), "--to", str(dest)],
        check=True,
        capture_output=True,
    )
    return dest


def final_losses(runs: Path) -> dict[str, float]:
    return {p.parent.name: json.loads(p.read_text())["val_loss"] for p in runs.glob("*/summary.json")}


def top_lr_probe(ladder_runs: Path, probe_runs: Path) -> list[dict[str, Any]]:
    """Each probe's loss against its rung's seed mean at the recipe's LR (and against seed 0 alone)."""
    ladder = final_losses(ladder_runs)
    rows = []
    for name, loss in sorted(final_losses(probe_runs).items()):
        width, multiplier = re.search(r"C1e13_d(\d+)_L3_E8k2_s0_lrx([\d.]+)", name).groups()
        seeds = [v for k, v in ladder.items() if k.startswith(f"C1e13_d{width}_L3_E8k2_s")]
        seed0 = ladder[f"C1e13_d{width}_L3_E8k2_s0"]
        rows.append(
            {
                "d_model": int(width),
                "lr_multiplier": float(multiplier),
                "loss": loss,
                "vs_seed_mean": loss / np.mean(seeds) - 1,
                "seeds": len(seeds),
                "vs_seed0": loss / seed0 - 1,
            }
        )
    return rows


def law_checks(raw: pd.DataFrame, family: Any) -> dict[str, Any]:
    """Per law: the top budget held out, and the all-budget law at 3x/10x/30x; VPNLS's LOBO spread at 30x."""
    table = load_results(raw, params_convention=CONVENTION, family=family)
    out: dict[str, Any] = {
        "budgets": sorted(float(b) for b in table["budget"].unique()),
        "runs": len(table),
        "laws": {},
    }
    for name in LAWS:

        def refit(t: pd.DataFrame, n: str = name) -> Any:
            return FITTERS[n](t, n_bootstrap=0, seed=0).with_family(family)

        full = refit(table)
        out["laws"][name] = {
            "backtest_top": float(backtest(table, refit)["budgets"][0]["rel_error"]),
            "beyond": [float(full.predict(compute=c)["loss"]) for c in BEYOND],
            "E": full.params.get("E"),
            "residual_sd_nats": full.diagnostics.residual_std_nats,
        }
        if name == "vpnls":
            at_30x = out["laws"][name]["beyond"][-1]
            out["vpnls_lobo_30x"] = {
                f"{b:.3g}": float(refit(table[table["budget"] != b]).predict(compute=BEYOND[-1])["loss"]) / at_30x - 1
                for b in out["budgets"]
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    family = flops_family(load_ladder_spec(ROOT / "studies" / "ladder_paper_v8.yaml"), CONVENTION)
    with tempfile.TemporaryDirectory() as tmp:
        study = unpack(V8 / "ladder", Path(tmp) / "study")
        probe = unpack(V8 / "diag_top_lr", Path(tmp) / "probe")
        ladder = collect_ladder(study / "ladder")
        result = {
            "top_lr_probe": top_lr_probe(study / "ladder" / "runs", probe / "runs"),
            "ladder": law_checks(ladder[ladder["budget"] >= FIRST_LADDER_BUDGET], family),
            "ladder_and_below": law_checks(ladder, family),
        }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "v8_diagnostics.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
