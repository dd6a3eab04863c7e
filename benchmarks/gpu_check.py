"""The GPU check (issue 42): the real trainer on whatever accelerator JAX sees, in about 5 minutes.

    python benchmarks/gpu_check.py [--out DIR] [--reduced] [--precision bf16|f32] [--steps-scale X]
        [--store stdlib] [--only SHAPE,...]

On a GPU machine: `pip install -e .` with a CUDA build of JAX (e.g. `pip install -U "jax[cuda12]"`),
then `python benchmarks/gpu_check.py`; or, without installing, `PYTHONPATH=. python3 benchmarks/gpu_check.py`
from the repository root (how it ran on the H200 below). The first run prepares the `stdlib` token store
into $DELPHI_CACHE (~/.cache/delphi) from that Python's standard library.

Trains, through `delphi.train.trainer.train` (host batches, jitted scanned steps, evaluation and
the final checkpoint, as every run), on every device of `jax.devices()` (data parallel: the batch
is split over them, each device keeping the batch of one):
- benchmarks/trainer.py's nanoGPT comparison shape, d256 (4 layers, seq 256, batch 32, dense,
  AdamW as there; its MoE twin was left out to keep to 5 minutes: it ran at 0.77x the dense
  tokens/s on the H200);
- a small ladder in the default ladder's family (delphi/defaults/ladder_default.yaml through
  `delphi.ladder.plan.shape_for_width`: MoE 8 experts top-2, dropless, 2 heads, depth d/32 in
  [3, 8], seq 128) at d_model 128, 256, 512, 768, 1024, each with LADDER_BATCH sequences per step
  and the ladder recipe's optimizer (AdamH) and hyperparameters for that batch and horizon.
Full mode's steps (FULL_STEPS) are sized to ~5 minutes on one H200 at the rates this script
measured there. The estimate printed before the first shape is FLOPs per token x tokens /
(published peak x ASSUMED_MFU, 30%) + ASSUMED_SETUP_S per shape, and beside it the same at
OBSERVED_MFU (5%, what the H200 gave): the 30% figure is ~1.3x too short on that machine.

`--reduced` (automatic when JAX sees only CPUs; tests/test_gpu_check.py trains its bench-d32): the smallest
shapes only (benchmarks/trainer.py's d32 ladder shape, dense, and the ladder family at d32), a
handful of steps each, so the script keeps working where there is no GPU. It runs on whatever JAX
sees (JAX_PLATFORMS=cpu forces the CPU). Precision: bf16 (f32 master weights, bf16 matmuls) on an
accelerator, f32 on CPU, where bf16 is emulated unless the CPU has native bf16 (benchmarks/trainer.py
leaves it out there for that reason); --precision overrides.

Reported per shape, one flushed line each as it finishes:
- tokens/s: the median over the trainer's logged intervals (every LOG_EVERY steps; compile,
  evaluation and checkpoints excluded), as benchmarks/trainer.py;
- MFU: PaLM model FLOPs per token (6N + 12 L d S, as the trainer) x tokens/s over the devices' peak:
  on a GPU the published dense peak of the precision (PUBLISHED_PEAKS, matched to jax's device_kind
  by substring; an unmatched device gets "unknown (no published ... peak for KIND)", not an error);
  on CPU the trainer's same-run matmul peak of the precision (delphi.train.peak, the number its
  own summary uses);
- peak device memory: `device.memory_stats()["peak_bytes_in_use"]`, the largest over the devices
  ("not reported" where JAX gives none, as on CPU). That counter is the process's peak since
  start and JAX cannot reset it, so the shapes run in increasing order of the trainer's own memory
  estimate (delphi.train.memory) and each row's figure is that shape's unless an earlier shape
  took more (`memory_peak_is_this_shape`); XLA's compiled memory analysis of the shape's train
  chunk (arguments, outputs, temporaries) is beside it, per shape and on every platform.

Written atomically (delphi.io) under --out (default benchmarks/results/gpu-check-DATE-DEVICE/),
after every shape, so a run cut short keeps what it measured: gpu_check.json (device, host,
versions, the estimate, every row) and gpu_check.md (a short table). Exit status 1 if a shape
failed (its row holds the error; the other shapes still run).

Memory: the dropless MoE ladder needs far more than the trainer's own estimate (delphi.train.memory,
which its pre-flight check uses): on the H200, d1024 at 128 x 128 tokens peaked at 70.6 GiB against
an estimate of 14.5 GiB, and XLA's compiled analysis agreed with the peak. On an 80 GB card JAX's
default pool is 75% (60 GB), so d1024 may fail there with RESOURCE_EXHAUSTED: its row records the
error, the shapes before it keep theirs; XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 gives it more room,
and `--only` can leave it out.

Status: run on one NVIDIA H200 (jax 0.11.2, CUDA 13) on 2026-12-04, in pieces that together cover
every shape but not this exact step table in one go (benchmarks/results/gpu-check-2026-12-04-nvidia-h200/,
its README says which); not run on an H100, an A100 or several GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
if str(BENCHMARKS) not in sys.path:  # benchmarks/ scripts import each other by bare name
    sys.path.insert(0, str(BENCHMARKS))

import trainer as bench  # noqa: E402  benchmarks/trainer.py: its shapes, bench_config, LOG_EVERY, arithmetic_intensity
from machine import cpu_model, machine  # noqa: E402  benchmarks/machine.py

from delphi.io import atomic_write_json, atomic_write_text  # noqa: E402
from delphi.model.config import ModelConfig  # noqa: E402
from delphi.model.flops import count_params, palm_flops_per_token  # noqa: E402
from delphi.train.config import MeshConfig, TrainConfig  # noqa: E402

# ---- published peaks -----------------------------------------------------------------------------
# Dense (no structured sparsity) tensor-core peaks per device, FLOP/s, from NVIDIA's data sheets.
# The sheets print the 2:4-sparsity figure first; the dense one is half of it.
H100_SXM_BF16 = 989.4e12  # NVIDIA H100 Tensor Core GPU data sheet: H100 SXM BF16 1,979 TFLOPS with sparsity
H100_PCIE_BF16 = 756.5e12  # same sheet: H100 PCIe BF16 1,513 TFLOPS with sparsity
H100_NVL_BF16 = 835.5e12  # same sheet: H100 NVL BF16 1,671 TFLOPS with sparsity
H200_SXM_BF16 = 989.4e12  # NVIDIA H200 data sheet: H200 SXM BF16 1,979 TFLOPS with sparsity (the H100's silicon)
H200_NVL_BF16 = 835.5e12  # same sheet: H200 NVL BF16 1,671 TFLOPS with sparsity
A100_BF16 = 312e12  # NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity), SXM and PCIe
L40S_BF16 = 362.05e12  # NVIDIA L40S data sheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)
L40_BF16 = 181.05e12  # NVIDIA L40 data sheet: BF16 Tensor Core 181.05 TFLOPS (362.1 with sparsity)
L4_BF16 = 121e12  # NVIDIA L4 data sheet: BF16 Tensor Core 242 TFLOPS with sparsity

# (substring of jax's device_kind, case-insensitive; per-device peak), most specific first: JAX
# reports e.g. "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
# "NVIDIA L4" ("L4" would also match "L40S", hence the order). Only bf16 has entries: an f32 run on
# a GPU (TF32 or not depends on JAX's matmul precision) gets an "unknown" MFU rather than a guess.
PUBLISHED_PEAKS: dict[str, list[tuple[str, float]]] = {
    "bf16": [
        ("H100 PCIe", H100_PCIE_BF16), ("H100 NVL", H100_NVL_BF16), ("H200 NVL", H200_NVL_BF16),
        ("H100", H100_SXM_BF16), ("H200", H200_SXM_BF16), ("A100", A100_BF16),
        ("L40S", L40S_BF16), ("L40", L40_BF16), ("L4", L4_BF16),
    ],
}
PEAK_SOURCE = "NVIDIA data sheet, dense {precision} (benchmarks/gpu_check.py PUBLISHED_PEAKS)"

# ---- sizing ----------------------------------------------------------------------------------------
# The wall-time estimate printed before starting: FLOPs per token x tokens / (peak x MFU) + set-up.
ASSUMED_MFU = 0.30  # the issue's assumption
# What this script measured on one H200 (jax 0.11.2, 2026-12-04; benchmarks/results/gpu-check-2026-12-04-nvidia-h200/):
# MFU 0.02 (ladder d128) to 0.066 (bench d256), 0.05 at ladder d512-d1024; set-up (init, compile,
# evaluation, final checkpoint: wall - train) 17 s (bench d256) to 58 s (ladder d768, d1024).
OBSERVED_MFU = 0.05
ASSUMED_SETUP_S = 40.0  # per shape (the H200's 17-58 s)
CPU_SETUP_S = 12.0  # per shape on CPU (reduced mode's d32 shapes: 7-17 s on a loaded 2-core AMD EPYC)
LADDER_SPEC = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
LADDER_WIDTHS = (128, 256, 512, 768, 1024)
LADDER_SEQ_LEN = 128  # every ladder of the project (docs/design.md §8.1)
# Sequences per step per device (16,384 tokens). On the H200 the dropless MoE's peak was 70.7 GiB
# (d768) and 95.1 GiB (d1024) at 256 sequences, 49.6 and 70.6 GiB at 128: not proportional to the
# batch (XLA:GPU seems to use what the pool allows). 128 keeps d768 inside an 80 GB card's default pool.
LADDER_BATCH = 128
# Steps per shape, full mode: ~5 minutes on one H100/H200 at the rates measured on the H200.
FULL_STEPS = {"bench-d256": 512, "ladder-d128": 512, "ladder-d256": 512, "ladder-d512": 256,
              "ladder-d768": 256, "ladder-d1024": 256}
REDUCED_WIDTH = 32
REDUCED_STEPS = 16  # two logged intervals of bench.LOG_EVERY steps
NOT_REPORTED = "not reported"

JSON_FILE, MARKDOWN_FILE = "gpu_check.json", "gpu_check.md"
ROW_FIELDS = (  # every row has these (tests/test_gpu_check.py checks them)
    "shape", "kind", "d_model", "n_layers", "n_heads", "moe", "seq_len", "batch", "tokens_per_step", "precision",
    "optimizer", "steps", "steps_per_call", "params_total", "params_active", "palm_flops_per_token",
    "tokens_per_s", "tokens_per_s_spread", "model_flops_per_s", "mfu", "peak_flops", "peak_source",
    "peak_memory_bytes", "memory_peak_is_this_shape", "memory_estimate_bytes", "xla_memory",
    "xla_flops_per_byte", "compile_s", "train_s", "eval_s", "checkpoint_s", "wall_s", "estimated_s",
    "train_loss", "val_loss", "error",
)


@dataclass(frozen=True)
class CheckShape:
    name: str
    kind: str  # "benchmark" (benchmarks/trainer.py) or "ladder" (the default ladder's family)
    shape: bench.Shape  # d_model, n_layers, seq_len, batch (per device)
    model: ModelConfig
    steps: int
    ladder_optim: bool  # the ladder recipe's optimizer (AdamH) instead of bench_config's AdamW


def ladder_model(d_model: int) -> ModelConfig:
    from delphi.ladder.plan import shape_for_width
    from delphi.ladder.spec import load_ladder_spec

    return shape_for_width(load_ladder_spec(LADDER_SPEC), d_model)


def shapes(reduced: bool, steps_scale: float = 1.0) -> list[CheckShape]:
    def steps(name: str) -> int:
        base = REDUCED_STEPS if reduced else FULL_STEPS[name]
        return max(bench.LOG_EVERY, round(base * steps_scale / bench.LOG_EVERY) * bench.LOG_EVERY)

    out = []
    if reduced:
        d32 = bench.LADDER_D32
        out.append(CheckShape("bench-d32", "benchmark", d32, bench.dense(d32), steps("bench-d32"), False))
        model = ladder_model(REDUCED_WIDTH)
        shape = bench.Shape(f"ladder-d{REDUCED_WIDTH}", REDUCED_WIDTH, model.n_layers, LADDER_SEQ_LEN, d32.batch)
        out.append(CheckShape(shape.name, "ladder", shape, model, steps(shape.name), True))
        return out
    d256 = bench.NANOGPT_D256
    out.append(CheckShape("bench-d256", "benchmark", d256, bench.dense(d256), steps("bench-d256"), False))
    for d in LADDER_WIDTHS:
        model = ladder_model(d)
        shape = bench.Shape(f"ladder-d{d}", d, model.n_layers, LADDER_SEQ_LEN, LADDER_BATCH)
        out.append(CheckShape(shape.name, "ladder", shape, model, steps(shape.name), True))
    return out


def train_config(s: CheckShape, precision: str, store: str, n_devices: int) -> TrainConfig:
    """benchmarks/trainer.py's bench_config (log every LOG_EVERY steps, one evaluation and one
    checkpoint at the end), the batch times the devices, split over them; ladder shapes train
    with the ladder recipe's optimizer for their batch and horizon."""
    shape = dataclasses.replace(s.shape, batch=s.shape.batch * n_devices)
    cfg = bench.bench_config(s.model, shape, precision, s.steps, store)
    changes: dict[str, Any] = {"mesh": MeshConfig(data=n_devices)}
    if s.ladder_optim:
        from delphi.ladder.recipe import hyperparams_at, optim_config
        from delphi.ladder.spec import load_ladder_spec

        recipe = load_ladder_spec(LADDER_SPEC).recipe
        hp = hyperparams_at(recipe, shape.batch, shape.seq_len, cfg.tokens, d_model=s.model.d_model)
        changes["optim"] = optim_config(hp)
    return dataclasses.replace(cfg, **changes).validate()


