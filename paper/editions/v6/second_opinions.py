"""Unsealed second opinion on the sixth edition's trajectory, written before the hero's first eval.

Hypothesis: the sealed trajectory's shape comes from the LR-annealing curve law fitted on the
ladder's short runs (residual sd 0.096 nats; `preregistrations/paper-v6-hero-60x.yaml`). On the
fifth edition's hero that law put the constant-LR phase 6-9% too high and the decay's drop too
large (`../v5/study/stages/check.json`), while the normalised curve of the 10x probe, scaled to the
hero's final loss, was within 3.3% at every eval point. The nearest long run with the same
schedule is the better shape: here the fifth edition's 30x hero, a probe of this edition.
Method: the fifth edition's hero's eval curve divided by its final validation loss (the 1M-token
final eval, so the 131K-token curve's offset from it carries over), at the same fractions of
training (both heroes evaluate every 10% of their steps), times this edition's sealed final
prediction 0.9752. Nothing here is sealed; git dates this file before the hero's first eval.
Expected: the hero's eval points lie within ~3% of this curve through the constant-LR phase,
where the sealed trajectory is ~15% higher (if the final prediction holds).

    python paper/editions/v6/second_opinions.py    # writes paper/editions/v6/second_opinions.csv and prints it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from delphi.editions import edition_tree
from delphi.io import atomic_write_text
from delphi.prereg_format import read
from delphi.train.rundir import read_metrics

HERE = Path(__file__).resolve().parent
SHAPE_RUN = (
    edition_tree(HERE.parent / "v5") / "study" / "hero"
)  # the compact edition, unpacked (delphi.editions): run dirs as they were
PREREG = HERE.parents[2] / "preregistrations" / "paper-v6-hero-60x.yaml"
OUT = HERE / "second_opinions.csv"


def main() -> int:
    sealed = read(PREREG)["prediction"]
    final = float(sealed["final"]["loss"])
    shape_final = float(json.loads((SHAPE_RUN / "summary.json").read_text())["val_loss"])
    evals = [r for r in read_metrics(SHAPE_RUN) if r.get("val_loss") is not None]
    shape_steps = max(int(r["step"]) for r in evals)
    fraction = np.array([int(r["step"]) / shape_steps for r in evals])
    ratio = np.array([float(r["val_loss"]) for r in evals]) / shape_final
    hero_steps = max(int(p["step"]) for p in sealed["trajectory"]["points"])
    rows = []
    for point in sealed["trajectory"]["points"]:
        f = int(point["step"]) / hero_steps
        rows.append(
            {
                "step": int(point["step"]),
                "fraction": round(f, 4),
                "sealed_trajectory": point["loss"],
                "sealed_lo90": point["lo90"],
                "sealed_hi90": point["hi90"],
                "shape_of_v5_hero": final * float(np.interp(f, fraction, ratio)),
            }
        )
    frame = pd.DataFrame(rows).round(4)
    atomic_write_text(OUT, frame.to_csv(index=False))
    print(frame.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
