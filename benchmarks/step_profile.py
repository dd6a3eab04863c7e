"""Where a ladder rung's training step spends its time, and what a vmapped seed group changes (issue 11).

    .venv/bin/python benchmarks/step_profile.py [--rungs C2e11_d12,C8e11_d16,C8e11_d40,C8e11_d56]
        [--seeds 4] [--equality] [--json OUT.json]

Hypothesis (issue 11): at the ladders' smallest shapes a step is bound by per-op dispatch and
memory traffic, so several seeds of a rung trained as one vmapped program cost little more than one.
Method, on one core with XLA single-threaded (what every ladder worker runs with,
`delphi.train.environment.SINGLE_THREAD_XLA_FLAG`):
1. Plan the default study's ladder (`benchmarks/ladder.py`), take the named rungs' configs.
2. For each, compile the trainer's own train chunk (`delphi.train.step.make_train_chunk`, the
   trainer's steps per call) for one seed and for a vmapped group of --seeds seeds; time repeated
   calls: ms per optimizer step and per member.
3. Profile both with `jax.profiler` (XLA:CPU thunk events) and add up the time of every executed
   HLO op by kind (the fused computation's root: dot, reduce, sort, gather, scatter, elementwise)
   and by phase (forward, backward, optimizer and the rest, from each op's `op_name`). A kind whose
   time per member falls towards 1/seeds in the group is dispatch-bound; one near 1 is work-bound.
4. `--equality`: the issue's "a group equals each seed trained alone". The levers' rung
   (benchmarks/ladder.py: C1e11_d12, 1,800 steps) is trained through `train_group` for seeds 0
   and 1 alone and as a group, as MoE and as its dense twin (the FFN of the same active width),
   and the train-loss gap between alone and grouped is reported at every logged step: where it
   first exceeds 1e-5 and how large it ends, with the final val-loss gap.
Expected if the hypothesis holds: group time per member well below one seed's, most of a step in
fixed per-op costs. Figures are ratios within this run; the CPU model and flags are in the output.
"""

from __future__ import annotations

import os

# before jax is imported: the ladder workers' thread settings
from delphi.train.environment import single_thread_xla_flags  # imports no jax

os.environ["XLA_FLAGS"] = single_thread_xla_flags(os.environ.get("XLA_FLAGS"))

import argparse  # noqa: E402
import collections  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ladder as ladder_bench  # noqa: E402

from delphi.train.config import TrainConfig, load_train_config  # noqa: E402

DEFAULT_RUNGS = ("C2e11_d12_L3_E8k2_s0", "C8e11_d16_L3_E8k2_s0", "C8e11_d40_L3_E8k2_s0", "C8e11_d56_L3_E8k2_s0")
EQUALITY_RUNG = "C1e11_d12_L3_E8k2_s0"  # benchmarks/ladder.py's levers ladder: its group_seeds lever's rung
EQUALITY_SEEDS = (0, 1)
EQUALITY_LOG_EVERY = 10
GAP_EPS = 1e-5  # the equality bound (relative)
TIMED_CALLS = 12  # calls of the train chunk per timing (x steps per call optimizer steps)
PROFILED_CALLS = 4
OP_KINDS = ("dot", "reduce", "sort", "gather", "scatter")  # else: elementwise


def rung_configs(names: list[str], out: Path) -> dict[str, TrainConfig]:
    """The named rungs of the default ladder (or of the levers' ladder), planned into `out`."""
    configs = {}
    for raw, sub in ((ladder_bench.default_raw(), "default"), (ladder_bench.lever_raw(), "levers")):
        for row in ladder_bench.plan(raw, out / sub):
            if row["run_id"] in names and row["run_id"] not in configs:
                configs[row["run_id"]] = load_train_config(out / sub / row["config"])
    missing = [n for n in names if n not in configs]
    if missing:
        raise SystemExit(f"--rungs: {missing} are not rungs of the default or the levers' ladder")
    return configs


# ---- timing and profiling one compiled train chunk


