"""The trainer's memory estimate against XLA's memory analysis of the compiled train step.

    python benchmarks/memory_estimate.py [--ladders default v8 gpu] [--precisions f32 bf16]
        [--write tests/data/compiled_memory.json]

For every shape of the chosen ladders (the built-in study's, delphi/defaults/ladder_default.yaml;
the eighth edition's, studies/ladder_paper_v8.yaml, both planned in memory by
benchmarks/ladder_throughput.py; `gpu`: benchmarks/gpu_check.py's full-size items; `h200`: the shapes
the first GPU run measured, benchmarks/results/gpu-check-2026-12-04-nvidia-h200/) in each
precision: the train chunk the trainer would run, compiled from abstract shapes on this machine's
first device (`delphi.train.trainer.compile_train_chunk`: nothing is allocated, so shapes far
larger than this machine's memory compile too), XLA's memory analysis of it (arguments, outputs,
aliases, temporaries) and the trainer's own estimate (`delphi.train.memory.estimate_train_memory`,
less the runtime, which the program does not hold), and their ratio.

`--write FILE` keeps every row as JSON: tests/test_memory_estimate.py holds the estimate to
within 25% of each row without compiling them all (a subset is compiled again in every run, the
whole sweep under -m slow). Rewrite it after a change to the model, the optimizer or JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from delphi.train.config import MeshConfig, TrainConfig  # noqa: E402

LADDER_CHOICES = ("default", "v8", "gpu", "h200")
TOLERANCE = 0.25  # the estimate within 25% of the compiled program (issue 51)


# The shapes of the first GPU run (benchmarks/results/gpu-check-2026-12-04-nvidia-h200/): the
# nanoGPT comparison shape and the default ladder family at these widths, 128 x 128 tokens a step
H200_WIDTHS = (128, 256, 512, 768, 1024)
H200_BATCH = 128


def ladder_shapes(name: str) -> dict[str, TrainConfig]:
    """Shape label -> a train config of that shape (one per distinct program)."""
    import gpu_check

    if name == "gpu":  # what benchmarks/gpu_check.py trains in full
        configs = gpu_check.item_configs(gpu_check.FULL, "stdlib")
        for width, cfgs in gpu_check.ladder_configs(gpu_check.FULL, "stdlib").items():
            configs[f"ladder-d{width}"] = cfgs[0]
        return configs
    if name == "h200":
        import trainer as bench

        d256 = bench.NANOGPT_D256
        configs = {"bench-d256": bench.bench_config(bench.dense(d256), d256, "bf16", 256, "stdlib")}
        for width in H200_WIDTHS:
            model = gpu_check.ladder_model(width)
            shape = bench.Shape(f"ladder-d{width}", width, model.n_layers, gpu_check.LADDER_SEQ_LEN, H200_BATCH)
            configs[shape.name] = gpu_check.ladder_optim(bench.bench_config(model, shape, "bf16", 256, "stdlib"))
        return configs
    import ladder_throughput

    return ladder_throughput.PLANNERS[name]()[1]


def compiled_memory(cfg: TrainConfig):
    """XLA's memory analysis of `cfg`'s train chunk on this process's first device."""
    import jax

    from delphi.train.memory import CompiledMemory
    from delphi.train.sharding import make_mesh
    from delphi.train.trainer import _COMPILED, compile_train_chunk

    mesh = make_mesh(MeshConfig(), jax.devices()[:1])
    program, compile_s = compile_train_chunk([cfg], mesh)
    _COMPILED.clear()  # one program per shape: keep none of them alive
    return CompiledMemory.of(program), compile_s


def row(ladder: str, label: str, cfg: TrainConfig) -> dict:
    from delphi.train.memory import estimate_train_memory

    memory, compile_s = compiled_memory(cfg)
    estimate = estimate_train_memory(cfg)
    program_estimate = estimate.total - estimate.runtime
    return {
        "ladder": ladder,
        "shape": label,
        "precision": cfg.precision,
        "d_model": cfg.model.d_model,
        "n_layers": cfg.model.n_layers,
        "n_heads": cfg.model.n_heads,
        "moe": cfg.model.moe is not None,
        "batch": cfg.data.batch_size,
        "seq_len": cfg.data.seq_len,
        "config": cfg_dict(cfg),
        "compiled": memory.as_dict(),
        "estimate": program_estimate,
        "ratio": program_estimate / memory.total,
        "compile_s": round(compile_s, 2),
    }


def cfg_dict(cfg: TrainConfig) -> dict:
    from delphi.train.config import train_config_to_dict

    return train_config_to_dict(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladders", nargs="+", choices=LADDER_CHOICES, default=["default", "v8"])
    parser.add_argument("--precisions", nargs="+", choices=("f32", "bf16"), default=["f32", "bf16"])
    parser.add_argument("--write", type=Path, help="keep the rows as JSON (tests/data/compiled_memory.json)")
    args = parser.parse_args(argv)

    import jax

    from delphi.io import atomic_write_json

    rows = []
    started = time.perf_counter()
    for ladder in args.ladders:
        for label, cfg in ladder_shapes(ladder).items():
            for precision in args.precisions:
                r = row(ladder, label, dataclasses.replace(cfg, precision=precision))
                rows.append(r)
                print(
                    f"{ladder:8s} {label:40s} {precision:5s} compiled {r['compiled']['total'] / 1e6:10.2f} MB "
                    f"(temp {r['compiled']['temp'] / 1e6:9.2f}) estimate {r['estimate'] / 1e6:10.2f} MB "
                    f"ratio {r['ratio']:.3f} ({r['compile_s']:.1f} s)",
                    flush=True,
                )
    ratios = [r["ratio"] for r in rows]
    outside = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    print(
        f"{len(rows)} programs: estimate / compiled {min(ratios):.3f} .. {max(ratios):.3f}; "
        f"{len(outside)} outside {1 - TOLERANCE:.2f} .. {1 + TOLERANCE:.2f}; {time.perf_counter() - started:.0f} s"
    )
    if args.write:
        atomic_write_json(
            args.write,
            {
                "written_by": "benchmarks/memory_estimate.py",
                "jax": jax.__version__,
                "platform": jax.devices()[0].platform,
                "device_kind": jax.devices()[0].device_kind,
                "rows": rows,
            },
        )
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
