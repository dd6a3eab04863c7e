"""The eighth edition's ladder against the fourth's: aggregate model FLOP/s as a fraction of the
same-run f32 matmul peak (issue 29, "Throughput"), in one run.

    .venv/bin/python benchmarks/ladder_throughput.py [--ladders v4,v8] [--steps 32] [--max-shapes N]
        [--workers W] [--out DIR] [--json]

Hypothesis (issue 29): under the fixed-step batch rule larger budgets train larger batches, so the
eighth edition's matrix ops are bigger and its ladder runs nearer the machine's peak than the
fourth's, whose batch was 512-1,024 tokens at every budget. Target: the v8 ladder at >= 25% of the
f32 peak measured in the same run.

1. The ladders' rungs, each with its exact training FLOPs (the manifest's `flops`, `flops_per_token`):
   - v4: the committed manifest and run configs of the fourth edition
     (paper/editions/v4 study/ladder/, unpacked through `delphi.editions.edition_tree`), anchors included;
   - v8: `studies/ladder_paper_v8.yaml` planned by `delphi.ladder.plan.plan_ladder` (what
     `delphi ladder plan` calls), in memory: nothing is written into the repository;
   - default (`--ladders default`, and in benchmarks/trainer.py's table): the built-in study's
     ladder, delphi/defaults/ladder_default.yaml, planned the same way.
2. Every distinct (model, batch) of a ladder gets the real trainer's program: the rung's model and
   optimizer (v4 AdamW, v8 AdamH, with that rung's hyperparameters) and the trainer's train chunk
   (`delphi.train.step.make_train_chunk`, scan over the rung's own steps per call), compiled ahead
   of time; one warm-up call, then at least --steps steps (>= 3 calls) on random token batches.
   Model FLOP/s = flops_per_token x batch tokens / median step time: the manifest's accounting.
   Host-side batches, evals, checkpoints and logging are not timed (benchmarks/ladder.py measures
   whole rungs through the runner).
3. Per ladder, the compute-weighted harmonic mean: ladder FLOPs / sum over rungs of (rung FLOPs /
   its shape's FLOP/s), i.e. the ladder's FLOPs over the wall one worker would take to train it,
   as a fraction of the peak; per budget the same. The per-step overhead is a least-squares line
   ms/step = overhead + GFLOP/step / marginal rate over a ladder's shapes (a crude summary: the
   shapes differ in more than their FLOPs).

Threads: as every ladder worker (`delphi.ladder.runner`), each measuring process is pinned to one
core with a one-thread XLA runtime, and --workers of them (default: one per core this process may
use) share the shapes, longest first. The peak is the f32 matmul of `delphi.train.peak` on
PEAK_MATMUL_SIZE squares, measured by every worker on its core before and after its shapes; the
peak is the largest of these. A ladder of W workers on W cores has W times both the FLOP/s and the
peak, so the fraction is the ladder's on this machine. The CPU model, its flags, jax's version,
XLA_FLAGS and the load average before and after are part of the output: every figure is a ratio
within this run, never against another machine's.

--max-shapes N measures N shapes per ladder spread over their FLOPs per step: a development run,
whose aggregate covers only those shapes' rungs (`coverage`, the share of the ladder's FLOPs), and
is labelled as such in the README it writes.
"""

from __future__ import annotations

import argparse
import datetime
import math
import multiprocessing
import os
import queue
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delphi.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent

V4_EDITION = ROOT / "paper" / "editions" / "v4"
V4_LADDER = Path("study") / "ladder"  # inside the unpacked edition
V8_SPEC = ROOT / "studies" / "ladder_paper_v8.yaml"
DEFAULT_SPEC = ROOT / "delphi" / "defaults" / "ladder_default.yaml"  # what `delphi study` trains without a study file
LADDERS = ("v4", "v8", "default")
TARGET_FRACTION_OF_PEAK = 0.25  # issue 29: the new ladder's aggregate model FLOP/s >= 25% of the f32 peak
# A 2048^2 f32 matmul (17 GFLOP) is well past the size where XLA:CPU's dot reaches its peak on one
# core (delphi.train.peak: 1024 reaches ~90%); 4 chained, best of 5: a few seconds per measurement on a
# quiet core (~12 s on the busy 2-core AMD EPYC of the development runs).
PEAK_MATMUL_SIZE = 2048
PEAK_REPEATS = 5
DEFAULT_STEPS = 32  # optimizer steps timed per shape (at least MIN_TIMED_CALLS calls of the rung's chunk)
MIN_TIMED_CALLS = 3  # a median needs a few samples
WARMUP_CALLS = 1  # after the AOT compile: the first call touches fresh buffers
TOKEN_SEED = 0
RESULTS_FILE = "ladder_throughput.json"
README_FILE = "README.md"


