"""The paper's "After the seal" paragraphs come from the experiments' summary files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from delphi.paper.after_edition import (
    LAW_MISS_SUMMARY,
    NOT_MEASURED,
    SEED_NOISE_SUMMARY,
    after_edition_numbers,
    law_miss_text,
)

REPO = Path(__file__).resolve().parents[1]
V8_RESULTS = REPO / "paper" / "editions" / "v8" / "study" / "results.csv"


def test_the_paragraphs_quote_the_summaries():
    numbers = after_edition_numbers(REPO, "v8", pd.read_csv(V8_RESULTS))
    seeds = json.loads((REPO / SEED_NOISE_SUMMARY).read_text())
    d28 = next(c for c in seeds["cells"] if c["cell"] == "C5.2e10_d28_L3_E8k2" and c["lever"] == "base")
    assert (
        f"C5.2e10_d28_L3_E8k2 {100 * d28['sd_rel']:.2f}% on 9 runs (2.12% on its 2 seeds)"
        in numbers["after_seed_noise"]
    )
    pair = next(c for c in seeds["cells"] if "gap_final_set" in c)  # the 3x probe's pair, not a crossed cell
    assert f"seeds end {100 * pair['gap_final_set']:+.2f}% apart" in numbers["after_seed_noise"]
    assert "3 cells of the smallest budget" in numbers["after_seed_noise"]
    miss = json.loads((REPO / LAW_MISS_SUMMARY).read_text())
    vpnls = miss["laws"][miss["primary"]]
    assert f"correlation {vpnls['corr_10x_30x']:.3f}" in numbers["after_law_miss"]
    assert f"{100 * vpnls['30x']['rel_error']:+.2f}% at 30x" in numbers["after_law_miss"]


def test_a_missing_summary_or_one_about_another_edition_says_so(tmp_path):
    for root, edition in ((tmp_path, "v8"), (REPO, "v7")):
        numbers = after_edition_numbers(root, edition, pd.read_csv(V8_RESULTS))
        assert NOT_MEASURED in numbers["after_seed_noise"] and NOT_MEASURED in numbers["after_law_miss"]


def test_the_half_batch_sentence_follows_its_table():
    miss = json.loads((REPO / LAW_MISS_SUMMARY).read_text())
    unfinished = pd.DataFrame(
        {
            "run": ["full", "half"],
            "steps_planned": [6168, 12336],
            "last_step": [4096, 8192],
            "final_val_loss": [None, None],
        }
    )
    assert "under way (full step 4,096 of 6,168, half step 8,192 of 12,336)" in law_miss_text(miss, unfinished)
    finished = unfinished.assign(last_step=[6168, 12336], final_val_loss=[1.0, 0.99])
    assert "a drop of +1.00%, in the sealed band of a batch cost that one pair cannot" in law_miss_text(miss, finished)
    swing = unfinished.assign(last_step=[6168, 12336], final_val_loss=[1.0, 0.98])
    assert "a drop of +2.00%, in the sealed band of a batch that explains the swing" in law_miss_text(miss, swing)
    none = unfinished.assign(last_step=[6168, 12336], final_val_loss=[1.0, 1.001])
    assert "a drop of -0.10%, in the sealed band of no batch effect" in law_miss_text(miss, none)
    default = {"drop_mean": 0.005, "drop_90": [0.001, 0.009], "n_seeds": 10, "loss_sd_rel": {"full": 0.01}}
    assert "moved its final loss by -0.50% (mean of 10 seeds each, 90% [-0.90%, -0.10%])" in law_miss_text(
        miss, finished, default
    )
    rung = default | {"target": "C1_d8", "drop_90": [-0.001, 0.009]}
    assert (
        "rung C1_d8, at the largest batch that ladder trained: -0.50% (mean of 10 seeds each, 90% [-0.90%, +0.10%]), no cost inside it"
        in law_miss_text(miss, finished, default, rung)
    )