# ---- the device --------------------------------------------------------------------------------------


def device_info() -> dict:
    import jax

    devices = jax.devices()
    first = devices[0]
    platform, kind = first.platform, first.device_kind
    info = {
        "platform": platform,
        "device_kind": kind,
        "count": len(devices),
        "name": f"{len(devices)} x {cpu_model() if platform == 'cpu' else kind} ({platform})",
        "cpu_model": cpu_model() if platform == "cpu" else None,
        "platform_version": getattr(first.client, "platform_version", None),
        "jax": jax.__version__,
    }
    try:
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
    except (ImportError, AttributeError):
        info["jaxlib"] = None
    return info


def published_peak(device_kind: str, precision: str) -> float | None:
    """The per-device dense peak of `precision` for this device kind, or None."""
    for fragment, peak in PUBLISHED_PEAKS.get(precision, []):
        if fragment.lower() in device_kind.lower():
            return peak
    return None


def peak_for(device: dict, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of all the devices or None, where it comes from)."""
    if device["platform"] == "cpu":
        from delphi.train.peak import peak_flops  # cached: the trainer's MFU uses the same number

        return peak_flops(precision), f"same-run {precision} matmul peak on this CPU (delphi.train.peak)"
    per_device = published_peak(device["device_kind"], precision)
    if per_device is None:
        return None, f"unknown (no published {precision} peak for {device['device_kind']})"
    return per_device * device["count"], PEAK_SOURCE.format(precision=precision)


def peak_memory_bytes() -> int | str:
    """The largest `peak_bytes_in_use` over the devices, or NOT_REPORTED."""
    import jax

    peaks = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001  some backends raise instead of returning None
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else NOT_REPORTED


def xla_memory() -> dict | str:
    """XLA's memory analysis of the train chunk the trainer compiled last (trainer._COMPILED is
    private; benchmarks/trainer.py's arithmetic_intensity reads it the same way)."""
    from delphi.train import trainer

    if not trainer._COMPILED:
        return NOT_REPORTED
    try:
        m = list(trainer._COMPILED.values())[-1][0].memory_analysis()
    except Exception:  # noqa: BLE001
        m = None
    if m is None:
        return NOT_REPORTED
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
    out = {k.removesuffix("_size_in_bytes"): int(getattr(m, k, 0) or 0) for k in keys}
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