# ---- the ladders' rungs (pure data, no jax)


@dataclass(frozen=True)
class LadderRung:
    ladder: str
    run_id: str
    role: str  # "isoflop" or "anchor" (delphi.ladder.plan.rung_role)
    budget: float
    flops: float  # the manifest's exact training FLOPs of the whole rung
    flops_per_token: float  # the manifest's training FLOPs per token
    batch_tokens: int
    shape: str  # the (model, batch) it trains: what is measured


def shape_label(cfg: "TrainConfig") -> str:
    """A readable name of the (model, batch) a train config compiles to; unique within a ladder
    (checked by `add_shape`)."""
    m = cfg.model
    moe = f"_E{m.moe.experts}k{m.moe.top_k}x{m.moe.d_expert}" if m.moe is not None else ""
    return f"d{m.d_model}_L{m.n_layers}_H{m.n_heads}_ff{m.d_ff}{moe}_b{cfg.data.batch_size}x{cfg.data.seq_len}"


def v4_rungs() -> tuple[list[LadderRung], dict[str, "TrainConfig"]]:
    """The fourth edition's committed ladder: its rungs and one train config per shape."""
    from delphi.editions import edition_tree
    from delphi.ladder.manifest import read_manifest
    from delphi.ladder.plan import rung_role
    from delphi.train.config import load_train_config

    ladder_dir = edition_tree(V4_EDITION) / V4_LADDER
    rungs, configs = [], {}
    for row in read_manifest(ladder_dir):
        label = add_shape(configs, load_train_config(ladder_dir / row["config"]))
        rungs.append(
            LadderRung(
                "v4",
                row["run_id"],
                rung_role(row["run_id"]),
                float(row["budget"]),
                float(row["flops"]),
                float(row["flops_per_token"]),
                int(row["batch_tokens"]),
                label,
            )
        )
    return rungs, configs


def planned_rungs(ladder: str, spec_path: Path) -> tuple[list[LadderRung], dict[str, "TrainConfig"]]:
    """A ladder as `delphi ladder plan SPEC` plans it, in memory: its rungs and one train config per shape."""
    from delphi.ladder.manifest import manifest_row
    from delphi.ladder.plan import plan_ladder, rung_role
    from delphi.ladder.spec import load_ladder_spec

    rungs, configs = [], {}
    for rung in plan_ladder(load_ladder_spec(spec_path)):
        row = manifest_row(rung)
        label = add_shape(configs, rung.train)
        rungs.append(
            LadderRung(
                ladder,
                rung.run_id,
                rung_role(rung.run_id),
                float(row["budget"]),
                float(row["flops"]),
                float(row["flops_per_token"]),
                int(row["batch_tokens"]),
                label,
            )
        )
    return rungs, configs


def v8_rungs() -> tuple[list[LadderRung], dict[str, "TrainConfig"]]:
    """The eighth edition's ladder (studies/ladder_paper_v8.yaml)."""
    return planned_rungs("v8", V8_SPEC)


def default_rungs() -> tuple[list[LadderRung], dict[str, "TrainConfig"]]:
    """The built-in default study's ladder (delphi/defaults/ladder_default.yaml)."""
    return planned_rungs("default", DEFAULT_SPEC)


