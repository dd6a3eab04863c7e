"""The default study's heroes against the intervals today's code seals on the same ladders (post hoc).

    .venv/bin/python benchmarks/default_study/reseal.py [NAME=]RUN_DIR ... [--out reseal.csv]

NAME is the run's row name in summary.csv (default: the directory's name). Each RUN_DIR is a finished default study (`delphi study --out`, or an archived copy with
results.csv, hero.yaml, study.json, fits/conventions.json and preregistration.outcome.json). For each
it refits the primary isoFLOP law exactly as the study's fit stage does (the chosen parameter
convention, the ladder's exact FLOPs family, the study's bootstrap size and seed) once per resample
of `delphi.fits.bootstrap` in RESAMPLES, and takes the hero's prediction as `delphi prereg create`
seals it (`delphi.prereg.predict.hero_prediction`). "seeds" is the resample the runs were sealed
with, so its rows must reproduce the sealed interval (column `reproduces_seal`); "cells" is the
shipped one. The point is the law's own either way; only the interval changes.

Each "cells" row is also re-sealed with the design's bias corrected as the study now seals it
(hero.point_correction, `delphi.fits.intervals.correct_by_design`), the correction measured
leave-one-seed-out: the mean and standard error of actual / law - 1 over the table's other seeds,
so no seed is corrected by its own error (column `correction`: "none" or "leave-one-seed-out").
These rows need no refit: with no RUN_DIR the script only re-derives them from the table.

These intervals are made after each outcome was known: a check of the interval rule, not a
preregistration. `delphi fit coverage` reads the "cells" rows (with and without the correction) as
its own, labelled rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from delphi.fits import load_results
from delphi.fits.intervals import PointCorrection, correct_by_design
from delphi.fits.isoflop import fit_approach2
from delphi.ladder.family import flops_family
from delphi.ladder.spec import ladder_spec_from_dict
from delphi.prereg.evidence import Evidence, PredictionRule
from delphi.prereg.predict import hero_prediction
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
RESAMPLES = ("seeds", "cells")  # as sealed before issue 43; as shipped since
LEAVE_ONE_OUT = "leave-one-seed-out"


def reseal(name: str, run: Path, resample: str) -> dict:
    pinned = json.loads((run / "study.json").read_text())
    study = pinned["study"]
    if study["primary_fit"] != "isoflop":
        raise SystemExit(f"{run}: primary_fit {study['primary_fit']!r}; this script re-seals the isoFLOP law only")
    convention = json.loads((run / "fits" / "conventions.json").read_text())["chosen"]
    family = flops_family(ladder_spec_from_dict(pinned["ladder"]), convention)
    table = load_results(run / "results.csv", params_convention=convention, family=family)
    fit = fit_approach2(table, n_bootstrap=study["bootstrap"], seed=study["seed"], resample=resample).with_family(
        family
    )
    with tempfile.TemporaryDirectory() as tmp:
        fit_path = Path(tmp) / "isoflop.json"
        fit_path.write_text(json.dumps(fit.to_json()))
        evidence = Evidence(fit_path=fit_path, results=run / "results.csv")
        final, _ = hero_prediction(evidence, load_train_config(run / "hero.yaml"), PredictionRule())
    outcome = json.loads((run / "preregistration.outcome.json").read_text())
    gates = json.loads((run / "gates.json").read_text())
    sealed = gates["prediction"]
    actual = float(outcome["actual_final_loss"])
    (lo90, hi90), (lo50, hi50) = final["loss_90"], final["loss_50"]
    return {
        "run": name,
        "study_seed": study["seed"],
        "resample": resample,
        "tolerance_at_seal": study["hero"]["tolerance"],
        "gates_failed_at_seal": ";".join(gates["failed"]),
        "predicted": final["loss"],
        "lo90": lo90,
        "hi90": hi90,
        "lo50": lo50,
        "hi50": hi50,
        "actual": actual,
        "rel_error": actual / final["loss"] - 1,
        "covered_90": lo90 <= actual <= hi90,
        "covered_50": lo50 <= actual <= hi50,
        "reproduces_seal": (abs(lo90 - sealed["loss_90"][0]) < 1e-9 and abs(hi90 - sealed["loss_90"][1]) < 1e-9)
        if resample == "seeds"
        else None,
    }


def corrected_leave_one_out(table: pd.DataFrame) -> pd.DataFrame:
    """The "cells" rows re-sealed with the bias correction, each seed's measured on the other seeds."""
    plain = table[(table["resample"] == "cells") & (table["correction"] == "none")]
    rows = []
    for r in plain.itertuples():
        others = plain.loc[plain["study_seed"] != r.study_seed, "rel_error"]
        correction = PointCorrection(
            float(others.mean()), float(others.std(ddof=1) / len(others) ** 0.5), LEAVE_ONE_OUT
        )
        final = correct_by_design(
            {"loss": r.predicted, "loss_90": [r.lo90, r.hi90], "loss_50": [r.lo50, r.hi50], "source": "isoflop"},
            correction,
        )
        (lo90, hi90), (lo50, hi50) = final["loss_90"], final["loss_50"]
        rows.append(
            r._asdict()
            | {
                "correction": LEAVE_ONE_OUT,
                "correction_rel": correction.rel,
                "correction_sd_rel": correction.sd_rel,
                "predicted": final["loss"],
                "lo90": lo90,
                "hi90": hi90,
                "lo50": lo50,
                "hi50": hi50,
                "rel_error": r.actual / final["loss"] - 1,
                "covered_90": lo90 <= r.actual <= hi90,
                "covered_50": lo50 <= r.actual <= hi50,
                "reproduces_seal": None,
            }
        )
    return pd.DataFrame(rows).drop(columns="Index")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="[NAME=]RUN_DIR (none: only re-derive the corrected rows)")
    parser.add_argument("--out", type=Path, default=HERE / "reseal.csv")
    args = parser.parse_args()
    named = [(arg.split("=", 1) if "=" in arg else (Path(arg).name, arg)) for arg in args.runs]
    rows = [reseal(name, Path(run), resample) | {"correction": "none"} for name, run in named for resample in RESAMPLES]
    table = pd.DataFrame(rows, columns=None if rows else ["run"])
    if args.out.is_file():  # rows of runs not given this time are kept
        old = pd.read_csv(args.out)
        old["correction"] = old["correction"].fillna("none") if "correction" in old else "none"
        table = pd.concat([old[~old["run"].isin(table["run"])], table], ignore_index=True)
    table = table[table["correction"] == "none"]
    table = pd.concat([table, corrected_leave_one_out(table)], ignore_index=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    table.sort_values(["study_seed", "resample", "correction"]).to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(args.out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
