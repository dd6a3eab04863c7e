"""Does AdamH's optimum relative step size eta stay put across width? (issue 29, item 1)

    .venv/bin/python benchmarks/adamh_width.py [--out DIR] [--widths 32 128] [--etas ...] [--steps 600]

The muP LR sweep of `delphi mup lr-sweep` (delphi.experiments.lrsweep: the same tiny MoE width
family, the real trainer, the same quadratic fit of the final val loss in log2 eta), with
`optim.optimizer: adamh`: the sweep's LR is eta, the relative step of the hidden matrices, and
the plain-Adam groups (embeddings, unembedding, router, gains) train at one fixed adam_lr at
every width. AdamH puts no width term on eta, so if it is width-stable eta* should not move:
slope d log2(eta*) / d log2(width) ~ 0.

Writes DIR/sweep.json (runs, fits, eta* per width, movement) and DIR/summary.txt; the run dirs go
to DIR/runs (not committed). A rerun skips the completed runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_model  # noqa: E402

from delphi.experiments.lrsweep import run_sweep  # noqa: E402
from delphi.experiments.lrsweep_spec import LRSweepSpec  # noqa: E402
from delphi.io import atomic_write_json, atomic_write_text  # noqa: E402

# The grid: 2x apart around a pilot's optimum (300 steps, eta 4e-3, 1.6e-2, 6.4e-2: eta* 0.027 at w32, 0.017 at w64).
DEFAULT_ETAS = (5e-3, 1e-2, 2e-2, 4e-2, 8e-2)
# The plain-Adam groups' LR: the centre of the muP AdamW sweep's grid (delphi.experiments.lrsweep,
# whose pilot put the base-width optimum at 4e-3 to 1e-2 for this family and token budget).
DEFAULT_ADAM_LR = 6e-3
DEFAULT_WIDTHS = (32, 128)
# lrsweep.py: below ~300-1000 steps the final loss is not monotone in LR (early plateau); 600 steps
# of 8 x 64 tokens keeps the whole sweep near ~5 CPU-minutes.
DEFAULT_STEPS = 600


@dataclass(frozen=True)
class AdamHSweepSpec(LRSweepSpec):
    adam_lr: float = DEFAULT_ADAM_LR

    def train_config(self, width: int, lr: float) -> Any:
        cfg = super().train_config(width, lr)
        optim = dataclasses.replace(cfg.optim, optimizer="adamh", lr=lr, adam_lr=self.adam_lr, weight_decay=0.0)
        return dataclasses.replace(cfg, optim=optim).validate()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/2026-12-03-adamh-width"))
    ap.add_argument("--runs", type=Path, default=None, help="run dirs (default: OUT/runs, not committed)")
    ap.add_argument("--widths", type=int, nargs="+", default=list(DEFAULT_WIDTHS))
    ap.add_argument("--etas", type=float, nargs="+", default=list(DEFAULT_ETAS))
    ap.add_argument("--adam-lr", type=float, default=DEFAULT_ADAM_LR)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--seed", type=int, default=0, help="init and data order")
    args = ap.parse_args(argv)

    spec = AdamHSweepSpec(
        widths=tuple(args.widths),
        lrs=tuple(args.etas),
        steps=args.steps,
        ffn="moe",
        adam_lr=args.adam_lr,
        seed=args.seed,
    )
    runs = args.runs or args.out / "runs"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = run_sweep(spec, runs)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    text = result.summary().replace("LR sweep (muP", f"AdamH eta sweep (adam_lr {spec.adam_lr:g}, muP")
    machine = {
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "machine": cpu_model(),
    }
    text += (
        f"\n  (this process: {cpu_s:.0f} CPU-s, {wall_s:.0f} s wall, load average {machine['load_avg'][0]:.1f}"
        f" on {machine['cpus']} cores; a rerun skips completed runs, so only a first run's times are the sweep's)"
    )
    report = {
        **result.to_json(),
        "optimizer": "adamh",
        "adam_lr": spec.adam_lr,
        "machine": machine,
        "command": "benchmarks/adamh_width.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "sweep.json", report)
    atomic_write_text(args.out / "summary.txt", text + "\n")
    print(text)
    print(json.dumps(result.movement))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