def add_shape(configs: dict[str, "TrainConfig"], cfg: "TrainConfig") -> str:
    """`cfg`'s shape label, its config kept as the shape's (the first rung's: the optimizer's
    hyperparameters differ between rungs of a shape, its cost does not); a label already naming
    another model or batch is an error (one label would time one program for two)."""
    label = shape_label(cfg)
    kept = configs.setdefault(label, cfg)
    if (kept.model, kept.data.batch_size, kept.data.seq_len, kept.precision, kept.optim.optimizer) != (
        cfg.model,
        cfg.data.batch_size,
        cfg.data.seq_len,
        cfg.precision,
        cfg.optim.optimizer,
    ):
        raise SystemExit(f"ladder_throughput: shape label {label} names two programs ({cfg.name}, {kept.name})")
    return label


def flops_per_step(rungs: Sequence[LadderRung], shape: str) -> float:
    first = next(r for r in rungs if r.shape == shape)
    return first.flops_per_token * first.batch_tokens


def spread(items: list[str], keep: int | None) -> list[str]:
    """`keep` items spread evenly over `items` (first and last included); all when keep is None."""
    if keep is None or keep >= len(items):
        return list(items)
    if keep <= 1:
        return items[len(items) // 2 : len(items) // 2 + 1]
    step = (len(items) - 1) / (keep - 1)
    return [items[round(i * step)] for i in range(keep)]


PLANNERS = {"v4": v4_rungs, "v8": v8_rungs, "default": default_rungs}  # LADDERS' rungs and shape configs


# ---- aggregation (pure)


def aggregate(rungs: Sequence[LadderRung], flops_per_s: dict[str, float], peak_flops_per_s: float) -> dict:
    """The ladder's FLOPs over the wall one worker takes to train the measured rungs at their
    shapes' rates: the compute-weighted harmonic mean of the rates. Rungs of unmeasured shapes
    are left out and `coverage` says what share of the ladder's FLOPs remains."""
    measured = [r for r in rungs if r.shape in flops_per_s]
    total = sum(r.flops for r in rungs)
    covered = sum(r.flops for r in measured)
    wall_s = sum(r.flops / flops_per_s[r.shape] for r in measured)
    rate = covered / wall_s if wall_s > 0 else None  # None, not NaN: the results file stays strict JSON
    return {
        "rungs": len(rungs),
        "rungs_measured": len(measured),
        "shapes": len({r.shape for r in rungs}),
        "shapes_measured": len({r.shape for r in measured}),
        "flops_total": total,
        "flops_measured": covered,
        "coverage": covered / total if total > 0 else None,
        "wall_s_one_worker": wall_s,
        "model_flops_per_s": rate,
        "fraction_of_peak": rate / peak_flops_per_s if rate is not None else None,
        "batch_tokens": sorted({r.batch_tokens for r in rungs}),
    }


def budget_label(rung: LadderRung) -> str:
    return f"{rung.budget:.2g}" if rung.role == "isoflop" else f"{rung.budget:.2g} ({rung.role})"


def per_budget(rungs: Sequence[LadderRung], flops_per_s: dict[str, float], peak_flops_per_s: float) -> dict[str, dict]:
    groups: dict[str, list[LadderRung]] = {}
    for r in sorted(rungs, key=lambda r: (r.role != "isoflop", r.budget)):
        groups.setdefault(budget_label(r), []).append(r)
    return {label: aggregate(group, flops_per_s, peak_flops_per_s) for label, group in groups.items()}


def overhead_fit(points: Sequence[tuple[float, float]]) -> dict | None:
    """Least squares of seconds per step on FLOPs per step over (flops_per_step, s_per_step)
    points: the intercept is a per-step overhead, the slope's inverse the marginal FLOP/s."""
    if len({f for f, _ in points}) < 2:
        return None
    n = len(points)
    mean_f = sum(f for f, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    slope = sum((f - mean_f) * (s - mean_s) for f, s in points) / sum((f - mean_f) ** 2 for f, _ in points)
    return {
        "overhead_ms_per_step": 1e3 * (mean_s - slope * mean_f),
        "marginal_flops_per_s": 1.0 / slope if slope > 0 else None,
        "points": n,
    }


# ---- measuring (in pinned worker processes)


def measure_peak() -> float:
    from delphi.train.peak import measure_matmul_flops

    return measure_matmul_flops("f32", size=PEAK_MATMUL_SIZE, repeats=PEAK_REPEATS)


def measure_shape(cfg: "TrainConfig", steps: int) -> dict:
    """Median seconds per optimizer step of the trainer's compiled train chunk for `cfg`'s model,
    optimizer and batch, on random tokens (the trainer's own functions: init_model, make_optimizer,
    split_model, make_train_chunk, steps_per_call)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from delphi.train.optim import make_optimizer
    from delphi.train.step import TrainState, make_train_chunk, split_model
    from delphi.train.trainer import init_model, steps_per_call

    start = time.perf_counter()
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    graphdef, params, router_bias, other = split_model(init_model(cfg))
    state = TrainState(params, tx.init(params), router_bias, other)
    k = steps_per_call(cfg)
    rng = np.random.default_rng(TOKEN_SEED)
    tokens = jnp.asarray(
        rng.integers(0, cfg.model.vocab_size, (k, cfg.data.batch_size, cfg.data.seq_len + 1)), jnp.int32
    )
    jax.block_until_ready((state, tokens))
    init_s = time.perf_counter() - start
    start = time.perf_counter()
    chunk = make_train_chunk(graphdef, tx, cfg.model).lower(state, tokens).compile()
    compile_s = time.perf_counter() - start
    for _ in range(WARMUP_CALLS):
        state, out = chunk(state, tokens)
        jax.block_until_ready(out)
    calls = max(MIN_TIMED_CALLS, math.ceil(steps / k))
    per_call = []
    for _ in range(calls):
        start = time.perf_counter()
        state, out = chunk(state, tokens)
        jax.block_until_ready(out)
        per_call.append(time.perf_counter() - start)
    losses = np.asarray(out["train_loss"])
    return {
        "steps_per_call": k,
        "steps_timed": calls * k,
        "init_s": round(init_s, 3),
        "compile_s": round(compile_s, 3),
        "s_per_step": statistics.median(per_call) / k,
        "s_per_step_min": min(per_call) / k,
        "s_per_step_max": max(per_call) / k,
        "train_loss_finite": bool(np.all(np.isfinite(losses))),
    }


def worker(core: int, jobs: Any, results: Any, steps: int) -> None:
    """One measuring process, pinned to `core` (its XLA runtime is single-threaded through
    XLA_FLAGS, set before it started): peak, shapes from `jobs` until None, peak again."""
    os.sched_setaffinity(0, {core})
    try:
        results.put(("peak", core, {"when": "before", "flops_per_s": measure_peak()}))
        while (job := jobs.get()) is not None:
            ladder, shape, cfg = job
            results.put(("shape", core, {"ladder": ladder, "shape": shape, **measure_shape(cfg, steps)}))
        results.put(("peak", core, {"when": "after", "flops_per_s": measure_peak()}))
    except BaseException:
        results.put(("error", core, traceback.format_exc()))
    results.put(("done", core, None))


def worker_xla_flags() -> str:
    """The measuring workers' XLA_FLAGS: this process's, with XLA:CPU single-threaded."""
    from delphi.train.environment import single_thread_xla_flags

    return single_thread_xla_flags(os.environ.get("XLA_FLAGS"))


def run_workers(jobs: list[tuple[str, str, "TrainConfig"]], workers: int, steps: int) -> tuple[list[dict], list[dict]]:
    """(peaks, shape timings) from `workers` pinned single-thread processes sharing `jobs`; the
    workers start with `worker_xla_flags()`, this process's environment is left as it was."""
    cpus = sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: XLA reads XLA_FLAGS at its start
    job_queue, result_queue = ctx.Queue(), ctx.Queue()
    for job in jobs:
        job_queue.put(job)
    for _ in range(workers):
        job_queue.put(None)
    procs = [
        ctx.Process(target=worker, args=(cpus[i % len(cpus)], job_queue, result_queue, steps), daemon=True)
        for i in range(workers)
    ]
    saved_flags = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = worker_xla_flags()  # a spawned process inherits the environment at its start
    try:
        for p in procs:
            p.start()
    finally:
        if saved_flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved_flags
    peaks, shapes, errors, done = [], [], [], 0
    try:
        while done < workers:
            try:
                kind, core, payload = result_queue.get(timeout=5.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    raise SystemExit(
                        "ladder_throughput: every worker exited before reporting (killed for memory?)"
                    ) from None
                continue
            if kind == "peak":
                peaks.append({"core": core, **payload})
                print(
                    f"[throughput] core {core}: f32 peak {payload['when']} {payload['flops_per_s'] / 1e9:.1f} GFLOP/s",
                    file=sys.stderr,
                    flush=True,
                )
            elif kind == "shape":
                shapes.append({"core": core, **payload})
                print(
                    f"[throughput] core {core}: {payload['ladder']} {payload['shape']}: "
                    f"{1e3 * payload['s_per_step']:.2f} ms/step (compile {payload['compile_s']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            elif kind == "error":
                errors.append(payload)
            else:
                done += 1
    finally:
        for p in procs:
            p.join(timeout=10.0)
    if errors:
        raise SystemExit("ladder_throughput: a worker failed:\n" + "\n".join(errors))
    return peaks, shapes


def measure_ladders(
    ladders: Sequence[str], max_shapes: int | None, steps: int, workers: int
) -> tuple[dict[str, list[LadderRung]], list[dict], list[dict]]:
    """(rungs per ladder, peaks, shape timings): the ladders planned, their shapes (or `max_shapes`
    of each, spread over their FLOPs per step) timed by `workers` pinned single-thread processes."""
    rungs: dict[str, list[LadderRung]] = {}
    jobs: list[tuple[str, str, TrainConfig]] = []
    for name in ladders:
        ladder_rungs, configs = PLANNERS[name]()
        rungs[name] = ladder_rungs
        by_cost = sorted(configs, key=lambda s: flops_per_step(ladder_rungs, s))
        chosen = spread(by_cost, max_shapes)
        print(
            f"[throughput] {name}: {len(ladder_rungs)} rungs, {len(configs)} shapes, timing {len(chosen)}",
            file=sys.stderr,
            flush=True,
        )
        jobs += [(name, s, configs[s]) for s in chosen]
    jobs.sort(key=lambda j: -flops_per_step(rungs[j[0]], j[1]))  # longest first: the workers finish together
    peaks, timings = run_workers(jobs, workers, steps)
    return rungs, peaks, timings


# ---- the report


def ladder_bench() -> Any:
    """benchmarks/ladder.py (and through it benchmarks/machine.py: the CPU model, SIMD flags and load)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(1, str(BENCHMARKS))
    import ladder

    return ladder


def machine() -> dict:
    return ladder_bench().machine()


def uptime() -> str:
    return ladder_bench().uptime()


def shape_rows(rungs: Sequence[LadderRung], timings: list[dict], peak: float) -> list[dict]:
    rows = []
    for t in timings:
        mine = [r for r in rungs if r.shape == t["shape"]]
        per_step = flops_per_step(rungs, t["shape"])
        rows.append(
            {
                **t,
                "batch_tokens": mine[0].batch_tokens,
                "flops_per_token": mine[0].flops_per_token,
                "flops_per_step": per_step,
                "model_flops_per_s": per_step / t["s_per_step"],
                "fraction_of_peak": per_step / t["s_per_step"] / peak,
                "rungs": len(mine),
                "ladder_flops_share": sum(r.flops for r in mine) / sum(r.flops for r in rungs),
            }
        )
    return sorted(rows, key=lambda r: r["flops_per_step"])


def ladder_result(rungs: list[LadderRung], timings: list[dict], peak: float) -> dict:
    rates = {t["shape"]: flops_per_step(rungs, t["shape"]) / t["s_per_step"] for t in timings}
    out = {
        "aggregate": aggregate(rungs, rates, peak),
        "per_budget": per_budget(rungs, rates, peak),
        "overhead_fit": overhead_fit([(flops_per_step(rungs, t["shape"]), t["s_per_step"]) for t in timings]),
        "shapes": shape_rows(rungs, timings, peak),
    }
    isoflop = [r for r in rungs if r.role == "isoflop"]
    if len(isoflop) < len(rungs):
        out["aggregate_isoflop_only"] = aggregate(isoflop, rates, peak)
    return out


def gflops(flops_per_s: float | None) -> str:
    return "-" if flops_per_s is None else f"{flops_per_s / 1e9:.1f}"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


def markdown(result: dict) -> str:
    m, dev = result["machine"], result["max_shapes"] is not None
    peaks = ", ".join(f"{p['flops_per_s'] / 1e9:.1f}" for p in result["peaks"])
    lines = [
        f"# Ladder throughput: {' against '.join(reversed(result['ladders']))} ({result['date']}{', DEVELOPMENT RUN: sampled shapes' if dev else ''})",
        "",
    ]
    if dev:
        lines += [
            f"**A development run**: {result['max_shapes']} shape(s) per ladder, {result['steps']} steps each, "
            "on a shared machine; the aggregates cover only the sampled shapes' rungs (`coverage`). "
            "Not the measurement.",
            "",
        ]
    lines += [
        f"CPU: {m['cpu_model']} ({m['cpus']} CPUs usable; {', '.join(m['simd_flags'])}). jax {result['jax']}. "
        f"{result['workers']} worker process(es), each pinned to one core, XLA_FLAGS `{result['xla_flags']}`.",
        f"Load before: `{result['uptime_before']}`; after: `{result['uptime_after']}`.",
        "",
        "    " + result["command"],
        "",
        f"f32 peak: {PEAK_MATMUL_SIZE}x{PEAK_MATMUL_SIZE} matmul on one core, best of {PEAK_REPEATS}, per worker before "
        f"and after its shapes: {peaks} GFLOP/s; "
        f"peak used: **{result['peak_flops_per_s'] / 1e9:.1f} GFLOP/s** per core.",
        "",
        "| ladder | rungs | shapes timed | batch tokens | FLOPs covered | one-worker wall | model GFLOP/s per core | of f32 peak |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, lad in result["ladders"].items():
        for label, a in (("", lad["aggregate"]), (" (isoFLOP rungs only)", lad.get("aggregate_isoflop_only"))):
            if a is None:
                continue
            lines.append(
                f"| {name}{label} | {a['rungs']} | {a['shapes_measured']}/{a['shapes']} | "
                f"{min(a['batch_tokens'])}-{max(a['batch_tokens'])} | {a['coverage']:.0%} of {a['flops_total']:.3g} | "
                f"{a['wall_s_one_worker'] / 3600:.2f} h | {gflops(a['model_flops_per_s'])} | **{percent(a['fraction_of_peak'])}** |"
            )
    if "v8_over_v4" in result:
        lines += ["", f"v8 / v4 aggregate model FLOP/s: **{result['v8_over_v4']:.2f}x**."]
    if "v8_meets_target" in result:
        lines += [
            f"Target (issue 29): v8 >= {TARGET_FRACTION_OF_PEAK:.0%} of the peak: "
            f"**{'met' if result['v8_meets_target'] else 'not met'}**."
        ]
    for name, lad in result["ladders"].items():
        lines += [
            "",
            f"## {name} per budget",
            "",
            "| budget | rungs | batch tokens | shapes timed | model GFLOP/s | of peak |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for label, a in lad["per_budget"].items():
            lines.append(
                f"| {label} | {a['rungs']} | {', '.join(map(str, a['batch_tokens']))} | "
                f"{a['shapes_measured']}/{a['shapes']} | {gflops(a['model_flops_per_s'])} | "
                f"{percent(a['fraction_of_peak'])} |"
            )
        fit = lad["overhead_fit"]
        if fit is not None:
            lines += [
                "",
                f"Per-step overhead (least squares of ms/step on GFLOP/step over {fit['points']} shapes): "
                f"{fit['overhead_ms_per_step']:.2f} ms; marginal rate {gflops(fit['marginal_flops_per_s'])} GFLOP/s.",
            ]
        lines += [
            "",
            "| shape | batch tokens | GFLOP/step | ms/step (min-max) | GFLOP/s | of peak | share of ladder FLOPs | compile s |",
            "|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for s in lad["shapes"]:
            lines.append(
                f"| {s['shape']} | {s['batch_tokens']} | {s['flops_per_step'] / 1e9:.3f} | {1e3 * s['s_per_step']:.2f} "
                f"({1e3 * s['s_per_step_min']:.2f}-{1e3 * s['s_per_step_max']:.2f}) | {s['model_flops_per_s'] / 1e9:.1f} | "
                f"{s['fraction_of_peak']:.1%} | {s['ladder_flops_share']:.1%} | {s['compile_s']:.1f} |"
            )
    lines += ["", f"Benchmark wall: {result['bench_wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def summary_lines(result: dict) -> list[str]:
    out = []
    for name, lad in result["ladders"].items():
        a = lad["aggregate"]
        out.append(
            f"[throughput] {name}: {gflops(a['model_flops_per_s'])} GFLOP/s per core = {percent(a['fraction_of_peak'])} "
            f"of the f32 peak ({a['shapes_measured']}/{a['shapes']} shapes, {a['coverage']:.0%} of its FLOPs; "
            f"one worker {a['wall_s_one_worker'] / 3600:.2f} h)"
        )
    if "v8_over_v4" in result:
        out.append(
            f"[throughput] v8 / v4: {result['v8_over_v4']:.2f}x; target v8 >= {TARGET_FRACTION_OF_PEAK:.0%}: "
            f"{'met' if result['v8_meets_target'] else 'not met'}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladders", default="v4,v8", help=f"comma-separated subset of {LADDERS}")
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"optimizer steps timed per shape (at least {MIN_TIMED_CALLS} calls of the train chunk)",
    )
    parser.add_argument(
        "--max-shapes",
        type=int,
        default=None,
        help="measure only this many shapes per ladder, spread over their FLOPs per step (a dev run)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="pinned single-thread measuring processes (default: one per usable core)",
    )
    parser.add_argument("--out", help="write ladder_throughput.json and README.md into this directory")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = parser.parse_args(argv)
    ladders = [x for x in args.ladders.split(",") if x]
    unknown = [x for x in ladders if x not in LADDERS]
    if unknown or not ladders:
        parser.error(f"--ladders: unknown {unknown or 'empty'}; choose from {LADDERS}")
    if args.steps < 1:
        parser.error(f"--steps: must be >= 1, got {args.steps}")
    if args.max_shapes is not None and args.max_shapes < 1:
        parser.error(f"--max-shapes: must be >= 1, got {args.max_shapes}")
    cpus = len(os.sched_getaffinity(0))
    workers = args.workers if args.workers is not None else cpus
    if workers < 1:
        parser.error(f"--workers: must be >= 1, got {workers}")

    started = time.perf_counter()
    result: dict = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/ladder_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "uptime_before": uptime(),
        "workers": workers,
        "steps": args.steps,
        "max_shapes": args.max_shapes,
    }
    print(
        f"[throughput] {result['machine']['cpu_model']}, {cpus} CPUs, {workers} worker(s); {result['uptime_before']}",
        file=sys.stderr,
        flush=True,
    )
    rungs, peaks, timings = measure_ladders(ladders, args.max_shapes, args.steps, workers)

    import jax  # after the workers: the version only

    peak = max(p["flops_per_s"] for p in peaks)
    result.update(
        jax=jax.__version__, xla_flags=worker_xla_flags(), peaks=peaks, peak_flops_per_s=peak, uptime_after=uptime()
    )
    result["ladders"] = {
        name: ladder_result(rungs[name], [t for t in timings if t["ladder"] == name], peak) for name in ladders
    }
    if "v8" in result["ladders"]:
        result["v8_meets_target"] = result["ladders"]["v8"]["aggregate"]["fraction_of_peak"] >= TARGET_FRACTION_OF_PEAK
    if {"v4", "v8"} <= set(result["ladders"]):
        result["v8_over_v4"] = (
            result["ladders"]["v8"]["aggregate"]["model_flops_per_s"]
            / result["ladders"]["v4"]["aggregate"]["model_flops_per_s"]
        )
    result["bench_wall_s"] = round(time.perf_counter() - started, 1)
    for line in summary_lines(result):
        print(line, file=sys.stderr)
    if args.out:
        from delphi.io import atomic_write_json, atomic_write_text

        out = Path(args.out)
        atomic_write_json(out / RESULTS_FILE, result)
        atomic_write_text(out / README_FILE, markdown(result))
        print(f"[throughput] wrote {out / RESULTS_FILE} and {out / README_FILE}", file=sys.stderr)
    if args.json:
        import json

        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's delphi, not another install's (spawned workers inherit sys.path)
    raise SystemExit(main())
