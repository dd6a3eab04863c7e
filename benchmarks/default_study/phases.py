"""Where a ladder spent its worker time: start-up, compile, train, eval, checkpoint, exit.

    .venv/bin/python benchmarks/default_study/phases.py STUDY_DIR [STUDY_DIR ...] [--json OUT.json]
    .venv/bin/python benchmarks/default_study/phases.py --ladder LADDER_DIR --run-json RUN.json [--json OUT.json]

A study's ladder stage records each rung's wall time as its worker saw it (`rung_times` in
STUDY_DIR/stages/ladder.json; for a ladder run by hand, the `delphi ladder run --json` output).
Each rung's wall is split by `benchmarks/ladder.py: rung_phases` from its run directory; shares
are of the summed rung wall (worker-seconds). phases_v4.json came from this script's first
version (commit f7bb308: train = summary train_s, the rest "other"), on ladders no longer on disk.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ladder import rung_phases  # noqa: E402  (benchmarks/ladder.py)

PHASES = ("startup_s", "compile_s", "train_s", "eval_s", "checkpoint_s", "exit_s")


def phases(ladder_dir: Path, run: dict, name: str) -> dict:
    seconds = dict.fromkeys(PHASES, 0.0)
    rung_wall = 0.0
    for run_id, times in run["rung_times"].items():
        split = rung_phases(ladder_dir / "runs" / run_id, times["placed_at"], times["wall_s"])
        rung_wall += split["wall_s"]
        for phase in PHASES:
            seconds[phase] += split[phase]
    return {
        "ladder": name,
        "ladder_wall_s": run["wall_s"],
        "workers": run["workers"],
        "gflops_per_s": run["flops_total"] / run["wall_s"] / 1e9,
        "rung_wall_s": rung_wall,
        "seconds": seconds,
        "share": {k: v / rung_wall for k, v in seconds.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="*", type=Path)
    parser.add_argument("--ladder", type=Path, help="a ladder dir run by hand (with --run-json)")
    parser.add_argument("--run-json", type=Path, help="its `delphi ladder run --json` output")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [
        phases(s / "ladder", json.loads((s / "stages" / "ladder.json").read_text())["result"], str(s))
        for s in args.studies
    ]
    if args.ladder is not None:
        rows.append(phases(args.ladder, json.loads(args.run_json.read_text()), f"{args.ladder} ({args.run_json.name})"))
    for r in rows:
        shares = "  ".join(f"{k[:-2]} {v:.1%}" for k, v in r["share"].items())
        print(f"{r['ladder']}: {r['ladder_wall_s']:.0f} s, {r['gflops_per_s']:.1f} GFLOP/s; {shares}")
    if args.json:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
