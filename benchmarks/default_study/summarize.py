"""One row per archived run of the default study: prediction, outcome, gates, wall time.

    .venv/bin/python benchmarks/default_study/summarize.py [DIR ...] [--out summary.csv]

Reads what `delphi study` wrote (archived here: results.csv, fits/, hero.yaml, preregistration.*,
stages/) and prints a table; `--out` merges it into the CSV: a run's row is recomputed from its
directory, and rows whose directory is no longer in the tree are kept as they are (only the latest
run stays on disk; `archived_in` names the commit that holds each older one). Columns the script
cannot compute (`archived_in`, `machine`) are kept from the existing row, or left empty to fill in. Besides the sealed
90% interval it re-scores the interval with the rule `delphi prereg create` uses since this
edition (`delphi.prereg.create.predict_final`: the fit's bootstrap interval widened in quadrature by
z x one run's noise); for runs sealed before that rule existed this is a post-hoc re-scoring,
labelled as such in the column name. `law_alone` is the law's own point, which a seal corrected by
the design's measured bias (hero.point_correction) keeps beside its sealed one.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import yaml

from delphi.prereg.predict import predict_final
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
DEFAULT_DIRS = sorted(p for p in HERE.glob("20*-v*-*") if p.is_dir())  # every archived run still on disk


def stage_seconds(run: Path, stage: str) -> float | None:
    path = run / "stages" / f"{stage}.json"
    return json.loads(path.read_text()).get("seconds") if path.is_file() else None


def study_seconds(run: Path, stages: list[str], ladder_s: float | None) -> float | None:
    """The stages' seconds summed; None for a run archived without its stage markers."""
    seconds = [t for t in (stage_seconds(run, s) for s in stages) if t is not None]
    return sum(seconds) + (ladder_s or 0.0) if seconds or ladder_s is not None else None


def code_commit(run: Path) -> str | None:
    """The commit the study ran, as its sealed preregistration recorded it (short); None when unknown."""
    path = run / "preregistration.yaml"
    if not path.is_file():
        return None
    commit = (yaml.safe_load(path.read_text()).get("toolkit") or {}).get("git_commit")
    return commit[:7] if commit else None


def merged(rows: list[dict], out: Path) -> tuple[list[dict], list[str]]:
    """`rows` merged into the table at `out`: existing rows first (updated in place), new ones after."""
    old = list(csv.DictReader(out.open(newline=""))) if out.is_file() else []
    fields = list(dict.fromkeys([*(old[0].keys() if old else ()), *(k for row in rows for k in row)]))
    by_run = {row["run"]: row for row in rows}
    # What the directory cannot tell (None, e.g. a ladder's seconds noted by hand) keeps the table's value.
    table = [old_row | {k: v for k, v in by_run.pop(old_row["run"], {}).items() if v is not None} for old_row in old]
    return table + list(by_run.values()), fields


def summarize(run: Path) -> dict:
    study = json.loads((run / "study.json").read_text())["study"]
    gates = json.loads((run / "gates.json").read_text())
    sealed = gates["prediction"]
    final, _ = predict_final(
        run / "fits" / f"{study['primary_fit']}.json", load_train_config(run / "hero.yaml"), run / "results.csv"
    )
    ladder_s = stage_seconds(run, "ladder_first_invocation") or stage_seconds(run, "ladder")
    stages = [p.stem for p in (run / "stages").glob("*.json") if p.stem not in ("ladder", "ladder_first_invocation")]
    row = {
        "run": run.name,
        "code_commit": code_commit(run),
        "edition": run.name.split("-v")[1].split("-")[0],
        "study_seed": study["seed"],
        "primary_fit": study["primary_fit"],
        "tolerance": study["hero"]["tolerance"],
        "gates_passed": gates["passed"],
        "gates_failed": ";".join(gates["failed"]),
        "predicted": sealed["loss"],
        "sealed_90_lo": sealed["loss_90"][0],
        "sealed_90_hi": sealed["loss_90"][1],
        "sealed_50_lo": sealed["loss_50"][0],
        "sealed_50_hi": sealed["loss_50"][1],
        # The law's own point where the seal corrected it (hero.point_correction, edition 7 on).
        "law_alone": (sealed.get("uncorrected") or sealed)["loss"],
        "predictive_90_lo_post_hoc": final["loss_90"][0],
        "predictive_90_hi_post_hoc": final["loss_90"][1],
        "seed_noise_nats": final.get("seed_noise_nats"),
        "ladder_s": ladder_s,
        "study_s": study_seconds(run, stages, ladder_s),
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
        "law_alone_rel_error": actual / (sealed.get("uncorrected") or sealed)["loss"] - 1,
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
        table, fields = merged(rows, args.out)
        tmp = args.out.with_name(args.out.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table)
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
