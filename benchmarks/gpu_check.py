"""The GPU check: the real trainer on whatever accelerator JAX sees, the whole table in one run of at
most 8 minutes.

    python benchmarks/gpu_check.py [--out DIR] [--smoke] [--budget-s 480] [--store stdlib] [--only ITEM,...]

On a GPU machine with the project installed: `pip install -e '.[cuda]'` (JAX's own CUDA 13 wheels;
'.[cuda12]' for CUDA 12), then `python benchmarks/gpu_check.py`. On the lent GPU machines, whose
image already holds JAX 0.11 with CUDA 13, flax, optax and orbax but not this project, from the
repository root: `PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT 2>&1 | tee
$OUT/gpu_check.log`. The first run prepares the `stdlib` token store into $DELPHI_CACHE
(~/.cache/delphi) from that Python's standard library (measured below with everything else).

The table, one item after another (each through `delphi.train.trainer.train`: host batches, the
compiled scanned steps, evaluation and the final checkpoint, as every run; bf16 = f32 master
weights and bf16 matmuls; attention `auto`: cuDNN's flash attention on a GPU where it takes the
shape, delphi.train.device):
- peak: the same-run bf16 matmul peak (a chain of PEAK_SIZE^3 matmuls, best of several): every MFU
  below is against it, never a datasheet number;
- dense-d1024: d_model 1024, 8 layers, 8 heads of 128, SwiGLU d_ff 2736 (nanoGPT's MLP size),
  sequence 1024, 16 sequences a step, AdamW; target MFU >= 35%;
- moe-d1024: its MoE twin, same active FLOPs: 8 experts of 1368, top-2, Switch capacity 1.25
  (capacity groups: one batched matmul per projection); target MFU >= 25%;
- moe-dropless-d1024: the default ladder family's own d1024 rung (8 layers, 2 heads of 512,
  dropless MoE, the ladder recipe's AdamH) at sequence 128 and 64 sequences: the dispatch whose peak
  memory was 2-5x the trainer's old estimate on the H200;
- ladder: a small ladder in the default ladder's family (d128 and d256, 4 seeds each, sequence 128,
  32 sequences a step, the recipe's AdamH; FULL below): first every rung alone (the
  seeds of a width share one compiled program), then each width's seeds as one vmapped program
  (`train_group`, what `ladder run --group-seeds` trains): the wall time of both, and whether the
  shared program pays on this device (it did not on a 2-core CPU, benchmarks/seed_groups.py).
Memory, per item: the device's `peak_bytes_in_use` (the process's peak so far: JAX cannot reset
it, so the three items run from the smallest estimate up, the ladder last, and each row says
whether its figure is its own), XLA's memory analysis of the item's compiled train step and the trainer's own estimate
(delphi.train.memory), and their ratios; target: the estimate within 25% of the peak.

`--budget-s` (default 480 s = 8 minutes): an item whose predicted time would pass it is skipped
(its row says so), so that a device session's time limit never cuts the run in the middle; the
results are written after every item (gpu_check.json, gpu_check.md under --out), so a run killed
anyway keeps what it measured. Exit status 1 if an item failed or missed a target, 2 on bad usage.

`--smoke` (automatic when JAX sees only CPUs; tests/test_gpu_check.py runs it): the same items at
the smallest sizes, f32, a few steps each, so that the script is known to work before a GPU
session spends its minutes on it.

Status: rewritten after the first H200 run (benchmarks/results/gpu-check-2026-12-04-nvidia-h200/,
the older table: 128-token sequences, datasheet peak) and run only in --smoke form since: no GPU
was lent to the session that wrote it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import math
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
for path in (str(BENCHMARKS), str(ROOT)):
    if path not in sys.path:  # benchmarks/ scripts import each other by bare name; the repo without installing
        sys.path.insert(0, path)

import trainer as bench  # noqa: E402  benchmarks/trainer.py: Shape, bench_config, d_ff_for, LOG_EVERY
from machine import cpu_model, machine  # noqa: E402  benchmarks/machine.py

from delphi.io import atomic_write_json, atomic_write_text  # noqa: E402
from delphi.model.config import SWITCH_CAPACITY_FACTOR, ModelConfig, MoEConfig  # noqa: E402
from delphi.model.flops import count_params, palm_flops_per_token  # noqa: E402
from delphi.train.config import TrainConfig  # noqa: E402

# The project's goals on one H100 or H200: the run in at most 8 minutes, a dense bf16 step at d1024
# and sequence >= 1024 at >= 35% MFU of the same-run bf16 peak, its MoE twin at >= 25%, and the peak
# memory within 25% of the estimate.
BUDGET_S = 480.0
TARGET_MFU = {"dense-d1024": 0.35, "moe-d1024": 0.25}
TARGET_MEMORY = 0.25
LADDER_SPEC = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
LADDER_SEQ_LEN = 128  # every ladder of the project (docs/design.md §8.1)
NOT_REPORTED = "not reported"
JSON_FILE, MARKDOWN_FILE = "gpu_check.json", "gpu_check.md"


@dataclass(frozen=True)
class Sizes:
    """What one mode trains: --smoke's fit a CPU in seconds, the full ones fill a GPU."""

    precision: str
    peak_size: int  # matmul side of the peak measurement
    wide: int  # d_model of the dense and MoE items
    wide_layers: int
    wide_heads: int
    wide_seq: int
    wide_batch: int
    dropless_width: int  # the ladder family's rung of the dropless item
    dropless_batch: int
    steps: int  # per dense/MoE item (LOG_EVERY-step intervals: the median is the rate)
    ladder_widths: tuple[int, ...]
    ladder_seeds: int
    ladder_batch: int
    ladder_steps: int
    setup_s: float  # predicted compilation per program (a train chunk and its eval step)
    run_s: float  # predicted set-up per run besides compilation (init, evaluation, checkpoint)


