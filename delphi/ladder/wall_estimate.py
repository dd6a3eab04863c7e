"""The wall-time model of training runs on the project's 2-core CPUs: per step a fixed overhead plus
the step's FLOPs at a worker's throughput, plus a fixed cost per run (compile, evaluations,
checkpoints). Its constants are refitted on completed runs by benchmarks/wall_estimate.py.
"""

from __future__ import annotations

from delphi.ladder.plan import Rung

# Train time per step = STEP_OVERHEAD_S + FLOPs per step / WORKER_FLOPS_PER_S (one worker), plus
# RUN_FIXED_S per run outside training (the mean); fitted by benchmarks/wall_estimate.py on completed
# runs (AdamH, f32, two workers at once on the 2-core CPU; its results are under benchmarks/results/).
STEP_OVERHEAD_S = 3.9e-3
WORKER_FLOPS_PER_S = 15.1e9
RUN_FIXED_S = 36.0
CPU_WORKERS = 2


def estimate_wall_s(rungs: list[Rung], workers: int = CPU_WORKERS) -> float:
    """Expected wall seconds to train `rungs` on `workers` workers of the project's 2-core CPU."""
    core_s = sum(r.steps * (STEP_OVERHEAD_S + r.flops / r.steps / WORKER_FLOPS_PER_S) + RUN_FIXED_S for r in rungs)
    return core_s / workers
