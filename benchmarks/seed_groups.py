"""Where a seed group pays: every shape of a ladder, one seed against a vmapped group, on one pinned core
(issue 42, "seeds that share a step").

    .venv/bin/python benchmarks/seed_groups.py [--ladder default] [--seeds 2,4] [--calls 8]
        [--max-shapes N] [--json OUT.json]

Hypothesis: the default ladder's smallest shapes train batches of 128-512 tokens, so a step is a
thousand ops too small to fill a core, and several seeds of one rung as one vmapped program (the
trainer's `train_group`; the ladder's `group_seeds`) cost less than the seeds one after another.
Where that holds, the ladder should group seeds; where it does not, it should not.

Method: the ladder is planned in memory (benchmarks/ladder_throughput.py, `delphi ladder plan`);
for each distinct (model, batch) the trainer's own train chunk (`delphi.train.step.make_train_chunk`,
through benchmarks/step_profile.py's `compiled_chunk`) is compiled for one seed and for each group
size, and timed on random tokens: --calls calls after a warm-up, the best of ROUNDS interleaved
rounds. This process is pinned to one core with XLA single-threaded, as every ladder worker runs.
A group pays when its wall time per optimizer step is under `seeds` x one seed's: the figure is
`group_wall_over_seeds_alone` (< 1 pays). Its compile time is reported too, since a ladder compiles
each shape once per job. Every figure is a ratio within this run; the CPU model is in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ladder_throughput  # noqa: E402
from machine import machine  # noqa: E402

ROUNDS = 3  # interleaved rounds (one seed, then each group) per shape; each keeps its fastest


def time_shape(cfg, group_sizes: list[int], calls: int) -> dict:
    """ms per optimizer step of one seed and of each group size (best of ROUNDS), and compile seconds."""
    import step_profile  # imports jax: after main() has set the single-thread XLA_FLAGS

    programs, compile_s = {}, {}
    for n in [1, *group_sizes]:
        start = time.perf_counter()
        programs[n] = list(step_profile.compiled_chunk(cfg, n))  # [chunk, state, tokens, steps per call]
        compile_s[n] = time.perf_counter() - start
    best = {n: float("inf") for n in programs}
    for _ in range(ROUNDS):
        for n, program in programs.items():
            chunk, state, tokens, k = program
            wall, program[1] = step_profile.time_chunk(chunk, state, tokens, calls)
            best[n] = min(best[n], 1e3 * wall / k)
    row = {"ms_per_step_one_seed": round(best[1], 3), "compile_s_one_seed": round(compile_s[1], 1)}
    for n in group_sizes:
        row[f"group{n}"] = {
            "ms_per_step": round(best[n], 3),
            "compile_s": round(compile_s[n], 1),
            "group_wall_over_seeds_alone": round(best[n] / (n * best[1]), 3),
        }
    return row


def flops_weighted(rows: list[dict], group_size: int) -> float:
    """The ladder's wall with every cell grouped over its wall with none, over the shapes timed: each
    shape's ratio weighted by its share of the ladder's FLOPs (its share of the one-seed wall would
    weight by time; the shares differ only by the shapes' rates)."""
    weights = [r["ladder_flops_share"] for r in rows]
    ratios = [r[f"group{group_size}"]["group_wall_over_seeds_alone"] for r in rows]
    return sum(w * x for w, x in zip(weights, ratios)) / sum(weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladder", default="default", choices=ladder_throughput.LADDERS)
    parser.add_argument("--seeds", default="2,4", help="group sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=8, help="timed calls of the train chunk per round")
    parser.add_argument("--max-shapes", type=int, default=None, help="only this many shapes, spread over their cost")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    group_sizes = [int(s) for s in args.seeds.split(",") if s]
    if not group_sizes or min(group_sizes) < 2:
        parser.error(f"--seeds: group sizes of at least 2, got {args.seeds!r}")
    from delphi.train.environment import single_thread_xla_flags  # imports no jax

    os.environ["XLA_FLAGS"] = single_thread_xla_flags(os.environ.get("XLA_FLAGS"))  # before jax starts
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    started = time.perf_counter()
    host = machine()
    print(f"machine: {host}", file=sys.stderr)
    rungs, configs = ladder_throughput.PLANNERS[args.ladder]()
    by_cost = sorted(configs, key=lambda s: ladder_throughput.flops_per_step(rungs, s))
    rows = []
    for shape in ladder_throughput.spread(by_cost, args.max_shapes):
        row = {
            "shape": shape,
            "d_model": configs[shape].model.d_model,
            "batch_tokens": configs[shape].data.batch_size * configs[shape].data.seq_len,
            "ladder_flops_share": sum(r.flops for r in rungs if r.shape == shape) / sum(r.flops for r in rungs),
            **time_shape(configs[shape], group_sizes, args.calls),
        }
        rows.append(row)
        groups = ", ".join(f"{n} seeds {row[f'group{n}']['group_wall_over_seeds_alone']:.2f}" for n in group_sizes)
        print(
            f"{shape}: one seed {row['ms_per_step_one_seed']:.2f} ms/step; group wall / seeds alone: {groups}",
            file=sys.stderr,
            flush=True,
        )
    result = {
        "machine": host,
        "ladder": args.ladder,
        "group_sizes": group_sizes,
        "calls": args.calls,
        "rounds": ROUNDS,
        "rows": rows,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    for n in group_sizes:
        result[f"group{n}_flops_weighted_wall_over_alone"] = round(flops_weighted(rows, n), 3)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_over_alone")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