# ---- one shape -------------------------------------------------------------------------------------


def describe(s: CheckShape, cfg: TrainConfig) -> dict:
    counts = count_params(s.model)
    moe = s.model.moe
    return {
        "shape": s.name, "kind": s.kind, "d_model": s.model.d_model, "n_layers": s.model.n_layers,
        "n_heads": s.model.n_heads,
        "moe": None if moe is None
        else f"{moe.experts} experts top-{moe.top_k}, d_expert {moe.d_expert}, capacity {moe.capacity_factor:g}",
        "seq_len": cfg.data.seq_len, "batch": cfg.data.batch_size, "tokens_per_step": cfg.tokens_per_step,
        "precision": cfg.precision, "optimizer": cfg.optim.optimizer, "steps": cfg.steps,
        "params_total": counts.total, "params_active": counts.active,
        "palm_flops_per_token": palm_flops_per_token(s.model, cfg.data.seq_len),
    }


def estimate_s(row: dict, peak: float | None, mfu: float = ASSUMED_MFU, setup_s: float = ASSUMED_SETUP_S) -> float | None:
    if peak is None:
        return None
    return row["steps"] * row["tokens_per_step"] * row["palm_flops_per_token"] / (peak * mfu) + setup_s


def run_shape(s: CheckShape, cfg: TrainConfig, peak: float | None, peak_source: str, largest_estimate: int,
              setup_s: float = ASSUMED_SETUP_S) -> dict:
    """Train one shape into a temporary run directory; its row (an `error` instead of the
    measurements when it failed)."""
    from delphi.train.memory import estimate_train_memory
    from delphi.train.rundir import read_metrics
    from delphi.train.trainer import train

    row = {k: None for k in ROW_FIELDS} | describe(s, cfg)
    memory_estimate = estimate_train_memory(cfg).total
    row.update(peak_flops=peak, peak_source=peak_source, memory_estimate_bytes=memory_estimate,
               memory_peak_is_this_shape=memory_estimate >= largest_estimate, estimated_s=estimate_s(row, peak, setup_s=setup_s))
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            summary = train(cfg, Path(tmp) / "run", progress=False)
            records = read_metrics(Path(tmp) / "run")
    except Exception as e:  # noqa: BLE001  one shape's failure is a result; the others still run
        row.update(wall_s=time.perf_counter() - started, error=f"{type(e).__name__}: {e}",
                   mfu=None, peak_memory_bytes=peak_memory_bytes())
        traceback.print_exc()
        return row
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    if not rates:  # e.g. diverged before its first logged step
        row.update(wall_s=time.perf_counter() - started, peak_memory_bytes=peak_memory_bytes(),
                   error=f"no logged steps (trainer status {summary.get('status')}: {summary.get('reason', '')})")
        return row
    tokens_per_s = statistics.median(rates)
    model_flops = tokens_per_s * row["palm_flops_per_token"]
    row.update(
        steps_per_call=summary["steps_per_call"],
        tokens_per_s=tokens_per_s,
        tokens_per_s_spread=[min(rates), max(rates)],
        model_flops_per_s=model_flops,
        mfu=model_flops / peak if peak else peak_source,
        peak_memory_bytes=peak_memory_bytes(),
        xla_memory=xla_memory(),
        xla_flops_per_byte=bench.arithmetic_intensity(),
        compile_s=summary.get("compile_s"), train_s=summary.get("train_s"), eval_s=summary.get("eval_s"),
        checkpoint_s=summary.get("checkpoint_s"), wall_s=time.perf_counter() - started,
        train_loss=records[-1].get("train_loss") if records else None, val_loss=summary.get("val_loss"),
    )
    if summary.get("status") != "completed":
        row["error"] = f"trainer status {summary.get('status')}: {summary.get('reason', '')}"
    return row