def compiled_chunk(cfg: TrainConfig, seeds: int):
    """(compiled train chunk, state, tokens, steps per call) as the trainer builds them; `seeds` > 1: vmapped."""
    import jax.numpy as jnp

    from delphi.train.optim import make_optimizer
    from delphi.train.step import TrainState, make_train_chunk, split_model
    from delphi.train.trainer import init_model, steps_per_call

    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    states = []
    for s in range(seeds):
        graphdef, params, router_bias, other = split_model(init_model(dataclasses.replace(cfg, seed=s)))
        states.append(TrainState(params, tx.init(params), router_bias, other))
    state = states[0] if seeds == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    k = steps_per_call(cfg)
    shape = (k, cfg.data.batch_size, cfg.data.seq_len + 1)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.model.vocab_size, shape if seeds == 1 else (seeds, *shape)), jnp.int32)
    chunk = make_train_chunk(graphdef, tx, cfg.model, seed_axis=seeds > 1).lower(state, tokens).compile()
    return chunk, state, tokens, k


CONTROL_FLOW = ("while", "call", "conditional")  # their events span the ops inside them: not counted


def _instruction(line: str) -> tuple[str, str] | None:
    """(name, opcode) of an HLO instruction line `%name = TYPE opcode(...)`; TYPE may be a tuple."""
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)", line)
    if not m:
        return None
    name, rest = m.groups()
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                rest = rest[i + 1 :]
                break
    else:
        rest = rest.split(" ", 1)[-1]
    op = re.match(r"\s*(\w[\w\-]*)\(", rest)
    return (name, op.group(1)) if op else None


