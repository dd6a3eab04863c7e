"""What experiments after an edition's seal showed about it (post hoc; its sealed numbers unchanged):
the paragraphs of the paper's "After the seal" section, each from an experiment's own summary file
(`benchmarks/seed_noise/summary.json`, `benchmarks/law_miss/summary.json`, `half_batch.csv` and
`default_half_batch*.json`, written by the scripts beside them). A paragraph whose summary is absent
says so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from delphi.editions import EDITIONS_DIR, edition_root

SEED_NOISE_SUMMARY = Path("benchmarks/seed_noise/summary.json")
LAW_MISS_SUMMARY = Path("benchmarks/law_miss/summary.json")
HALF_BATCH_TABLE = Path("benchmarks/law_miss/half_batch.csv")
DEFAULT_HALF_BATCH_SUMMARY = Path("benchmarks/law_miss/default_half_batch.json")
DEFAULT_RUNG_HALF_BATCH_SUMMARY = Path("benchmarks/law_miss/default_half_batch_C4e11_d40_L3_E8k2_s0.json")
# The half-batch 30x pair's sealed bands on the drop (full - half) / full
# (benchmarks/law_miss/PREDICTIONS_HALF_BATCH.md): >= SWING explains the 10x-to-30x swing, < NONE is no effect.
HALF_BATCH_SWING = 0.015
HALF_BATCH_NONE = 0.002
NOT_MEASURED = "not measured for this edition in this checkout (no summary file about it)"


def _pct(x: float, sign: bool = False) -> str:
    return f"{100 * x:+.2f}%" if sign else f"{100 * x:.2f}%"


def seed_noise_text(summary: dict, results: pd.DataFrame) -> str:
    """The crossed-seed cells against their two-seed sds in the edition's table, the factors, the lever."""
    base = {c["cell"]: c for c in summary["cells"] if c["lever"] == "base" and "f_init" in c}  # the crossed cells
    pairs = [c for c in summary["cells"] if c["lever"] == "base" and "gap_final_set" in c]
    lever = [c for c in summary["cells"] if c["lever"] != "base"]
    two_seed = results.groupby("cell_id")["loss"].agg(lambda s: s.std(ddof=1) / s.mean())
    cells = ", ".join(
        f"{cell} {_pct(c['sd_rel'])} on {c['n']} runs ({_pct(two_seed[cell])} on its {len(results[results.cell_id == cell])} seeds)"
        for cell, c in sorted(base.items(), key=lambda kv: -two_seed.get(kv[0], 0))
        if cell in two_seed
    )
    pooled = summary.get("pooled") or {}
    text = (
        f"A per-cell seed sd from two seeds is a one-degree-of-freedom estimate. Trained as init seed x data "
        f"seed (3 x 3), {len(base)} cells of the smallest budget gave: {cells}. The edition's contrast between "
        f"cells is the scatter of the estimate."
    )
    if pooled:
        text += (
            f" Neither the init nor the data order is separated from their interaction (pooled over "
            f"{pooled['cells']} cells: F init {pooled['f_init']:.2f}, p {pooled['p_init']:.2f}; F data "
            f"{pooled['f_data']:.2f}, p {pooled['p_data']:.2f})."
        )
    for c in pairs:
        text += (
            f" The {c['cell']} run, retrained on another build of the corpus with the edition's seed pair: its "
            f"seeds end {_pct(c['gap_final_set'], sign=True)} apart, their largest gap before the decay "
            f"{_pct(c['max_abs_gap_before_decay'])}."
        )
    for c in lever:
        same = base.get(c["cell"])
        if same is not None:
            text += (
                f" Lever `{c['lever']}` on {c['cell']}: sd {_pct(c['sd_rel'])} against {_pct(same['sd_rel'])}, "
                f"mean loss {_pct(c['mean'] / same['mean'] - 1, sign=True)}."
            )
    return text


def half_batch_verdict(drop: float) -> str:
    """The sealed band a 30x half-batch drop falls in."""
    if drop >= HALF_BATCH_SWING:
        return f"the sealed band of a batch that explains the swing (>= {_pct(HALF_BATCH_SWING)})"
    if drop >= HALF_BATCH_NONE:
        return (
            f"the sealed band of a batch cost that one pair cannot separate from noise "
            f"({_pct(HALF_BATCH_NONE)} to {_pct(HALF_BATCH_SWING)})"
        )
    return f"the sealed band of no batch effect (< {_pct(HALF_BATCH_NONE)})"


def _moved(summary: dict) -> str:
    """'-1.54% (mean of 10 seeds each, 90% [-1.82%, -1.25%])': what half the batch did to the final loss."""
    lo, hi = summary["drop_90"]
    return (
        f"{_pct(-summary['drop_mean'], sign=True)} (mean of {summary['n_seeds']} seeds each, "
        f"90% [{_pct(-hi, sign=True)}, {_pct(-lo, sign=True)}])"
    )


def default_half_batch_text(hero: dict, rung: dict | None = None) -> str:
    """The default study's hero, and a rung of its top budget, at half their batch over their seeds."""
    text = (
        f" The default study's hero, also at twice the batch its top budget trained: half the batch moved "
        f"its final loss by {_moved(hero)}; one run's seed sd is {_pct(hero['loss_sd_rel']['full'])}."
    )
    if rung is not None:
        inside = "so the recipe's batch costs inside the ladder too" if rung["drop_90"][0] > 0 else "no cost inside it"
        text += (
            f" Its top budget's rung {rung['target']}, at the largest batch that ladder trained: "
            f"{_moved(rung)}, {inside}."
        )
    return text


