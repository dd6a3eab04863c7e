"""Whole-ladder throughput on this machine (issue 11), in one run.

    .venv/bin/python benchmarks/ladder.py [--json OUT.json] [--ladders default,paper-min]
        [--budgets-default 3.6e11] [--seeds-default 0] [--rungs-default 3] [--rungs-paper 2]
        [--levers baseline,warm_cache,unpinned,one_shot,one_worker,group_seeds]

1. The f32 matmul peak of this machine, measured in this process (delphi.train.peak).
2. Each ladder planned into a temporary directory and run through the real runner
   (`delphi.ladder.runner.run_ladder`) with the default worker settings and a cold
   compilation cache:
   - `default`: the default study's ladder (delphi/defaults/ladder_default.yaml), all of
     it, or a reduced copy (--budgets-default, --seeds-default, --rungs-default: that many
     rungs spread over the ladder);
   - `paper-min`: the new paper's smallest budget (1e12 FLOPs, MoE 8x top-2, d_model 24-64,
     >= 3 layers, one seed; issue 10), all its rungs or --rungs-paper of them.
   Reported: aggregate model FLOP/s (the ladder's exact FLOPs over its wall time) as a
   fraction of the peak, and every rung's wall split into start-up, compile, train, eval
   and checkpoint (+ logging), from its run directory (see `rung_phases`).
3. One rung of the first ladder run (the issue's C1e11_d12 if it has it, else its median
   rung) run alone, also through the runner with its defaults (so on every core):
   `inside_over_alone`.
4. The levers, each against a baseline run in this invocation on a small ladder (the
   default ladder's recipe at 1e11 FLOPs: 3 sizes of >= 500 steps): a warm compilation
   cache, no core pinning (every
   worker's XLA sees every core: the old oversubscription), a fresh process per rung
   instead of persistent workers, one worker with all cores. Gains are wall-time ratios.
   `group_seeds`: the levers' ladder with GROUP_SEEDS seeds per cell, run with the seeds of a
   cell trained as one vmapped job (--group-seeds) and with every rung alone (the default),
   each from a cold compilation cache; gain = alone wall / grouped wall, and the largest
   relative difference of a rung's final val loss between the two.

Speed figures are ratios against baselines measured in the same run; the CPU model,
its flags and the load average (uptime) before and after are in the output, because
the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from machine import machine, uptime  # benchmarks/machine.py; ladder_bench().machine() in other scripts

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LADDER = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
ALONE_RUNG = "C1e11_d12_L2_E8k2_s0"  # issue 11: 43 s alone, 76 s inside the default ladder
# The new paper's smallest budget (issue 10): 1e12 FLOPs, so its smallest model has d_model >= 24
# and >= 3 layers; widths 24-64 span 5.3x in N, below the default min_span of 8 (a benchmark, not a fit).
PAPER_MIN_BUDGET = 1.0e12
PAPER_MIN_WIDTHS = [24, 28, 32, 40, 48, 56, 64]
PAPER_MIN_LAYERS = 3
PAPER_MIN_SPAN = 5.0
# Issue 10's health bounds for the new paper's rungs: >= 10 evaluations on >= 1M validation tokens.
HEALTH_EVALS, HEALTH_EVAL_TOKENS = 10, 1_000_000
EVAL_SHARE_LIMIT = 0.05  # issue 11: evals and checkpoints <= 5% of a rung
TARGET_FRACTION_OF_PEAK = 0.40
TARGET_INSIDE_OVER_ALONE = 1.10
# The levers' ladder: the default recipe shrunk to 3 rungs of 1e11 FLOPs (>= 500 steps each).
LEVER_BUDGET = 1.0e11
LEVER_SIZES, LEVER_SPAN, LEVER_MIN_STEPS = 3, 4.0, 500
LEVERS = ("baseline", "warm_cache", "unpinned", "one_shot", "one_worker", "group_seeds")
GROUP_SEEDS = [0, 1]  # the group_seeds lever: seeds per cell


def default_raw(budgets: list[float] | None = None, seeds: list[int] | None = None) -> dict:
    raw = yaml.safe_load(DEFAULT_LADDER.read_text())
    if budgets:
        raw["budgets"] = budgets
    if seeds:
        raw["run"].update(seeds=seeds, top_seeds=[])
    return raw


def lever_raw(seeds: list[int] | None = None) -> dict:
    raw = default_raw([LEVER_BUDGET], seeds or [0])
    raw["isoflop"].update(sizes=LEVER_SIZES, span=LEVER_SPAN, min_span=1.0)
    raw["batch"]["min_steps"] = LEVER_MIN_STEPS
    return raw


def paper_min_raw() -> dict:
    raw = default_raw([PAPER_MIN_BUDGET], [0])
    raw.update(name="paper-min")
    raw["shape"]["widths"] = PAPER_MIN_WIDTHS
    raw["shape"]["depth"]["min_layers"] = PAPER_MIN_LAYERS
    raw["isoflop"]["min_span"] = PAPER_MIN_SPAN
    return raw


def plan(raw: dict, out: Path, keep: int | None = None, only: str | None = None) -> list[dict]:
    """Plan `raw` into `out`; keep `keep` rungs spread over the ladder (or only the rung `only`)."""
    from delphi.ladder.manifest import write_ladder
    from delphi.ladder.plan import plan_ladder
    from delphi.ladder.spec import ladder_spec_from_dict

    spec = ladder_spec_from_dict(raw)
    rungs = plan_ladder(spec)
    if only is not None:
        rungs = [r for r in rungs if r.run_id == only]
    elif keep is not None and keep < len(rungs):
        step = (len(rungs) - 1) / max(keep - 1, 1)
        rungs = [rungs[round(i * step)] for i in range(keep)]
    return write_ladder(spec, rungs, out)


def rung_phases(run_dir: Path, placed_at: float, rung_wall_s: float) -> dict:
    """A rung's wall split from what its run directory records (nothing in the trainer changes):

    compile  summary.json compile_s (AOT compile of the train chunk and eval step, first batches)
    train    the loop's time inside training calls: tokens / summary tokens_per_s
    eval     the sum of eval_s over metrics rows
    checkpoint  the rest of the loop's wall (summary wall_time_s): checkpoints, metrics and status
             writes, host syncs
    startup  placement by the runner to the loop's start (first row's `time` - `wall_s`), less
             compile: worker process start and imports (first rung of a worker), config, store,
             model and optimizer init, the trainer's matmul-peak measurement (once per process)
    exit     the loop's end to the runner seeing the outcome
    """
    from delphi.train.rundir import read_metrics

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    loop_start = rows[0]["time"] - rows[0]["wall_s"]
    loop_s = float(summary["wall_time_s"])
    train_s = float(summary["tokens"]) / float(summary["tokens_per_s"])
    eval_s = sum(float(r.get("eval_s") or 0.0) for r in rows)
    compile_s = float(summary["compile_s"])
    phases = {
        "startup_s": loop_start - compile_s - placed_at,
        "compile_s": compile_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "checkpoint_s": loop_s - train_s - eval_s,
        "exit_s": placed_at + rung_wall_s - loop_start - loop_s,
    }
    out = {k: round(v, 3) for k, v in phases.items()}
    out["wall_s"] = round(rung_wall_s, 3)
    out["eval_share"] = round(eval_s / rung_wall_s, 4)
    out["checkpoint_share"] = round(phases["checkpoint_s"] / rung_wall_s, 4)
    out["fixed_share"] = round((phases["startup_s"] + compile_s + phases["exit_s"]) / rung_wall_s, 4)
    out["flops"] = float(summary["flops"])
    out["model_gflops_in_train"] = round(float(summary["flops"]) / train_s / 1e9, 3)
    out["evals"] = sum(1 for r in rows if r.get("val_loss") is not None)
    return out


def run_one(name: str, ladder_dir: Path, cache: Path | None, peak: float, **options) -> dict:
    """One ladder through the real runner; its aggregate rate and every rung's phases."""
    from delphi.ladder.runner import run_ladder
    from delphi.train.environment import JAX_CACHE_ENV

    os.environ[JAX_CACHE_ENV] = str(cache) if cache is not None else "off"
    print(f"[bench] {name}: {ladder_dir.name} {options or ''} ({uptime()})", file=sys.stderr, flush=True)
    load_before = uptime()
    summary = run_ladder(ladder_dir, progress=False, **options)
    if summary["failed"] or summary["completed"] != summary["rungs"]:
        raise SystemExit(f"{name}: the ladder did not complete: {summary}")
    rungs = {
        run_id: rung_phases(ladder_dir / "runs" / run_id, t["placed_at"], t["wall_s"])
        for run_id, t in summary["rung_times"].items()
    }
    rate = summary["flops_total"] / summary["wall_s"]
    result = {
        "name": name,
        "options": options,
        "uptime_before": load_before,
        "uptime_after": uptime(),
        "workers": summary["workers"],
        "cores_per_worker": summary["cores_per_worker"],
        "rungs": len(rungs),
        "flops_total": summary["flops_total"],
        "wall_s": summary["wall_s"],
        "aggregate_gflops": round(rate / 1e9, 3),
        "aggregate_fraction_of_peak": round(rate / peak, 4),
        "compile_s_total": round(sum(r["compile_s"] for r in rungs.values()), 3),
        "startup_s_total": round(sum(r["startup_s"] for r in rungs.values()), 3),
        "eval_share_max": max(r["eval_share"] for r in rungs.values()),
        "checkpoint_share_max": max(r["checkpoint_share"] for r in rungs.values()),
        "per_rung": rungs,
    }
    print(
        f"[bench] {name}: {result['flops_total']:.3g} FLOPs in {result['wall_s']:.1f} s = "
        f"{result['aggregate_gflops']:.1f} GFLOP/s = {result['aggregate_fraction_of_peak']:.1%} of the f32 peak",
        file=sys.stderr,
        flush=True,
    )
    return result


