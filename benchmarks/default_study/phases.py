"""Where a study's ladder spent its worker time: compile, train, eval, checkpoint, the rest.

    .venv/bin/python benchmarks/default_study/phases.py STUDY_DIR [STUDY_DIR ...] [--json OUT.json]

Reads the ladder stage's `rung_times` (each rung's wall time as its worker saw it) from
STUDY_DIR/stages/ladder.json and each rung's STUDY_DIR/ladder/runs/RUN/summary.json
(`compile_s`, `train_s`, `eval_s`, `checkpoint_s`); "other" is the rest of the rung's wall:
process start-up, model init, data. Shares are of the summed rung wall (worker-seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PHASES = {"compile": "compile_s", "train": "train_s", "eval": "eval_s", "checkpoint": "checkpoint_s"}


def phases(study: Path) -> dict:
    ladder = json.loads((study / "stages" / "ladder.json").read_text())["result"]
    seconds = dict.fromkeys(PHASES, 0.0)
    rung_wall = 0.0
    for run_id, times in ladder["rung_times"].items():
        summary = json.loads((study / "ladder" / "runs" / run_id / "summary.json").read_text())
        rung_wall += times["wall_s"]
        for phase, key in PHASES.items():
            seconds[phase] += summary[key]
    seconds["other"] = rung_wall - sum(seconds.values())
    return {
        "study": str(study),
        "ladder_wall_s": ladder["wall_s"],
        "workers": ladder["workers"],
        "gflops_per_s": ladder["flops_total"] / ladder["wall_s"] / 1e9,
        "rung_wall_s": rung_wall,
        "seconds": seconds,
        "share": {k: v / rung_wall for k, v in seconds.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [phases(s) for s in args.studies]
    for r in rows:
        shares = "  ".join(f"{k} {v:.1%}" for k, v in r["share"].items())
        print(f"{r['study']}: ladder {r['ladder_wall_s']:.0f} s, {r['gflops_per_s']:.1f} GFLOP/s; {shares}")
    if args.json:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
