"""Which law extrapolates on the fourth edition's ladder? Two diagnostic probes after the seal was refused.

Hypothesis: gate method_agreement refused the 30x hero because the primary law (VPNLS, with an
asymptote E) and the isoFLOP power law (none) disagree by 19% there; a ladder spanning one decade
cannot say which is right. Runs past the ladder can: the laws' gap is 5% at 3x and 12% at 10x, far
above one run's seed noise (~1%).
Method: two runs sized by the primary law's N*(C) at 3x and 10x the top budget, each sealed with
`--force` (recorded) and committed before it trained (`preregistrations/paper-v4-probe-*.yaml`); every
law the study fitted (`study/fits/*.json`) predicts each run at its own N, D and exact FLOPs
(`delphi.prereg.create.predict_hero`, the code the seal runs), against the run's final loss.
Expected: the truth lies between the laws, as it did at 7 of the 8 earlier heroes
(`../v2/method_agreement.csv`); no law is known in advance to be right.

    python paper/editions/v4/probes.py        # writes paper/editions/v4/probes.csv and prints it
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from delphi.editions import edition_tree
from delphi.fits import load_fit
from delphi.io import atomic_write_text
from delphi.prereg.predict import predict_hero
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
DATA = edition_tree(HERE)  # the compact edition, unpacked (delphi.editions): run dirs as they were
OUT = HERE / "probes.csv"
LAWS = ("vpnls", "parametric", "frontier", "isoflop")  # the study's fits; vpnls is the primary
PROBES = ("probe3x", "probe10x")


def rows() -> list[dict[str, object]]:
    fits = {name: load_fit(HERE / "study" / "fits" / f"{name}.json") for name in LAWS}
    top_budget = max(
        float(r["budget"])
        for r in csv.DictReader((HERE / "study" / "results.csv").open())
        if r.get("role", "isoflop") == "isoflop"
    )
    out = []
    for probe in PROBES:
        hero = load_train_config(DATA / probe / "hero.yaml")
        summary = DATA / probe / "summary.json"
        actual = json.loads(summary.read_text())["val_loss"] if summary.is_file() else None
        for law, fit in fits.items():
            predicted = float(predict_hero(fit, hero)[0]["loss"])
            out.append(
                {
                    "probe": probe,
                    "multiple": round(hero.flops / top_budget, 2),
                    "d_model": hero.model.d_model,
                    "tokens": hero.tokens,
                    "law": law,
                    "predicted": round(predicted, 4),
                    "actual": None if actual is None else round(actual, 4),
                    "error": None if actual is None else round(actual / predicted - 1, 4),
                }
            )
    return out


def main() -> int:
    table = rows()
    lines = [",".join(table[0])] + [",".join("" if v is None else str(v) for v in r.values()) for r in table]
    atomic_write_text(OUT, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
