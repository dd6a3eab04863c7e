"""Method agreement on every committed study whose hero trained: the primary law's sealed
prediction, each cross-check law's (refitted on the same ladder), and the hero's actual loss.
Errors are the preregistration's: actual / predicted - 1; disagreement is cross-check / primary - 1.

Hypothesis: a law with an asymptote (VPNLS) and one without (the isoFLOP power law) agree at the
hero only where the ladder identifies E; where they disagree, at most one of them can be right,
and the held-out evidence (top-budget backtest, dress rehearsal) should say which.
Method: `delphi.prereg.measure.cross_check_predictions` on each study's committed results table,
primary fit, hero config and rehearsal run (no retraining; the same code the gate runs).
The six default-study directories left the tree in issue 32 (benchmarks/default_study/README.md):
`git checkout 2c57663 -- benchmarks/default_study` restores them before a rerun.
Expected: the laws disagree by more than the tolerance on every study; the law that the held-out
evidence favours is the one closer to the hero (paper/editions/v2/diagnostics.csv has the 10x runs).
Found (with the 30x hero of paper/editions/v3): the second half is wrong. The held-out evidence favoured
VPNLS on both paper studies, and VPNLS missed both heroes by -7%; the actual loss lay between the
two laws in 7 of 8 studies (column actual_between_laws). Gate method_agreement now sets a
cross-check aside only for its own held-out-budget backtest, not for its rehearsal.

    python paper/editions/v2/method_agreement.py            # writes paper/editions/v2/method_agreement.csv
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from delphi.editions import resolve_data
from delphi.fits import load_fit
from delphi.io import atomic_write_text
from delphi.prereg.measure import cross_check_predictions
from delphi.prereg.predict import fit_convention, load_tables, predict_hero
from delphi.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).with_suffix(".csv")
# Committed studies whose hero trained, with the primary law each one sealed.
STUDIES = [
    ("paper/editions/v2/study_10x", "vpnls"),
    ("paper/editions/v3/study", "vpnls"),
    *(
        (f"benchmarks/default_study/2026-12-01-{name}", "isoflop")
        for name in ("v3-seed0", "v3-seed1", "v3-seed2", "v4-readme-run-final", "v4-seed1", "v4-seed2")
    ),
]


def row(study: str, primary: str) -> dict[str, object]:
    d = resolve_data(ROOT / study)  # the compact edition, unpacked (delphi.editions)
    fit = load_fit(d / "fits" / f"{primary}.json")
    hero = load_train_config(d / "hero.yaml")
    fit_table, _ = load_tables(d / "results.csv", fit_convention(fit))
    predicted = float(predict_hero(fit, hero)[0]["loss"])
    actual = float(json.loads((d / "hero" / "summary.json").read_text())["val_loss"])
    out: dict[str, object] = {
        "study": study,
        "primary": primary,
        "primary_loss": round(predicted, 4),
        "actual_loss": round(actual, 4),
        "primary_error": round(actual / predicted - 1, 4),
    }
    rehearsal = json.loads((d / "rehearsal" / "summary.json").read_text())["val_loss"]
    out["primary_rehearsal_error"] = round(
        rehearsal / float(predict_hero(fit, load_train_config(d / "rehearsal.yaml"))[0]["loss"]) - 1, 4
    )
    for name, check in cross_check_predictions(fit, fit_table, hero, d / "rehearsal").items():
        out |= {
            "cross_check": name,
            "cross_check_loss": round(check["loss"], 4),
            "cross_check_error": round(actual / check["loss"] - 1, 4),
            "cross_check_backtest": round(check["backtest_rel_error"], 4),
            "cross_check_rehearsal_error": round(check["probes"]["rehearsal"]["rel_error"], 4),
            "disagreement": round(check["loss"] / predicted - 1, 4),
            "actual_between_laws": min(predicted, check["loss"]) <= actual <= max(predicted, check["loss"]),
        }
    return out


def main() -> int:
    rows = [row(study, primary) for study, primary in STUDIES]
    lines = [",".join(rows[0])]
    lines += [",".join(str(r[k]) for k in rows[0]) for r in rows]
    atomic_write_text(OUT, "\n".join(lines) + "\n")
    for r in csv.DictReader(OUT.read_text().splitlines()):
        print(
            f"{r['study']:<56} {r['primary']:>7} hero {float(r['primary_error']):+.2%} rehearsal "
            f"{float(r['primary_rehearsal_error']):+.2%} | {r['cross_check']:>7} hero {float(r['cross_check_error']):+.2%} "
            f"rehearsal {float(r['cross_check_rehearsal_error']):+.2%} | disagree {float(r['disagreement']):+.2%} "
            f"| actual between the laws: {r['actual_between_laws']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