def health_eval_share(ladder_dir: Path) -> dict:
    """What issue 10's eval bounds (10 evals x 1M tokens) would cost these rungs: eval forward
    FLOPs (1/3 of a training token's) over the rung's training FLOPs."""
    from delphi.ladder.manifest import read_manifest
    from delphi.model.flops import flops_per_token
    from delphi.train.config import load_train_config

    shares = {}
    for row in read_manifest(ladder_dir):
        cfg = load_train_config(ladder_dir / row["config"])
        eval_flops = HEALTH_EVALS * HEALTH_EVAL_TOKENS * flops_per_token(cfg.model, cfg.data.seq_len) / 3
        shares[row["run_id"]] = round(eval_flops / float(row["flops"]), 3)
    return shares


def phase_table(result: dict) -> str:
    lines = [
        f"  {'rung':24s} {'wall':>7s} {'start':>6s} {'comp':>6s} {'train':>7s} {'eval':>6s} {'ckpt':>6s} {'GF/s':>6s}"
    ]
    for run_id, r in sorted(result["per_rung"].items(), key=lambda kv: -kv[1]["flops"]):
        lines.append(
            f"  {run_id:24s} {r['wall_s']:7.1f} {r['startup_s']:6.1f} {r['compile_s']:6.1f} "
            f"{r['train_s']:7.1f} {r['eval_s']:6.2f} {r['checkpoint_s']:6.2f} {r['model_gflops_in_train']:6.2f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--ladders",
        default="default,paper-min",
        help="comma-separated: default, paper-min, lever (the levers' small ladder: then also their baseline)",
    )
    parser.add_argument(
        "--budgets-default",
        default="",
        help="run only these budgets of the default ladder (a reduced copy; default: all)",
    )
    parser.add_argument("--seeds-default", default="", help="run only these seeds of the default ladder")
    parser.add_argument("--rungs-default", type=int, default=None, help="run only this many default rungs")
    parser.add_argument("--rungs-paper", type=int, default=None, help="run only this many paper-min rungs")
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated subset of {LEVERS}, or none")
    parser.add_argument("--no-alone", action="store_true", help="skip the rung-alone measurement")
    parser.add_argument("--keep", help="keep the ladder dirs under this directory (default: a temporary one)")
    args = parser.parse_args()
    ladders = [x for x in args.ladders.split(",") if x]
    levers = [x for x in args.levers.split(",") if x and x != "none"]
    unknown = [x for x in levers if x not in LEVERS] + [
        x for x in ladders if x not in ("default", "paper-min", "lever")
    ]
    if unknown:
        parser.error(f"unknown ladder or lever: {unknown}")
    budgets = [float(b) for b in args.budgets_default.split(",") if b]
    seeds = [int(x) for x in args.seeds_default.split(",") if x]

    from delphi.train.peak import measure_matmul_flops

    started = time.perf_counter()
    out: dict = {"machine": machine(), "uptime_before": uptime()}
    print(
        f"[bench] {out['machine']['cpu_model']}, {out['machine']['cpus']} CPUs; {out['uptime_before']}",
        file=sys.stderr,
        flush=True,
    )
    peak = max(measure_matmul_flops("f32", 1024), measure_matmul_flops("f32", 2048, repeats=3))
    out["peak_f32_flops"] = peak
    print(
        f"[bench] f32 matmul peak {peak / 1e9:.1f} GFLOP/s (all {out['machine']['cpus']} CPUs)",
        file=sys.stderr,
        flush=True,
    )

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="delphi-bench-ladder-"))
    tmp.mkdir(parents=True, exist_ok=True)
    caches = tmp / "jax-caches"

    out["ladders"] = {}
    raws = {"default": default_raw(budgets, seeds), "paper-min": paper_min_raw(), "lever": lever_raw()}
    keeps = {"default": args.rungs_default, "paper-min": args.rungs_paper, "lever": None}
    for name in ladders:
        ladder_dir = tmp / name
        plan(raws[name], ladder_dir, keep=keeps[name])
        result = run_one(name, ladder_dir, caches / name, peak)
        result["eval_share_at_health_bounds"] = health_eval_share(ladder_dir)
        out["ladders"][name] = result
        print(phase_table(result), file=sys.stderr, flush=True)

    if not args.no_alone and ladders:
        inside_ladder = ladders[0]
        inside = out["ladders"][inside_ladder]["per_rung"]
        rung_id = (
            ALONE_RUNG if ALONE_RUNG in inside else sorted(inside, key=lambda k: inside[k]["flops"])[len(inside) // 2]
        )
        alone_dir = tmp / "alone"
        plan(raws[inside_ladder], alone_dir, only=rung_id)
        alone = run_one("alone", alone_dir, caches / "alone", peak)
        out["alone"] = {
            "ladder": inside_ladder,
            "run_id": rung_id,
            "inside": inside[rung_id],
            "alone": alone["per_rung"][rung_id],
            "alone_cores": alone["cores_per_worker"][0],
            "inside_over_alone": round(inside[rung_id]["wall_s"] / alone["per_rung"][rung_id]["wall_s"], 3),
            "inside_over_alone_train_only": round(
                inside[rung_id]["train_s"] / alone["per_rung"][rung_id]["train_s"], 3
            ),
        }
        print(
            f"[bench] {rung_id}: inside {inside[rung_id]['wall_s']:.1f} s, alone {alone['wall_s']:.1f} s "
            f"on {out['alone']['alone_cores']} cores: inside/alone {out['alone']['inside_over_alone']:.2f}",
            file=sys.stderr,
            flush=True,
        )

    if levers:
        runs = {"baseline": out["ladders"]["lever"]} if "lever" in out["ladders"] else {}
        options = {
            "baseline": {},
            "warm_cache": {},
            "unpinned": {"pin_cores": False},
            "one_shot": {"persistent_workers": False},
            "one_worker": {"workers": 1},
        }
        seed_runs: dict[str, dict] = {}
        if "group_seeds" in levers:
            for mode, grouped in (("grouped", True), ("alone", False)):
                ladder_dir = tmp / f"lever-group_seeds-{mode}"
                plan(lever_raw(GROUP_SEEDS), ladder_dir)
                seed_runs[mode] = run_one(
                    f"lever group_seeds {mode}", ladder_dir, caches / ladder_dir.name, peak, group_seeds=grouped
                )
                seed_runs[mode]["val_loss"] = {
                    run_id: json.loads((ladder_dir / "runs" / run_id / "summary.json").read_text())["val_loss"]
                    for run_id in seed_runs[mode]["per_rung"]
                }
        others = [x for x in levers if x not in ("baseline", "group_seeds")]
        for lever in ["baseline"] + others if others or "baseline" in levers else []:
            if lever in runs:
                continue
            ladder_dir = tmp / f"lever-{lever}"
            plan(lever_raw(), ladder_dir)
            baseline_cache = caches / ("lever" if "lever" in out["ladders"] else "lever-baseline")
            cache = baseline_cache if lever == "warm_cache" else caches / f"lever-{lever}"
            runs[lever] = run_one(f"lever {lever}", ladder_dir, cache, peak, **options[lever])
        base = runs.get("baseline")
        out["levers"] = {
            lever: {
                "wall_s": r["wall_s"],
                "aggregate_fraction_of_peak": r["aggregate_fraction_of_peak"],
                # > 1: the default (baseline) is that much faster than running without the lever
                "gain": round(r["wall_s"] / base["wall_s"], 3) if lever != "warm_cache" else None,
                "compile_s_total": r["compile_s_total"],
                "startup_s_total": r["startup_s_total"],
                "median_rung_train_gflops": statistics.median(
                    x["model_gflops_in_train"] for x in r["per_rung"].values()
                ),
                "uptime_before": r["uptime_before"],
                "per_rung": r["per_rung"],
            }
            for lever, r in runs.items()
        }
        if seed_runs:
            grouped, alone = seed_runs["grouped"], seed_runs["alone"]
            out["levers"]["group_seeds"] = {
                "seeds": GROUP_SEEDS,
                "wall_s": grouped["wall_s"],
                "alone_wall_s": alone["wall_s"],
                "gain": round(alone["wall_s"] / grouped["wall_s"], 3),  # > 1: grouping seeds is faster
                "aggregate_fraction_of_peak": grouped["aggregate_fraction_of_peak"],
                "alone_aggregate_fraction_of_peak": alone["aggregate_fraction_of_peak"],
                "workers": grouped["workers"],
                "alone_workers": alone["workers"],
                "compile_s_total": grouped["compile_s_total"],
                "startup_s_total": grouped["startup_s_total"],
                "median_rung_train_gflops": statistics.median(
                    x["model_gflops_in_train"] for x in grouped["per_rung"].values()
                ),
                "val_loss_max_relative_difference": max(
                    abs(grouped["val_loss"][k] - v) / abs(v) for k, v in alone["val_loss"].items()
                ),
                "uptime_before": grouped["uptime_before"],
                "alone_uptime_before": alone["uptime_before"],
                "per_rung": grouped["per_rung"],
                "alone_per_rung": alone["per_rung"],
            }
        if "warm_cache" in runs:
            warm = out["levers"]["warm_cache"]
            warm["gain"] = round(base["wall_s"] / runs["warm_cache"]["wall_s"], 3)  # > 1: the warm cache is faster
            warm["compile_cold_over_warm"] = round(
                base["compile_s_total"] / max(runs["warm_cache"]["compile_s_total"], 1e-9), 2
            )
        for lever, r in out["levers"].items():
            print(
                f"[bench] lever {lever:11s}: {r['wall_s']:6.1f} s, gain {r['gain']}, compile {r['compile_s_total']:.1f} s, "
                f"start-up {r['startup_s_total']:.1f} s, median rung {r['median_rung_train_gflops']:.2f} GFLOP/s in train",
                file=sys.stderr,
                flush=True,
            )

    # The machine may be shared: the peak again at the end, so a load change during the run shows.
    out["peak_f32_flops_end"] = max(measure_matmul_flops("f32", 1024), measure_matmul_flops("f32", 2048, repeats=3))
    print(f"[bench] f32 matmul peak at the end {out['peak_f32_flops_end'] / 1e9:.1f} GFLOP/s", file=sys.stderr)
    for r in out["ladders"].values():
        r["aggregate_fraction_of_peak_end"] = round(r["aggregate_gflops"] * 1e9 / out["peak_f32_flops_end"], 4)
    out["uptime_after"] = uptime()
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    out["targets"] = {
        "aggregate_fraction_of_peak": {
            name: {
                "value": r["aggregate_fraction_of_peak"],
                "target": TARGET_FRACTION_OF_PEAK,
                "met": r["aggregate_fraction_of_peak"] >= TARGET_FRACTION_OF_PEAK,
            }
            for name, r in out["ladders"].items()
        },
    }
    if "alone" in out:
        value = out["alone"]["inside_over_alone"]
        out["targets"]["inside_over_alone"] = {
            "value": value,
            "target": TARGET_INSIDE_OVER_ALONE,
            "met": value <= TARGET_INSIDE_OVER_ALONE,
        }
    out["eval_checkpoint_over_limit"] = {
        name: {
            k: {"eval_share": v["eval_share"], "checkpoint_share": v["checkpoint_share"]}
            for k, v in r["per_rung"].items()
            if v["eval_share"] + v["checkpoint_share"] > EVAL_SHARE_LIMIT
        }
        for name, r in out["ladders"].items()
    }
    print(f"[bench] {out['uptime_after']}; {out['bench_wall_s']:.0f} s in all", file=sys.stderr)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