def op_table(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (kind, phase) from the optimised module's text: a fusion is the
    kind of its computation's root; the phase comes from the op_name JAX gave the instruction."""
    lines = hlo_text.splitlines()
    roots: dict[str, str] = {}  # fused computation -> its root opcode
    computation = None
    for line in lines:
        head = re.match(r"%?([\w.\-]+) \(.*\) -> .* \{$", line)
        if head:
            computation = head.group(1)
        instruction = _instruction(line) if line.lstrip().startswith("ROOT") else None
        if instruction and computation:
            roots[computation] = instruction[1]
    table = {}
    for line in lines:
        instruction = _instruction(line)
        if instruction is None or instruction[1] in CONTROL_FLOW:
            continue
        name, opcode = instruction
        called = re.search(r"calls=%([\w.\-]+)", line)
        if opcode == "fusion" and called:
            opcode = roots.get(called.group(1), opcode)
        kind = next((k for k in OP_KINDS if opcode.startswith(k)), "elementwise")
        op_name = re.search(r'op_name="([^"]*)"', line)
        op_name = op_name.group(1) if op_name else ""
        phase = "backward" if "transpose(" in op_name else "forward" if "jvp(" in op_name else "optimizer+other"
        table[name] = (kind, phase)
    return table


def profile(chunk, state, tokens, calls: int) -> tuple[dict, dict, int]:
    """Seconds per call by op kind and by phase, and ops executed per call."""
    table = op_table(chunk.as_text())
    with tempfile.TemporaryDirectory() as tmp:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # XLA's thunks only: the Python tracer slows the host side
        state, out = chunk(state, tokens)  # the first call after the profiler starts is slower: not counted
        with jax.profiler.trace(tmp, create_perfetto_trace=True, profiler_options=options):
            for _ in range(calls):
                state, out = chunk(state, tokens)
            jax.block_until_ready(out)
        traces = list(Path(tmp).rglob("*.trace.json.gz"))
        if not traces:
            return {}, {}, 0
        events = json.load(gzip.open(traces[0]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    by_kind, by_phase, ops = collections.Counter(), collections.Counter(), 0
    for e in events:
        if e.get("ph") == "X" and e.get("name") in table:
            kind, phase = table[e["name"]]
            by_kind[kind] += e.get("dur", 0) / 1e6 / calls
            by_phase[phase] += e.get("dur", 0) / 1e6 / calls
            ops += 1
    return dict(by_kind), dict(by_phase), ops // calls


def time_chunk(chunk, state, tokens, calls: int) -> tuple[float, object]:
    state, out = chunk(state, tokens)  # warm
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(calls):
        state, out = chunk(state, tokens)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls, state


def profile_rung(name: str, cfg: TrainConfig, seeds: int, peak_one_core: float) -> dict:
    from delphi.model.flops import flops_per_token

    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    flops_per_step = flops_per_token(cfg.model, cfg.data.seq_len) * tokens_per_step
    row: dict = {"rung": name, "d_model": cfg.model.d_model, "seeds": seeds, "model_flops_per_step": flops_per_step}
    for n in (1, seeds):
        chunk, state, tokens, k = compiled_chunk(cfg, n)
        wall, state = time_chunk(chunk, state, tokens, TIMED_CALLS)
        by_kind, by_phase, ops = profile(chunk, state, tokens, PROFILED_CALLS)
        per_step = 1e3 / k  # s per call -> ms per optimizer step
        row[f"seeds{n}"] = {
            "ms_per_step": round(wall * per_step, 3),
            "ms_per_member_step": round(wall * per_step / n, 3),
            "ops_per_step": ops // k,
            "profiled_ms_per_step_by_kind": {kd: round(v * per_step, 3) for kd, v in sorted(by_kind.items())},
            "profiled_ms_per_step_by_phase": {ph: round(v * per_step, 3) for ph, v in sorted(by_phase.items())},
            # the profiler adds a few microseconds to every op: shares are the comparable figures
            "profiled_over_timed": round(sum(by_kind.values()) / wall, 2),
            "share_by_kind": {kd: round(v / sum(by_kind.values()), 3) for kd, v in sorted(by_kind.items())},
        }
    one, group = row["seeds1"], row[f"seeds{seeds}"]
    row["model_gflops_one_seed"] = round(flops_per_step / one["ms_per_step"] / 1e6, 2)
    row["fraction_of_one_core_peak"] = round(flops_per_step / (one["ms_per_step"] / 1e3) / peak_one_core, 4)
    row["group_member_over_one"] = round(group["ms_per_member_step"] / one["ms_per_step"], 3)
    row["group_wall_over_one"] = round(group["ms_per_step"] / one["ms_per_step"], 3)
    row["kind_group_over_one"] = {  # time per step of each kind in the group over one seed's (seeds: no gain)
        kd: round(group["profiled_ms_per_step_by_kind"].get(kd, 0) / v, 2)
        for kd, v in one["profiled_ms_per_step_by_kind"].items()
        if v > 0
    }
    return row


# ---- equality: a group against each seed alone, through the real trainer


def loss_gaps(cfg: TrainConfig, tmp: Path, label: str) -> dict:
    from delphi.train.rundir import read_metrics
    from delphi.train.trainer import train_group

    def member(seed: int) -> TrainConfig:
        return dataclasses.replace(
            cfg,
            seed=seed,
            data=dataclasses.replace(cfg.data, seed=seed),
            log_every=EQUALITY_LOG_EVERY,
        ).validate()

    start = time.perf_counter()
    alone = {s: train_group([member(s)], [tmp / label / f"alone{s}"], progress=False)[0] for s in EQUALITY_SEEDS}
    alone_s = time.perf_counter() - start
    start = time.perf_counter()
    grouped = train_group(
        [member(s) for s in EQUALITY_SEEDS], [tmp / label / f"group{s}" for s in EQUALITY_SEEDS], progress=False
    )
    group_s = time.perf_counter() - start
    seeds = {}
    for i, s in enumerate(EQUALITY_SEEDS):
        a, g = read_metrics(tmp / label / f"alone{s}"), read_metrics(tmp / label / f"group{s}")
        gaps = [(ra["step"], abs(rg["train_loss"] / ra["train_loss"] - 1)) for ra, rg in zip(a, g)]
        first = next((step for step, gap in gaps if gap > GAP_EPS), None)
        seeds[s] = {
            "first_step_gap_over_1e-5": first,
            "train_gap_at_first_logs": [f"{gap:.1e}" for _, gap in gaps[:5]],
            "train_gap_median_last_10pct": float(statistics.median(gap for _, gap in gaps[-max(1, len(gaps) // 10) :])),
            "val_loss_alone": alone[s]["val_loss"],
            "val_loss_grouped": grouped[i]["val_loss"],
            "val_gap": abs(grouped[i]["val_loss"] / alone[s]["val_loss"] - 1),
        }
    vals = [alone[s]["val_loss"] for s in EQUALITY_SEEDS]
    return {
        "model": label,
        "steps": cfg.steps,
        "seeds": seeds,
        "alone_wall_s": round(alone_s, 1),
        "group_wall_s": round(group_s, 1),
        "seed_spread_alone": abs(vals[1] / vals[0] - 1),
    }


def dense_twin(cfg: TrainConfig) -> TrainConfig:
    """The same rung with a dense SwiGLU FFN as wide as the active experts (top_k x d_expert)."""
    moe = cfg.model.moe
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, moe=None, d_ff=moe.top_k * moe.d_expert)
    ).validate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rungs",
        default=",".join(r.split("_L")[0] for r in DEFAULT_RUNGS),
        help="rungs of the default ladder, by run id or its prefix (C8e11_d40)",
    )
    parser.add_argument("--seeds", type=int, default=4, help="members of the vmapped group")
    parser.add_argument("--equality", action="store_true", help="also train the levers' rung alone and grouped")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.seeds < 2:
        parser.error(f"--seeds: a group needs at least 2 members, got {args.seeds}")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a ladder worker
    wanted = [r if r.endswith(tuple(f"_s{s}" for s in range(10))) else f"{r}_L3_E8k2_s0" for r in args.rungs.split(",")]
    started = time.perf_counter()
    result: dict = {
        "machine": ladder_bench.machine(),
        "uptime_before": ladder_bench.uptime(),
        "xla_flags": os.environ["XLA_FLAGS"],
        "jax": jax.__version__,
    }
    print(
        f"[profile] {result['machine']['cpu_model']}, {result['machine']['simd_flags']}, jax {jax.__version__}",
        file=sys.stderr,
    )
    from delphi.train.peak import measure_matmul_flops

    peak = measure_matmul_flops("f32")  # on the one core this process runs on
    result["peak_f32_flops_one_core"] = peak
    print(f"[profile] f32 matmul peak on one core: {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        names = wanted + ([EQUALITY_RUNG] if args.equality else [])
        configs = rung_configs(names, Path(tmp))
        rows = []
        for name in wanted:
            row = profile_rung(name, configs[name], args.seeds, peak)
            rows.append(row)
            one, group = row["seeds1"], row[f"seeds{args.seeds}"]
            print(
                f"[profile] {name}: one seed {one['ms_per_step']:.2f} ms/step ({one['ops_per_step']} ops), "
                f"{args.seeds} vmapped {group['ms_per_step']:.2f} ms/step = {row['group_member_over_one']:.2f} "
                f"of one seed per member; one seed {row['model_gflops_one_seed']:.1f} model GFLOP/s = "
                f"{row['fraction_of_one_core_peak']:.1%} of the one-core peak",
                file=sys.stderr,
            )
            print(
                f"          one seed, share of op time by kind: {one['share_by_kind']} (profiled / timed "
                f"{one['profiled_over_timed']})",
                file=sys.stderr,
            )
            print(f"          by phase: {one['profiled_ms_per_step_by_phase']}", file=sys.stderr)
            print(f"          group / one per kind: {row['kind_group_over_one']}", file=sys.stderr)
        result["rungs"] = rows
        if args.equality:
            cfg = configs[EQUALITY_RUNG]
            result["equality"] = [loss_gaps(cfg, Path(tmp), "moe"), loss_gaps(dense_twin(cfg), Path(tmp), "dense")]
            for eq in result["equality"]:
                for s, g in eq["seeds"].items():
                    print(
                        f"[equality] {eq['model']} seed {s}: train-loss gap first > 1e-5 at step "
                        f"{g['first_step_gap_over_1e-5']} (first logs {g['train_gap_at_first_logs']}), "
                        f"{g['train_gap_median_last_10pct']:.2%} over the last 10%; val {g['val_loss_alone']:.4f} "
                        f"alone, {g['val_loss_grouped']:.4f} grouped: {g['val_gap']:.2%}",
                        file=sys.stderr,
                    )
                print(
                    f"[equality] {eq['model']}: seed 0 vs seed 1 alone differ {eq['seed_spread_alone']:.2%}; "
                    f"wall alone {eq['alone_wall_s']} s, grouped {eq['group_wall_s']} s",
                    file=sys.stderr,
                )
    result["uptime_after"] = ladder_bench.uptime()
    result["bench_wall_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