# ---- output ----------------------------------------------------------------------------------------


def gib(n: Any) -> str:
    return f"{n / 2**30:.2f} GiB" if isinstance(n, (int, float)) else str(n)


def mfu_text(mfu: Any) -> str:
    return f"{mfu:.3f}" if isinstance(mfu, (int, float)) else str(mfu)


def progress_line(row: dict) -> str:
    if row["error"] and row["tokens_per_s"] is None:
        return f"{row['shape']:15s} FAILED after {row['wall_s']:.1f} s: {row['error']}"
    line = (f"{row['shape']:15s} L{row['n_layers']} B{row['batch']}x{row['seq_len']} {row['precision']}: "
            f"{row['steps']} steps, {row['tokens_per_s']:>12,.0f} tokens/s, MFU {mfu_text(row['mfu'])}, "
            f"peak memory {gib(row['peak_memory_bytes'])} (compile {row['compile_s']:.1f} s, wall {row['wall_s']:.1f} s)")
    return line + (f" [{row['error']}]" if row["error"] else "")


def markdown(result: dict) -> str:
    dev = result["device"]
    lines = [
        f"# GPU check, {result['date']}: {dev['name']}",
        "",
        f"`{result['command']}`, {result['mode']} mode, "
        f"precision {result['precision']}; jax {dev['jax']} ({dev['platform_version']}); host {result['host']['cpu_model']}, "
        f"{result['host']['cpus']} CPUs. MFU: PaLM model FLOPs x tokens/s over {result['peak_source']}"
        + (f" ({result['peak_flops'] / 1e12:.3g} TFLOP/s)" if result["peak_flops"] else "") + ".",
        f"Estimated {result['estimate_s']:.0f} s, took {result['wall_s']:.0f} s." if result["estimate_s"] else
        f"Took {result['wall_s']:.0f} s.",
        "",
        "| shape | layers | batch x seq | steps | params (active) | tokens/s | MFU | peak memory | compile s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else f"failed: {r['error']}"
        lines.append(
            f"| {r['shape']}{' (MoE)' if r['moe'] else ''} | {r['n_layers']} | {r['batch']} x {r['seq_len']} | {r['steps']} | "
            f"{r['params_active'] / 1e6:.2f} M | {tps} | {mfu_text(r['mfu'])} | {gib(r['peak_memory_bytes'])} | "
            f"{'-' if r['compile_s'] is None else format(r['compile_s'], '.1f')} | {r['wall_s']:.1f} |"
        )
    lines += ["", "Peak memory is `peak_bytes_in_use`, the process's peak so far (shapes run smallest first); "
              "XLA's per-shape analysis is in gpu_check.json (`xla_memory`).", ""]
    return "\n".join(lines)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


def default_out(device: dict, today: str) -> Path:
    name = device["device_kind"] if device["platform"] != "cpu" else device["cpu_model"] or "cpu"
    name = re.sub(r"\((r|tm)\)|\b(processor|cpu|\d+-core)\b", "", name, flags=re.I)
    return BENCHMARKS / "results" / f"gpu-check-{today}-{slug(name)}"


def write_results(out: Path, result: dict) -> None:
    atomic_write_json(out / JSON_FILE, result)
    atomic_write_text(out / MARKDOWN_FILE, markdown(result))


# ---- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="results directory (default benchmarks/results/gpu-check-DATE-DEVICE/)")
    parser.add_argument("--reduced", action="store_true", help="smallest shapes, a few steps (automatic on CPU)")
    parser.add_argument("--precision", choices=("bf16", "f32"), help="default: bf16 on an accelerator, f32 on CPU")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply every shape's steps (>= 8 each)")
    parser.add_argument("--store", default="stdlib", help="token store (a built-in source name or a prepared store)")
    parser.add_argument("--only", help="comma-separated shape names (e.g. ladder-d1024): train only these")
    args = parser.parse_args(argv)
    if not (args.steps_scale > 0 and math.isfinite(args.steps_scale)):
        parser.error(f"--steps-scale: must be a positive number, got {args.steps_scale}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    say = lambda text: print(text, flush=True)  # noqa: E731
    started = time.perf_counter()
    device = device_info()
    on_cpu = device["platform"] == "cpu"
    reduced = args.reduced or on_cpu
    precision = args.precision or ("f32" if on_cpu else "bf16")
    today = datetime.date.today().isoformat()
    out = args.out or default_out(device, today)
    say(f"device: {device['name']}; jax {device['jax']}, {device['platform_version']}")
    if on_cpu and not args.reduced:
        say("no accelerator: reduced mode (the smallest shapes, a few steps)")
    peak, peak_source = peak_for(device, precision)
    say(f"peak: {f'{peak / 1e12:,.3g} TFLOP/s, ' if peak else ''}{peak_source}")

    plan = shapes(reduced, args.steps_scale)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in plan}
        if unknown:
            raise SystemExit(f"--only: no shape {', '.join(sorted(unknown))} in {'reduced' if reduced else 'full'} mode; "
                             f"choose from {', '.join(s.name for s in plan)}")
        plan = [s for s in plan if s.name in wanted]
    configs = {s.name: train_config(s, precision, args.store, device["count"]) for s in plan}
    from delphi.train.memory import estimate_train_memory

    plan.sort(key=lambda s: estimate_train_memory(configs[s.name]).total)  # see the docstring: peak memory
    setup_s = CPU_SETUP_S if on_cpu else ASSUMED_SETUP_S
    estimates = {s.name: estimate_s(describe(s, configs[s.name]), peak, setup_s=setup_s) for s in plan}
    total = sum(estimates.values()) if peak else None
    for s in plan:
        cfg = configs[s.name]
        est = f"~{estimates[s.name]:.0f} s" if peak else "unknown"
        say(f"plan: {s.name:15s} d{s.model.d_model} L{s.model.n_layers} {'MoE' if s.model.moe else 'dense'} "
            f"B{cfg.data.batch_size}x{cfg.data.seq_len} {cfg.steps} steps ({cfg.optim.optimizer}): {est}")
    if total is not None:
        text = (f"estimate: ~{total:.0f} s (~{total / 60:.1f} min): FLOPs per token x tokens / ({ASSUMED_MFU:.0%} MFU "
                f"of the peak) + {setup_s:.0f} s set-up a shape")
        if not on_cpu:
            observed = sum(estimate_s(describe(s, configs[s.name]), peak, OBSERVED_MFU) for s in plan)
            text += f"; ~{observed:.0f} s (~{observed / 60:.1f} min) at the {OBSERVED_MFU:.0%} MFU measured on an H200"
        say(text)
    else:
        say("estimate: unknown (no peak for this device)")

    result = {
        "issue": 42, "date": today, "command": " ".join(["benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
        "mode": "reduced" if reduced else "full", "precision": precision,
        "device": device, "host": machine(), "load_average_start": os.getloadavg(),
        "peak_flops": peak, "peak_source": peak_source, "assumed_mfu": ASSUMED_MFU,
        "assumed_setup_s": setup_s, "estimate_s": total, "observed_mfu": OBSERVED_MFU, "steps_scale": args.steps_scale,
        "store": args.store, "out": str(out), "rows": [], "wall_s": None,
        "memory_note": "peak_memory_bytes is the process-wide peak_bytes_in_use after the shape (JAX cannot reset it); "
                       "shapes run in increasing memory estimate; xla_memory is the shape's own compiled train chunk",
    }
    largest = 0
    for s in plan:
        cfg = configs[s.name]
        row = run_shape(s, cfg, peak, peak_source, largest, setup_s)
        largest = max(largest, row["memory_estimate_bytes"])
        result["rows"].append(row)
        result["wall_s"] = time.perf_counter() - started
        result["load_average_end"] = os.getloadavg()
        write_results(out, result)
        say(progress_line(row))
        gc.collect()
    if total is not None:
        say(f"total wall {result['wall_s']:.0f} s against an estimate of {total:.0f} s")
    say(f"results: {out / JSON_FILE}, {out / MARKDOWN_FILE}")
    return 1 if any(r["error"] for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
