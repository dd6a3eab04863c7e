"""The constants of `delphi.ladder.wall_estimate.estimate_wall_s`, refitted on completed runs.

    .venv/bin/python benchmarks/wall_estimate.py RUNS_PARENT [RUNS_PARENT ...] [--out DIR]

Hypothesis: a run's wall on one pinned worker is steps x a fixed per-step overhead (dispatch, host
batches, logging) plus its FLOPs at one rate per worker, plus a fixed cost outside training (compile,
evaluations, checkpoints). The first constants came from paper/v2-v7 (4.2 ms/step, 46.2 GFLOP/s per
worker, 22 s per run) and planned the eighth edition's stages about 3x short on the 2-core AMD EPYC.

Method: every `RUNS_PARENT/runs/*/summary.json` with status completed (a ladder directory, a recipe
check's, or an unpacked edition's); least squares train_s = steps x overhead + flops / rate (no
intercept), then fixed = mean(wall_time_s - train_s). The fit's own total against the runs' total wall
is printed beside the old constants', as a ratio. The CPU model is stated with the figures: they hold
for the machine they were measured on (two workers at once, as the runner trains).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from machine import cpu_model, uptime

from delphi.ladder.wall_estimate import RUN_FIXED_S, STEP_OVERHEAD_S, WORKER_FLOPS_PER_S


def completed_runs(parents: list[Path]) -> list[dict]:
    rows = []
    for parent in parents:
        for path in sorted(parent.glob("runs/*/summary.json")):
            s = json.loads(path.read_text())
            if s.get("status") == "completed":
                rows.append(
                    {
                        "source": str(parent),
                        "run": path.parent.name,
                        "steps": s["steps"],
                        "flops": s["flops"],
                        "train_s": s["train_s"],
                        "wall_s": s["wall_time_s"],
                    }
                )
    return rows


def fit(rows: list[dict]) -> dict[str, float]:
    design = np.array([[r["steps"], r["flops"]] for r in rows], float)
    (per_step_s, s_per_flop), *_ = np.linalg.lstsq(design, np.array([r["train_s"] for r in rows]), rcond=None)
    fixed_s = float(np.mean([r["wall_s"] - r["train_s"] for r in rows]))
    return {"step_overhead_s": float(per_step_s), "worker_flops_per_s": float(1 / s_per_flop), "run_fixed_s": fixed_s}


def total_s(rows: list[dict], c: dict[str, float]) -> float:
    return sum(
        r["steps"] * c["step_overhead_s"] + r["flops"] / c["worker_flops_per_s"] + c["run_fixed_s"] for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parents", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = completed_runs(args.parents)
    if len(rows) < 3:
        print(f"{len(rows)} completed runs under {', '.join(map(str, args.parents))}: need >= 3", file=sys.stderr)
        return 2
    new = fit(rows)
    old = {"step_overhead_s": STEP_OVERHEAD_S, "worker_flops_per_s": WORKER_FLOPS_PER_S, "run_fixed_s": RUN_FIXED_S}
    wall = sum(r["wall_s"] for r in rows)
    result = {
        "cpu_model": cpu_model(),
        "uptime": uptime(),
        "runs": len(rows),
        "sources": sorted({r["source"] for r in rows}),
        "fitted": new,
        "current": old,
        "wall_s": wall,
        "fitted_over_actual": total_s(rows, new) / wall,
        "current_over_actual": total_s(rows, old) / wall,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "wall_estimate.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
