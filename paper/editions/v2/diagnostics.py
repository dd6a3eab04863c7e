"""Diagnostic runs after the 10x miss (none preregistered: they test explanations, not predictions).

Hypotheses:
1. Depth. The 10x hero (d112 L4) beat VPNLS by 7% because L4 is a depth the ladder trained only
   far from its optimum. Then d96 L3 at the same 1e14 FLOPs lands near VPNLS's prediction.
2. The law's form. VPNLS's asymptote E is not identified by a one-decade ladder and bends its
   extrapolation too early. Then d96 L3 also beats VPNLS, by about as much, and lands near the
   isoFLOP law (with its curvature penalty), as the 10x hero did.
3. Pinning E. Long rungs of the smallest shapes (d24, d32 at 4e13 FLOPs: 3,200-8,500 tokens per
   parameter) identify the data term; refitted with them, VPNLS moves toward the actual heroes.

   With them, the 90% interval of a 30x L3 hero (d96 L3 at 3e14 FLOPs, untrained) narrows.

Method: each run in `diagnostics/` was trained with `delphi train` from a config that the ladder's
own planner made (`make_rung` on the paper v2 spec, batch 8 as at the top budget). The laws are
refitted on `study/results.csv` (fpt6, as the 10x study) with the code the gates run
(`cross_check_predictions`'s `predict_hero`), then VPNLS again with the long rungs added.

    python paper/editions/v2/diagnostics.py        # writes paper/editions/v2/diagnostics.csv and diagnostics_30x.csv
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from delphi.editions import edition_tree
from delphi.fits import fit_approach2, fit_vpnls, load_results
from delphi.io import atomic_write_text
from delphi.ladder.plan import make_rung, shape_for_width
from delphi.ladder.spec import load_ladder_spec
from delphi.model.flops import count_params, flops_per_token
from delphi.prereg.predict import predict_hero
from delphi.train.config import load_train_config

HERE = Path(__file__).resolve().parent
DATA = edition_tree(HERE)  # the compact edition, unpacked (delphi.editions): run dirs as they were
LADDER = DATA / "study" / "results.csv"
RUNS = DATA / "diagnostics"
HEROES = {"hero 10x (sealed)": DATA / "study_10x" / "hero", "rehearsal 3x (sealed)": DATA / "study_10x" / "rehearsal"}
CONVENTION = "fpt6"  # the 10x study's choice (paper/editions/v2/study_10x/fits/conventions.json)
HERO_30X = (96, 3e14)  # the largest L3 width under the spec's depth rule, at 30x the top budget
BOOTSTRAP = 200


def run_dirs() -> dict[str, Path]:
    runs = dict(HEROES)
    runs.update({p.name: p for p in sorted(RUNS.iterdir()) if (p / "summary.json").is_file()} if RUNS.is_dir() else {})
    return runs


def long_rung_rows(template: pd.DataFrame, dirs: list[Path]) -> pd.DataFrame:
    """Results-table rows for finished long rungs, shaped like the ladder's rows of the same width."""
    rows = []
    for d in dirs:
        cfg = load_train_config(d / "config.yaml")
        row = template[template["d_model"] == cfg.model.d_model].iloc[0].copy()
        tokens = cfg.tokens
        flops = flops_per_token(cfg.model, cfg.data.seq_len) * tokens
        row.update(
            {
                "run_id": d.name,
                "cell_id": d.name,
                "tokens": tokens,
                "flops": flops,
                "budget": flops,
                "loss": json.loads((d / "summary.json").read_text())["val_loss"],
                "steps": cfg.steps,
                "lr": cfg.optim.lr,
                "seed": cfg.seed,
                "tokens_per_param": tokens / count_params(cfg.model).nonembedding,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> int:
    raw = pd.read_csv(LADDER)
    ladder = load_results(LADDER, params_convention=CONVENTION)
    runs = run_dirs()
    long_dirs = [p for name, p in runs.items() if name.startswith("long_")]
    fits = {"vpnls": fit_vpnls(ladder), "isoflop": fit_approach2(ladder)}
    if long_dirs:
        with_long = pd.concat([raw, long_rung_rows(raw, long_dirs)], ignore_index=True)
        fits["vpnls + long rungs"] = fit_vpnls(load_results(with_long, params_convention=CONVENTION))
    family = ladder.attrs.get("flops_family")
    fits = {k: f.with_family(family) if family is not None else f for k, f in fits.items()}
    lines = ["run,d_model,n_layers,flops,tokens_per_param,actual," + ",".join(f"{k} predicted,{k} error" for k in fits)]
    for name, d in runs.items():
        cfg = load_train_config(d / "config.yaml")
        actual = json.loads((d / "summary.json").read_text())["val_loss"]
        cells = []
        for fit in fits.values():
            predicted = float(predict_hero(fit, cfg)[0]["loss"])
            cells += [f"{predicted:.4f}", f"{actual / predicted - 1:+.4f}"]
        tpp = cfg.tokens / count_params(cfg.model).nonembedding
        flops = flops_per_token(cfg.model, cfg.data.seq_len) * cfg.tokens
        lines.append(
            f"{name},{cfg.model.d_model},{cfg.model.n_layers},{flops:.3g},{tpp:.0f},{actual:.4f}," + ",".join(cells)
        )
    lines.append(
        "# E of each VPNLS fit: "
        + "; ".join(
            f"{k} E={f.params['E']:.3f} alpha={f.params['alpha']:.3f} beta={f.params['beta']:.3f}"
            for k, f in fits.items()
            if "vpnls" in k
        )
    )
    atomic_write_text(HERE / "diagnostics.csv", "\n".join(lines) + "\n")
    print("\n".join(lines))

    # The 30x L3 hero the gates would now allow (were its steps inside the ladder's range): its
    # VPNLS prediction and 90% interval, with and without the long rungs.
    spec = load_ladder_spec(DATA / "study" / "ladder" / "ladder.yaml")
    width, compute = HERO_30X
    hero = make_rung(spec, shape_for_width(spec, width), compute, 0, batch=8).train
    rows = ["fit,predicted,lo90,hi90,half_width"]
    tables = {"vpnls": ladder}
    if long_dirs:
        tables["vpnls + long rungs"] = load_results(with_long, params_convention=CONVENTION)
    for name, table in tables.items():
        fit = fit_vpnls(table, n_bootstrap=BOOTSTRAP, seed=0)
        fit = fit.with_family(family) if family is not None else fit
        pred = predict_hero(fit, hero)[0]
        lo, hi = pred["loss_interval_90"]
        rows.append(f"{name},{pred['loss']:.4f},{lo:.4f},{hi:.4f},{(hi - lo) / 2 / pred['loss']:.4f}")
    atomic_write_text(HERE / "diagnostics_30x.csv", "\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