FULL = Sizes(
    precision="bf16",
    peak_size=8192,
    wide=1024,
    wide_layers=8,
    wide_heads=8,
    wide_seq=1024,
    wide_batch=16,
    dropless_width=1024,
    dropless_batch=64,
    steps=48,
    ladder_widths=(128, 256),
    ladder_seeds=4,
    ladder_batch=32,
    ladder_steps=64,
    setup_s=35.0,
    run_s=4.0,
)
# --smoke: the dropless item is the ladder's first rung (the same config: one program for both)
SMOKE = Sizes(
    precision="f32",
    peak_size=256,
    wide=32,
    wide_layers=1,
    wide_heads=2,
    wide_seq=64,
    wide_batch=4,
    dropless_width=32,
    dropless_batch=2,
    steps=16,
    ladder_widths=(32,),
    ladder_seeds=2,
    ladder_batch=2,
    ladder_steps=16,
    setup_s=8.0,
    run_s=2.0,
)
# Predicted MFU for the time budget only (the H200's first run measured 2-7% at 128 tokens a
# sequence: a prediction that overestimates the time skips an item needlessly, which is cheaper
# than a run cut by the session's limit)
PREDICTED_MFU = 0.10
ITEMS = ("peak", "ladder", "dense-d1024", "moe-d1024", "moe-dropless-d1024")


# ---- the device ----------------------------------------------------------------------------------


def device_info() -> dict:
    import jax

    devices = jax.devices()
    first = devices[0]
    info = {
        "platform": first.platform,
        "device_kind": first.device_kind,
        "count": len(devices),
        "name": f"{len(devices)} x {cpu_model() if first.platform == 'cpu' else first.device_kind} ({first.platform})",
        "cpu_model": cpu_model() if first.platform == "cpu" else None,
        "platform_version": getattr(first.client, "platform_version", None),
        "compute_capability": getattr(first, "compute_capability", None),
        "jax": jax.__version__,
        "memory_limit_bytes": None,
    }
    from delphi.train.device import device_memory_bytes

    stats = device_memory_bytes(first) if first.platform != "cpu" else None
    if stats is not None:
        info["memory_limit_bytes"] = stats[0]
    try:
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
    except (ImportError, AttributeError):
        info["jaxlib"] = None
    return info


