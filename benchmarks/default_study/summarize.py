"""One row per archived run of the default study: prediction, outcome, gates, wall time.

    .venv/bin/python benchmarks/default_study/summarize.py [DIR ...] [--out summary.csv]

Reads what `delphi study` wrote (archived here by study seed: results.csv, fits/, hero.yaml,
preregistration.*, stages/) and prints a table; `--out` writes it as CSV. Besides the sealed
90% interval it re-scores the interval with the rule `delphi prereg create` uses since this
edition (`delphi.prereg.create.predict_final`: the fit's bootstrap interval widened in quadrature by
z x one run's noise); for runs sealed before that rule existed this is a post-hoc re-scoring,
labelled as such in the column name.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from delphi.prereg.create import predict_final
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
DEFAULT_DIRS = sorted(HERE.glob("*-v[34]-*"))  # third and fourth editions


def stage_seconds(run: Path, stage: str) -> float | None:
    path = run / "stages" / f"{stage}.json"
    return json.loads(path.read_text()).get("seconds") if path.is_file() else None


def summarize(run: Path) -> dict:
    study = json.loads((run / "study.json").read_text())["study"]
    gates = json.loads((run / "gates.json").read_text())
    sealed = gates["prediction"]
    final, _ = predict_final(run / "fits" / f"{study['primary_fit']}.json", load_train_config(run / "hero.yaml"), run / "results.csv")
    ladder_s = stage_seconds(run, "ladder_first_invocation") or stage_seconds(run, "ladder")
    stages = [p.stem for p in (run / "stages").glob("*.json") if p.stem not in ("ladder", "ladder_first_invocation")]
    row = {
        "run": run.name,
        "edition": run.name.split("-v")[1].split("-")[0],
        "study_seed": study["seed"],
        "primary_fit": study["primary_fit"],
        "tolerance": study["hero"]["tolerance"],
        "gates_passed": gates["passed"],
        "gates_failed": ";".join(gates["failed"]),
        "predicted": sealed["loss"],
        "sealed_90_lo": sealed["loss_90"][0],
        "sealed_90_hi": sealed["loss_90"][1],
        "predictive_90_lo_post_hoc": final["loss_90"][0],
        "predictive_90_hi_post_hoc": final["loss_90"][1],
        "seed_noise_nats": final.get("seed_noise_nats"),
        "ladder_s": ladder_s,
        "study_s": sum(stage_seconds(run, s) or 0.0 for s in stages) + (ladder_s or 0.0),
    }
    outcome_path = run / "preregistration.outcome.json"
    if not outcome_path.is_file():  # the gates refused the ladder: no rehearsal, no hero
        return row | {"verdict": f"refused by gates ({row['gates_failed']})"}
    outcome = json.loads(outcome_path.read_text())
    rehearsal = json.loads((run / "preregistration.gates.json").read_text()).get("rehearsal") or {}
    actual = float(outcome["actual_final_loss"])
    return row | {
        "verdict": outcome["verdict"],
        "rehearsal_rel_error": rehearsal.get("rel_error"),
        "actual": actual,
        "rel_error": actual / sealed["loss"] - 1,
        "sealed_90_covered": sealed["loss_90"][0] <= actual <= sealed["loss_90"][1],
        "predictive_90_covered_post_hoc": final["loss_90"][0] <= actual <= final["loss_90"][1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=DEFAULT_DIRS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [summarize(d) for d in args.dirs]
    if not rows:
        print("no archived runs found", file=sys.stderr)
        return 1
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    for row in rows:
        print("  ".join(f"{k}={fmt(v)}" for k, v in row.items()))
    if args.out:
        tmp = args.out.with_name(args.out.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
