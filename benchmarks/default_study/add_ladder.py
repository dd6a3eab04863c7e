"""Append one default-study run's ladder (its isoFLOP rungs) and hero to `v5_ladders.csv.gz`.

    .venv/bin/python benchmarks/default_study/add_ladder.py STUDY_DIR NAME

STUDY_DIR is what `delphi study --out` wrote; NAME the run's row name in `summary.csv`
(e.g. 2026-12-04-v5-seed3). A ladder already in the table is replaced. The hero row is added
when the hero finished (a study refused by its gates has none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
DATA = HERE / "v5_ladders.csv.gz"
RUNG_COLUMNS = [
    "run_id",
    "cell_id",
    "budget",
    "d_model",
    "params",
    "tokens",
    "flops",
    "loss",
    "seed",
    "batch_size",
    "steps",
    "role",
    "health_ok",
]


def ladder_rows(study_dir: Path, name: str) -> pd.DataFrame:
    seed = json.loads((study_dir / "study.json").read_text())["study"]["seed"]
    rungs = pd.read_csv(study_dir / "results.csv")
    rows = rungs[rungs["role"] == "isoflop"][RUNG_COLUMNS].copy()
    summary_path = study_dir / "hero" / "summary.json"
    if summary_path.is_file():
        hero = json.loads(summary_path.read_text())
        if hero.get("status") == "completed":
            rows = pd.concat(
                [
                    rows,
                    pd.DataFrame(
                        [
                            {
                                "run_id": "hero",
                                "params": hero["params_nonembedding"],
                                "tokens": hero["tokens"],
                                "flops": hero["flops"],
                                "loss": hero["val_loss"],
                                "role": "hero",
                            }
                        ]
                    ),
                ],
                ignore_index=True,
            )
    rows.insert(0, "study_seed", seed)
    rows.insert(0, "ladder", name)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("name")
    args = parser.parse_args()
    table = pd.read_csv(DATA)
    new = ladder_rows(args.study_dir, args.name)
    table = pd.concat([table[table["ladder"] != args.name], new], ignore_index=True)
    tmp = DATA.with_name(DATA.name + ".tmp")
    table.to_csv(tmp, index=False, compression={"method": "gzip", "mtime": 0})
    tmp.replace(DATA)
    print(
        f"{args.name}: {int((new['role'] == 'isoflop').sum())} rungs, hero {'yes' if (new['role'] == 'hero').any() else 'no'}"
    )


if __name__ == "__main__":
    main()
