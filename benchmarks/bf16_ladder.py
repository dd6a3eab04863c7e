"""bf16 against f32 on the default study's ladder, rung by rung (issue 42): does bf16 move the final
losses by less than the seed noise?

    .venv/bin/python benchmarks/bf16_ladder.py F32_RESULTS_CSV BF16_LADDER_DIR [--out DIR]

F32_RESULTS_CSV is a default study's results table (e.g. benchmarks/default_study/2026-12-04-v7-readme-run/
results.csv); BF16_LADDER_DIR the ladder dir of the same study run with the ladder spec's
`run.precision: bf16` (`delphi study FILE --out DIR --stop-after ladder`; the ladder is DIR/ladder).
Same rungs, same seeds, same data order; only the matmuls' precision differs (bf16 inputs with f32
accumulation, f32 master weights and optimizer: `delphi.model.moe.matmul`). The seed noise is the
f32 ladder's within-cell seed sd, pooled over cells. Writes DIR/rungs.csv and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CELL = ("budget", "d_model", "n_layers")


def compare(f32_results: Path, bf16_ladder: Path) -> tuple[pd.DataFrame, dict]:
    f32 = pd.read_csv(f32_results)
    bf16 = pd.DataFrame(
        [
            {"run_id": p.parent.name, "loss_bf16": json.loads(p.read_text())["val_loss"]}
            for p in sorted((bf16_ladder / "runs").glob("*/summary.json"))
        ]
    )
    rungs = f32[["run_id", *CELL, "seed", "loss"]].rename(columns={"loss": "loss_f32"}).merge(bf16, on="run_id")
    if len(rungs) != len(f32):
        raise SystemExit(f"{bf16_ladder}: {len(rungs)} of the {len(f32)} rungs of {f32_results} have a bf16 run")
    rungs["rel_diff"] = rungs["loss_bf16"] / rungs["loss_f32"] - 1
    seed_sd = float(np.sqrt((f32.groupby(list(CELL))["loss"].std(ddof=1) ** 2).mean()))
    diff = rungs["loss_bf16"] - rungs["loss_f32"]
    summary = {
        "rungs": len(rungs),
        "mean_rel_diff": float(rungs["rel_diff"].mean()),
        "sd_rel_diff": float(rungs["rel_diff"].std(ddof=1)),
        "max_abs_rel_diff": float(rungs["rel_diff"].abs().max()),
        "rms_diff_nats": float(np.sqrt((diff**2).mean())),
        "seed_sd_nats": seed_sd,
        "rungs_within_one_seed_sd": int((diff.abs() <= seed_sd).sum()),
    }
    return rungs, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("f32_results", type=Path)
    parser.add_argument("bf16_ladder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rungs, summary = compare(args.f32_results, args.bf16_ladder)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        rungs.to_csv(args.out / "rungs.csv", index=False, float_format="%.6g")
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
