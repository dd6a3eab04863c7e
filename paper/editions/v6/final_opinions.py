"""Unsealed second opinions on the sixth edition's final loss, written while its hero trained.

Hypothesis: the sealed rule (the isoFLOP law x its error trend at three probes, linear in log C)
is one of several ways to use the probes; where the others land says how much the answer depends
on that choice. The probes' errors accelerate (+9.5% per decade from 3x to 10x, +12.0% from 10x
to 30x), so rules that bend with them predict a higher loss than the sealed one.
Method: at the hero's own N, D and exact FLOPs (`predict_hero`, as sealed), from the committed
study data (`study/`): (1) the isoFLOP law alone; (2) the sealed rule; (3) the same correction with
a quadratic trend, exact through the three probes; (4) the compute frontier E + A C^-gamma (E
free) fitted on the ladder's per-budget best losses plus the probes; (5) a power law in C through
the three probes alone; (6) the last two probes' local slope d ln L / d ln C carried from the
furthest probe. Nothing here is sealed; git dates this file before the hero's end.
Expected: (3)-(6) between the sealed 0.9752 and ~0.99.

    python paper/editions/v6/final_opinions.py    # writes paper/editions/v6/final_opinions.csv and prints it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from delphi.editions import edition_tree
from delphi.fits import load_fit
from delphi.fits.frontier import fit_frontier_arrays
from delphi.io import atomic_write_text
from delphi.prereg.gates import budget_best_losses, ladder_top_budget
from delphi.prereg.predict import fit_convention, load_tables, predict_hero
from delphi.prereg_format import read
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
STUDY = edition_tree(HERE) / "study"  # the compact edition, unpacked (delphi.editions): run dirs as they were
PREREG = HERE.parents[2] / "preregistrations" / "paper-v6-hero-60x.yaml"
OUT = HERE / "final_opinions.csv"


def main() -> int:
    law = load_fit(STUDY / "fits" / "isoflop.json")
    hero = load_train_config(STUDY / "hero.yaml")
    _, gate_table = load_tables(STUDY / "results.csv", fit_convention(law))
    top = ladder_top_budget(gate_table)
    probes = []
    for run in sorted((STUDY / "probes").iterdir(), key=lambda r: load_train_config(r / "config.yaml").flops):
        cfg = load_train_config(run / "config.yaml")
        actual = float(json.loads((run / "summary.json").read_text())["val_loss"])
        probes.append({"flops": float(cfg.flops), "actual": actual, "law": float(predict_hero(law, cfg)[0]["loss"])})
    flops = np.array([p["flops"] for p in probes])
    actual = np.array([p["actual"] for p in probes])
    errors = actual / np.array([p["law"] for p in probes]) - 1
    x, x_hero = np.log10(flops / top), np.log10(hero.flops / top)
    alone = float(predict_hero(law, hero)[0]["loss"])
    best = budget_best_losses(gate_table)
    frontier = fit_frontier_arrays(
        np.concatenate([best["budget"].to_numpy(float), flops]), np.concatenate([best["loss"].to_numpy(float), actual])
    )
    power = np.polyfit(np.log(flops), np.log(actual), 1)
    local_slope = np.log(actual[-1] / actual[-2]) / np.log(flops[-1] / flops[-2])
    opinions = [
        ("isoFLOP law alone", alone),
        ("sealed: law x (1 + linear trend in log C)", float(read(PREREG)["prediction"]["final"]["loss"])),
        (
            "law x (1 + quadratic trend through the 3 probes)",
            alone * (1 + np.polyval(np.polyfit(x, errors, 2), x_hero)),
        ),
        (
            "frontier E + A C^-gamma on ladder best losses + probes",
            frontier["E"] + frontier["A"] * hero.flops ** -frontier["gamma"],
        ),
        ("power law in C through the 3 probes", float(np.exp(np.polyval(power, np.log(hero.flops))))),
        (
            "the last two probes' local slope from the furthest",
            float(actual[-1] * (hero.flops / flops[-1]) ** local_slope),
        ),
    ]
    frame = pd.DataFrame([{"opinion": name, "hero_loss": round(float(v), 4)} for name, v in opinions])
    atomic_write_text(OUT, frame.to_csv(index=False))
    print(frame.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