def peak_memory_bytes() -> int | str:
    """The largest `peak_bytes_in_use` over the local devices, or NOT_REPORTED (the CPU)."""
    import jax

    from delphi.train.device import device_memory_bytes

    peaks = []
    for d in jax.local_devices():
        if device_memory_bytes(d) is None:
            continue
        stats = d.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else NOT_REPORTED


# ---- the items' configs --------------------------------------------------------------------------


def ladder_model(d_model: int) -> ModelConfig:
    from delphi.ladder.plan import shape_for_width
    from delphi.ladder.spec import load_ladder_spec

    return shape_for_width(load_ladder_spec(LADDER_SPEC), d_model)


def ladder_optim(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the ladder recipe's optimizer (AdamH) and hyperparameters for its batch and horizon."""
    from delphi.ladder.recipe import hyperparams_at, optim_config
    from delphi.ladder.spec import load_ladder_spec

    recipe = load_ladder_spec(LADDER_SPEC).recipe
    hp = hyperparams_at(recipe, cfg.data.batch_size, cfg.data.seq_len, cfg.tokens, d_model=cfg.model.d_model)
    return dataclasses.replace(cfg, optim=optim_config(hp)).validate()


def wide_models(sizes: Sizes) -> dict[str, ModelConfig]:
    """The dense item's model and its MoE twin (same active FLOPs: two experts of half the width)."""
    d_ff = bench.d_ff_for(sizes.wide)
    dense = ModelConfig(d_model=sizes.wide, n_layers=sizes.wide_layers, n_heads=sizes.wide_heads, d_ff=d_ff)
    moe = dense.replace(moe=MoEConfig(experts=8, top_k=2, d_expert=d_ff // 2, capacity_factor=SWITCH_CAPACITY_FACTOR))
    return {"dense-d1024": dense, "moe-d1024": moe}


def item_configs(sizes: Sizes, store: str) -> dict[str, TrainConfig]:
    """The dense, MoE and dropless items' train configs."""
    shape = bench.Shape("wide", sizes.wide, sizes.wide_layers, sizes.wide_seq, sizes.wide_batch)
    configs = {name: bench_config(model, shape, sizes, store) for name, model in wide_models(sizes).items()}
    dropless = ladder_model(sizes.dropless_width)
    shape = bench.Shape("dropless", dropless.d_model, dropless.n_layers, LADDER_SEQ_LEN, sizes.dropless_batch)
    configs["moe-dropless-d1024"] = ladder_optim(bench_config(dropless, shape, sizes, store))
    return configs


def bench_config(
    model: ModelConfig, shape: Any, sizes: Sizes, store: str, steps: int | None = None, seed: int = 0
) -> TrainConfig:
    cfg = bench.bench_config(model, shape, sizes.precision, steps or sizes.steps, store, seed=seed)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seed=seed)).validate()


def ladder_configs(sizes: Sizes, store: str) -> dict[int, list[TrainConfig]]:
    """Width -> its seeds' configs (seed and data.seed set to each)."""
    out = {}
    for width in sizes.ladder_widths:
        model = ladder_model(width)
        shape = bench.Shape(f"ladder-d{width}", width, model.n_layers, LADDER_SEQ_LEN, sizes.ladder_batch)
        out[width] = [
            ladder_optim(bench_config(model, shape, sizes, store, sizes.ladder_steps, seed=s))
            for s in range(sizes.ladder_seeds)
        ]
    return out


# ---- measuring -----------------------------------------------------------------------------------


def memory_of(cfg: TrainConfig, attention: str) -> dict:
    """The trainer's estimate and XLA's analysis of `cfg`'s compiled train step (compiled here from
    abstract shapes and cached: the run then trains with this very program)."""
    from delphi.train.memory import CompiledMemory, estimate_train_memory
    from delphi.train.sharding import make_mesh
    from delphi.train.trainer import compile_train_chunk

    estimate = estimate_train_memory(cfg, attention=attention)
    compiled = CompiledMemory.of(compile_train_chunk([cfg], make_mesh(cfg.mesh))[0])
    return {
        "estimate": estimate.total - estimate.runtime,
        "estimate_parts": dataclasses.asdict(estimate),
        "compiled": compiled.as_dict() if compiled else NOT_REPORTED,
    }


def rates(run_dir: Path) -> list[float]:
    from delphi.train.rundir import read_metrics

    return [r["tokens_per_s"] for r in read_metrics(run_dir) if "tokens_per_s" in r]


def train_item(name: str, cfg: TrainConfig, peak: float, largest_estimate: int) -> dict:
    """Train `cfg` once into a temporary run directory; its row."""
    from delphi.train.trainer import attention_kernel, train

    attention = attention_kernel(cfg)
    counts = count_params(cfg.model)
    row: dict[str, Any] = {
        "item": name,
        "d_model": cfg.model.d_model,
        "n_layers": cfg.model.n_layers,
        "n_heads": cfg.model.n_heads,
        "moe": None if cfg.model.moe is None else dataclasses.asdict(cfg.model.moe),
        "seq_len": cfg.data.seq_len,
        "batch": cfg.data.batch_size,
        "precision": cfg.precision,
        "optimizer": cfg.optim.optimizer,
        "steps": cfg.steps,
        "attention": attention,
        "params_total": counts.total,
        "params_active": counts.active,
        "palm_flops_per_token": palm_flops_per_token(cfg.model, cfg.data.seq_len),
        "error": None,
    }
    started = time.perf_counter()
    try:
        row["memory"] = memory_of(cfg, attention)
        row["memory_peak_is_this_item"] = row["memory"]["estimate"] >= largest_estimate
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            summary = train(cfg, Path(tmp) / "run", progress=False)
            measured = rates(Path(tmp) / "run")
        if summary.get("status") != "completed" or not measured:
            raise RuntimeError(f"trainer status {summary.get('status')}: {summary.get('reason', '')}")
        tokens_per_s = statistics.median(measured)
        row.update(
            tokens_per_s=tokens_per_s,
            tokens_per_s_spread=[min(measured), max(measured)],
            model_flops_per_s=tokens_per_s * row["palm_flops_per_token"],
            mfu=tokens_per_s * row["palm_flops_per_token"] / peak,
            compile_s=summary.get("compile_s"),
            train_s=summary.get("train_s"),
            eval_s=summary.get("eval_s"),
            checkpoint_s=summary.get("checkpoint_s"),
            val_loss=summary.get("val_loss"),
            xla_flops_per_byte=bench.arithmetic_intensity(),
        )
    except Exception as e:  # noqa: BLE001  an item's failure is a result: the other items still run
        traceback.print_exc()
        row["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:600]
    row["peak_memory_bytes"] = peak_memory_bytes()
    row["wall_s"] = time.perf_counter() - started
    return memory_ratios(row)


def memory_ratios(row: dict) -> dict:
    """Estimate / measured peak and compiled / measured peak, where the device reports a peak."""
    memory, peak = row.get("memory"), row.get("peak_memory_bytes")
    if memory and isinstance(peak, int) and peak > 0:
        row["estimate_over_peak"] = memory["estimate"] / peak
        if isinstance(memory["compiled"], dict):
            row["compiled_over_peak"] = memory["compiled"]["total"] / peak
    return row


def ladder_item(configs: dict[int, list[TrainConfig]], peak: float) -> dict:
    """Every rung alone, then each width's seeds as one vmapped program: the wall time of both."""
    from delphi.train.trainer import train, train_group

    row: dict[str, Any] = {
        "item": "ladder",
        "widths": list(configs),
        "seeds": len(next(iter(configs.values()))),
        "steps": next(iter(configs.values()))[0].steps,
        "error": None,
    }
    flops = sum(c.tokens * palm_flops_per_token(c.model, c.data.seq_len) for cfgs in configs.values() for c in cfgs)
    row["model_flops"] = flops
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-ladder-") as tmp:
            t0 = time.perf_counter()
            for width, cfgs in configs.items():
                for c in cfgs:
                    train(c, Path(tmp) / f"alone-d{width}-s{c.seed}", progress=False)
            row["alone_wall_s"] = time.perf_counter() - t0
            row["alone_tokens_per_s"] = {
                width: statistics.median(rates(Path(tmp) / f"alone-d{width}-s{cfgs[0].seed}"))
                for width, cfgs in configs.items()
            }
            t0 = time.perf_counter()
            for width, cfgs in configs.items():
                train_group(cfgs, [Path(tmp) / f"group-d{width}-s{c.seed}" for c in cfgs], progress=False)
            row["grouped_wall_s"] = time.perf_counter() - t0
            row["grouped_member_tokens_per_s"] = {
                width: statistics.median(rates(Path(tmp) / f"group-d{width}-s{cfgs[0].seed}"))
                for width, cfgs in configs.items()
            }
        row["grouped_over_alone_wall"] = row["grouped_wall_s"] / row["alone_wall_s"]
        row["shared_program_pays"] = row["grouped_wall_s"] < row["alone_wall_s"]
        row["alone_mfu"] = flops / row["alone_wall_s"] / peak
        row["grouped_mfu"] = flops / row["grouped_wall_s"] / peak
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:600]
    row["peak_memory_bytes"] = peak_memory_bytes()
    row["wall_s"] = time.perf_counter() - started
    return row


def predicted_s(cfgs: list[TrainConfig], sizes: Sizes, peak: float, programs: int, runs: int) -> float:
    """Time an item should take: its model FLOPs at PREDICTED_MFU of the peak, its programs'
    compilation and each run's set-up."""
    flops = sum(c.tokens * palm_flops_per_token(c.model, c.data.seq_len) for c in cfgs)
    return flops / (peak * PREDICTED_MFU) + programs * sizes.setup_s + runs * sizes.run_s


def ladder_predicted_s(ladder: dict[int, list[TrainConfig]], sizes: Sizes, peak: float) -> float:
    """Every rung alone (one program per width), then one seed group per width (one program each)."""
    rungs = [c for cfgs in ladder.values() for c in cfgs]
    return 2 * predicted_s(rungs, sizes, peak, len(ladder), 0) + (len(rungs) + len(ladder)) * sizes.run_s


def targets(result: dict) -> dict[str, dict]:
    """Each target: the measured value, the bound and whether it is met (None: not measured)."""
    out = {}
    rows = {r["item"]: r for r in result["rows"]}
    for name, bound in TARGET_MFU.items():
        mfu = rows.get(name, {}).get("mfu")
        out[f"{name} MFU"] = {"value": mfu, "at_least": bound, "met": None if mfu is None else mfu >= bound}
    for name in ("dense-d1024", "moe-d1024", "moe-dropless-d1024"):
        ratio = rows.get(name, {}).get("estimate_over_peak")
        out[f"{name} memory estimate / peak"] = {
            "value": ratio,
            "within": TARGET_MEMORY,
            "met": None
            if ratio is None or not rows[name].get("memory_peak_is_this_item")
            else abs(ratio - 1) <= TARGET_MEMORY,
        }
    return out


# ---- output --------------------------------------------------------------------------------------


def gib(n: Any) -> str:
    return f"{n / 2**30:.2f} GiB" if isinstance(n, (int, float)) else str(n)


def fmt(x: Any, spec: str = ".3f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else ("-" if x is None else str(x))


def progress_line(row: dict) -> str:
    if row["item"] == "peak":
        return f"peak            {row['precision']} matmul {row['size']}^3: {row['flops_per_s'] / 1e12:,.1f} TFLOP/s"
    if row.get("skipped"):
        return f"{row['item']:15s} skipped: {row['skipped']}"
    if row["error"]:
        return f"{row['item']:15s} FAILED after {row['wall_s']:.1f} s: {row['error']}"
    if row["item"] == "ladder":
        return (
            f"ladder          widths {row['widths']} x {row['seeds']} seeds: alone {row['alone_wall_s']:.1f} s "
            f"(MFU {row['alone_mfu']:.3f}), seed groups {row['grouped_wall_s']:.1f} s (MFU {row['grouped_mfu']:.3f}): "
            f"{'pays' if row['shared_program_pays'] else 'does not pay'} ({row['grouped_over_alone_wall']:.2f}x the wall)"
        )
    memory = row["memory"]
    compiled = memory["compiled"]["total"] if isinstance(memory["compiled"], dict) else memory["compiled"]
    return (
        f"{row['item']:15s} d{row['d_model']} L{row['n_layers']} B{row['batch']}x{row['seq_len']} {row['precision']} "
        f"{row['attention']}: {row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.3f}; memory peak "
        f"{gib(row['peak_memory_bytes'])}, compiled {gib(compiled)}, estimate {gib(memory['estimate'])} "
        f"(compile {fmt(row['compile_s'], '.1f')} s, wall {row['wall_s']:.1f} s)"
    )


def markdown(result: dict) -> str:
    dev = result["device"]
    lines = [
        f"# GPU check, {result['date']}: {dev['name']}",
        "",
        f"`{result['command']}`, {result['mode']} mode; jax {dev['jax']} ({dev['platform_version']}); host "
        f"{result['host']['cpu_model']}, {result['host']['cpus']} CPUs. MFU: PaLM model FLOPs x tokens/s over the "
        f"same-run {result['precision']} matmul peak ({fmt(result['peak_flops'] and result['peak_flops'] / 1e12, '.1f')} "
        f"TFLOP/s). Took {result['wall_s']:.0f} s of a {result['budget_s']:.0f} s budget.",
        "",
        "| item | shape | attention | tokens/s | MFU | peak memory | compiled | estimate | estimate / peak | compile s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r["item"] in ("peak", "ladder"):
            continue
        if r.get("skipped") or r["error"]:
            lines.append(
                f"| {r['item']} | | | {'skipped: ' + r['skipped'] if r.get('skipped') else 'failed: ' + r['error']} |"
                " | | | | | | |"
            )
            continue
        m = r["memory"]
        compiled = m["compiled"]["total"] if isinstance(m["compiled"], dict) else m["compiled"]
        lines.append(
            f"| {r['item']} | d{r['d_model']} L{r['n_layers']} H{r['n_heads']} {r['batch']} x {r['seq_len']} {r['precision']} | "
            f"{r['attention']} | {r['tokens_per_s']:,.0f} | {r['mfu']:.3f} | {gib(r['peak_memory_bytes'])}"
            f"{'' if r.get('memory_peak_is_this_item') else ' (an earlier item)'} | {gib(compiled)} | {gib(m['estimate'])} | "
            f"{fmt(r.get('estimate_over_peak'), '.2f')} | {fmt(r['compile_s'], '.1f')} | {r['wall_s']:.1f} |"
        )
    ladder = next((r for r in result["rows"] if r["item"] == "ladder"), None)
    if ladder:
        lines += ["", f"Ladder: {progress_line(ladder).removeprefix('ladder').strip()}"]
    lines += ["", "| target | value | bound | met |", "|---|---|---|---|"]
    for name, t in result["targets"].items():
        bound = f">= {t['at_least']}" if "at_least" in t else f"within {t['within']:.0%}"
        lines.append(f"| {name} | {fmt(t['value'])} | {bound} | {t['met']} |")
    lines += [
        "",
        "Peak memory is `peak_bytes_in_use`, the process's peak so far (items run smallest estimate first).",
        "",
    ]
    return "\n".join(lines)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


def default_out(device: dict, today: str) -> Path:
    name = device["device_kind"] if device["platform"] != "cpu" else device["cpu_model"] or "cpu"
    name = re.sub(r"\((r|tm)\)|\b(processor|cpu|\d+-core)\b", "", name, flags=re.I)
    return BENCHMARKS / "results" / f"gpu-check-{today}-{slug(name)}"


def write_results(out: Path, result: dict) -> None:
    result["targets"] = targets(result)
    atomic_write_json(out / JSON_FILE, result)
    atomic_write_text(out / MARKDOWN_FILE, markdown(result))


# ---- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="results directory (default benchmarks/results/gpu-check-DATE-DEVICE/)"
    )
    parser.add_argument("--smoke", action="store_true", help="every item at the smallest sizes, f32 (automatic on CPU)")
    parser.add_argument(
        "--budget-s", type=float, default=BUDGET_S, help=f"the whole run's seconds (default {BUDGET_S:.0f})"
    )
    parser.add_argument("--store", default="stdlib", help="token store (a built-in source name or a prepared store)")
    parser.add_argument("--only", help=f"comma-separated items of {', '.join(ITEMS)} (peak always runs)")
    args = parser.parse_args(argv)
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        parser.error(f"--budget-s: must be a positive number, got {args.budget_s}")
    if args.only:
        unknown = set(args.only.split(",")) - set(ITEMS)
        if unknown:
            parser.error(f"--only: no item {', '.join(sorted(unknown))}; choose from {', '.join(ITEMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    device = device_info()
    if device["count"] > 1:
        print(
            f"gpu_check: JAX sees {device['count']} devices; the check measures one: run it with "
            "CUDA_VISIBLE_DEVICES=0",
            file=sys.stderr,
        )
        return 2
    smoke = args.smoke or device["platform"] == "cpu"
    sizes = SMOKE if smoke else FULL
    today = datetime.date.today().isoformat()
    out = args.out or default_out(device, today)
    say(
        f"device: {device['name']}; jax {device['jax']}, {device['platform_version']}"
        + (f"; JAX may allocate {gib(device['memory_limit_bytes'])}" if device["memory_limit_bytes"] else "")
    )
    if smoke and not args.smoke:
        say("no accelerator: --smoke (every item at the smallest sizes)")
    wanted = set(args.only.split(",")) if args.only else set(ITEMS)
    result = {
        "issue": 51,
        "date": today,
        "command": " ".join(["benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
        "mode": "smoke" if smoke else "full",
        "precision": sizes.precision,
        "sizes": dataclasses.asdict(sizes),
        "device": device,
        "host": machine(),
        "budget_s": args.budget_s,
        "store": args.store,
        "out": str(out),
        "peak_flops": None,
        "rows": [],
        "wall_s": 0.0,
    }

    def record(row: dict) -> None:
        result["rows"].append(row)
        result["wall_s"] = time.perf_counter() - started
        write_results(out, result)
        say(progress_line(row))

    from delphi.train.peak import measure_matmul_flops

    peak = measure_matmul_flops(sizes.precision, size=sizes.peak_size)
    result["peak_flops"] = peak
    record({"item": "peak", "precision": sizes.precision, "size": sizes.peak_size, "flops_per_s": peak, "error": None})

    from delphi.train.memory import estimate_train_memory

    configs = item_configs(sizes, args.store)
    ladder = ladder_configs(sizes, args.store)
    plan: list[tuple[str, int, float]] = []  # (item, memory estimate, predicted seconds)
    for name, cfg in configs.items():
        if name in wanted:
            plan.append((name, estimate_train_memory(cfg).total, predicted_s([cfg], sizes, peak, 1, 1)))
    plan.sort(key=lambda item: item[1])  # smallest first: peak_bytes_in_use only grows
    if "ladder" in wanted:  # last: its memory is not a target, and the measured items come first
        memory = max(estimate_train_memory(cfgs[0], len(cfgs)).total for cfgs in ladder.values())
        plan.append(("ladder", memory, ladder_predicted_s(ladder, sizes, peak)))
    for name, memory, seconds in plan:
        say(f"plan: {name:20s} estimate {gib(memory)}, ~{seconds:.0f} s")
    largest = 0
    for name, memory, seconds in plan:
        elapsed = time.perf_counter() - started
        if elapsed + seconds > args.budget_s:
            record(
                {
                    "item": name,
                    "error": None,
                    "wall_s": 0.0,
                    "skipped": f"predicted {seconds:.0f} s, {args.budget_s - elapsed:.0f} s of the budget left",
                }
            )
            continue
        row = ladder_item(ladder, peak) if name == "ladder" else train_item(name, configs[name], peak, largest)
        largest = max(largest, memory)
        row["predicted_s"] = seconds
        record(row)
        gc.collect()
    failed = [r["item"] for r in result["rows"] if r.get("error")]
    missed = [name for name, t in result["targets"].items() if t["met"] is False]
    say(
        f"total wall {result['wall_s']:.0f} s of {args.budget_s:.0f}; failed: {failed or 'none'}; "
        f"targets missed: {missed or 'none'}{' (smoke sizes: targets are for the full run)' if smoke else ''}"
    )
    say(f"results: {out / JSON_FILE}, {out / MARKDOWN_FILE}")
    return 1 if failed or (missed and not smoke) else 0


if __name__ == "__main__":
    sys.exit(main())