def law_miss_text(
    summary: dict,
    half_batch: pd.DataFrame | None,
    default_half_batch: dict | None = None,
    default_rung_half_batch: dict | None = None,
) -> str:
    """The primary law's sensitivity to the ladder's seed noise, the 10x-to-30x swing, the tokens
    trend, the half-batch test's state and, when measured, the default hero at half its batch."""
    law = summary["primary"]
    by_run = summary["laws"][law]
    b = summary["residuals"]
    mean_noise = summary["run_seed_sd_pooled"] / math.sqrt(2)
    z_30x = by_run["30x"]["rel_error"] / math.hypot(by_run["30x"]["sd_rel"], mean_noise)
    text = (
        f"Refitted on {summary['n_choices']} one-seed ladders (one seed per cell), {law}'s predictions move "
        f"with sd {_pct(by_run['3x']['sd_rel'])}, {_pct(by_run['10x']['sd_rel'])} and "
        f"{_pct(by_run['30x']['sd_rel'])} at 3x, 10x and 30x. With the two-seed mean's own noise, the 30x error "
        f"({_pct(by_run['30x']['rel_error'], sign=True)}) is {z_30x:.1f} sd: not ruled out as noise. The ladder's noise moves the 10x "
        f"and 30x predictions together (correlation {by_run['corr_10x_30x']:.3f}). So it cannot give "
        f"{_pct(by_run['10x']['rel_error'], sign=True)} at 10x and {_pct(by_run['30x']['rel_error'], sign=True)} at 30x at once. "
        f"That swing of {100 * by_run['swing_30x_minus_10x']:+.2f} points is {summary['swing_sd_units']:.1f} sd of "
        f"the ladder's noise and the runs' own (pooled per-run seed sd {_pct(summary['run_seed_sd_pooled'])}, "
        f"two-sided p {summary['swing_p_two_sided']:.2f}): suggestive, not conclusive. The {law} fit's residuals at "
        f"the top budgets rise with tokens ({_pct(b['slope_per_efold'], sign=True)} per e-fold), worth "
        f"{_pct(b['trend_at_hero'], sign=True)} at the 30x run's tokens: {b['trend_at_hero'] / by_run['30x']['rel_error']:.0%} of its error. The 30x run is the "
        f"first beyond the ladder's batch range ({summary['batch_seqs']['30x']} sequences against at most "
        f"{summary['batch_seqs']['ladder_max']})."
    )
    if half_batch is None:
        text += " A rerun at half its batch, with a control on the same corpus, is not yet trained."
    elif half_batch["final_val_loss"].notna().all():
        finals = half_batch.set_index("run")["final_val_loss"]
        drop = 1 - finals["half"] / finals["full"]
        predicted = by_run["30x"]["predicted"]
        edition_mean = predicted * (1 + by_run["30x"]["rel_error"])
        text += (
            f" Rerun on another build of the corpus, the 30x config ended at {finals['full']:.4f} at its batch "
            f"({_pct(finals['full'] / edition_mean - 1, sign=True)} from the edition's two-seed mean; the sealed "
            f"prediction's error on it {_pct(finals['full'] / predicted - 1, sign=True)}) and {finals['half']:.4f} at "
            f"half of it: a drop of {_pct(drop, sign=True)}, in {half_batch_verdict(drop)}."
        )
    else:
        done = ", ".join(
            f"{r.run} step {int(r.last_step):,} of {int(r.steps_planned):,}" for r in half_batch.itertuples()
        )
        text += f" A rerun at half its batch, with a control on the same corpus, is sealed and under way ({done})."
    if default_half_batch is not None:
        text += default_half_batch_text(default_half_batch, default_rung_half_batch)
    return text


def checkout_of(data: Path, paper_dir: Path) -> tuple[Path, str | None]:
    """(the checkout whose benchmarks/ hold what came after the edition, the edition's name): for
    data inside a committed edition (PAPER/editions/vN/...), the directory holding PAPER, wherever
    the text is rendered; else the paper directory's parent, and no edition."""
    root = edition_root(data)
    if root is not None and root.resolve().parent.name == EDITIONS_DIR:
        return root.resolve().parents[2], root.name
    return paper_dir.resolve().parent, None


def _summary(path: Path, edition: str | None) -> dict | None:
    """An experiment's summary if it is about `edition`."""
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("edition") == edition else None


def after_edition_numbers(repo_root: Path, edition: str | None, results: pd.DataFrame) -> dict[str, str]:
    """The placeholders `after_seed_noise` and `after_law_miss` of `edition`, whose table is `results`."""
    seed_noise = _summary(repo_root / SEED_NOISE_SUMMARY, edition)
    law_miss = _summary(repo_root / LAW_MISS_SUMMARY, edition)
    half_batch = repo_root / HALF_BATCH_TABLE
    default_hero, default_rung = (
        json.loads(path.read_text()) if path.is_file() else None
        for path in (repo_root / DEFAULT_HALF_BATCH_SUMMARY, repo_root / DEFAULT_RUNG_HALF_BATCH_SUMMARY)
    )
    return {
        "after_seed_noise": f"Seed noise: {NOT_MEASURED}."
        if seed_noise is None
        else seed_noise_text(seed_noise, results),
        "after_law_miss": f"The 30x miss: {NOT_MEASURED}."
        if law_miss is None
        else law_miss_text(
            law_miss,
            pd.read_csv(half_batch) if half_batch.is_file() else None,
            default_hero,
            default_rung,
        ),
    }
