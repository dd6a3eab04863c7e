"""Method choice: which law extrapolates best on public sweeps like this one, and how like them a sweep is.

A sweep is compared with the calibration's sources by median model size and number of budgets; the
method with the lowest calibrated leave-one-source-out error on the most similar sources is chosen
(`choose_method`), for a study's `primary_fit: auto` once (`choose_primary`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from delphi.errors import DelphiError
from delphi.fits.beyond import sweep_features
from delphi.fits.calibration_file import calibration_provenance, load_calibration
from delphi.fits.data import isoflop_rows

# Method choice: how many of the most similar public sources decide, and how a difference in
# the number of budgets weighs against one in model size. Judgment, not measurement: four budgets
# (about the gap between Marin's 6 and Llama's 8-plus-2) count as much as a decade of model size.
SIMILAR_SOURCES = 3
# A method is eligible only if its calibrated 90% intervals covered at least this share of the
# similar sweeps' held-out points (LOSO): the target band is 85-95%; 80% leaves room for the few
# points (18-40) a choice rests on. If no method qualifies, every calibrated method competes.
MIN_CHOICE_COVERAGE_90 = 0.80
BUDGETS_PER_SIZE_DECADE = 4.0
SIZE_DECADE = 1.0


def similar_sources(
    features: dict[str, float], calibration: dict[str, Any], k: int = SIMILAR_SOURCES
) -> list[tuple[str, float]]:
    """The k public sources most like a sweep: (name, distance), distance = |decades of median model
    size apart| / SIZE_DECADE + |budgets apart| / BUDGETS_PER_SIZE_DECADE."""
    dist = []
    for name, f in calibration["sources"].items():
        d = (
            abs(f["log10_median_params"] - features["log10_median_params"]) / SIZE_DECADE
            + abs(f["n_budgets"] - features["n_budgets"]) / BUDGETS_PER_SIZE_DECADE
        )
        dist.append((name, float(d)))
    return sorted(dist, key=lambda t: (t[1], t[0]))[:k]


def source_likeness(features: dict[str, float], calibration: dict[str, Any]) -> dict[str, Any]:
    """The source check: how far a sweep lies from the calibration's sources, and how far the
    calibration has been carried out of sample. Distance as `similar_sources` measures it
    (decades of median model size, and budgets / BUDGETS_PER_SIZE_DECADE); the reach is the largest
    distance from any source to its nearest other source: leave-one-source-out scoring applied the
    calibration that far from what it was fitted on.
    `like` is whether the sweep lies within that reach."""
    sources = calibration["sources"]
    nearest = similar_sources(features, calibration, 1)
    reach = 0.0
    for name, f in sources.items():
        others = {"sources": {n: g for n, g in sources.items() if n != name}}
        if others["sources"]:
            reach = max(reach, similar_sources(f, others, 1)[0][1])
    distance = nearest[0][1] if nearest else math.inf
    return {
        "nearest_source": nearest[0][0] if nearest else None,
        "distance": float(distance),
        "reach": float(reach),
        "like": bool(distance <= reach),
    }


def choose_method(
    features: dict[str, float],
    calibration: dict[str, Any],
    methods: Sequence[str] | None = None,
    k: int = SIMILAR_SOURCES,
) -> dict[str, Any]:
    """The method with the lowest calibrated out-of-sample (LOSO) mean |error| on the k public sources
    most like the sweep (`similar_sources`), among methods with a calibration whose calibrated 90%
    intervals covered >= MIN_CHOICE_COVERAGE_90 there. Ties: 90% coverage nearer 90%. Returns the choice, the table behind it and the sources."""
    near = similar_sources(features, calibration, k)
    names = {n for n, _ in near}
    allowed = set(calibration["methods"]) if methods is None else set(methods) & set(calibration["methods"])
    if not allowed:
        raise DelphiError(
            f"method choice: none of {sorted(methods or [])} has a calibration "
            f"(calibrated: {sorted(calibration['methods'])})"
        )
    table = []
    for method in sorted(allowed):
        part = [r for r in calibration["loso"] if r["method"] == method and r["source"] in names]
        n = sum(r["n"] for r in part)
        if not n:
            continue
        mean = lambda key: sum(r[key] * r["n"] for r in part) / n  # noqa: B023  (called at once, inside the loop)
        table.append(
            {
                "method": method,
                "n": n,
                "mean_abs_rel_error": mean("mean_abs_rel_error"),
                "mean_abs_rel_error_uncalibrated": mean("mean_abs_rel_error_uncalibrated"),
                "coverage_50": mean("coverage_50"),
                "coverage_90": mean("coverage_90"),
            }
        )
    for r in table:
        r["eligible"] = r["coverage_90"] >= MIN_CHOICE_COVERAGE_90
    if not any(r["eligible"] for r in table):
        for r in table:
            r["eligible"] = True
    table.sort(key=lambda r: (not r["eligible"], r["mean_abs_rel_error"], abs(r["coverage_90"] - 0.9)))
    return {
        "method": table[0]["method"],
        "table": table,
        "similar_sources": [{"source": n, "distance": d} for n, d in near],
        "features": features,
        "rule": f"lowest calibrated leave-one-source-out mean |error| on the {k} public sources most like the sweep "
        f"(model size and number of budgets), among methods whose calibrated 90% intervals covered >= "
        f"{MIN_CHOICE_COVERAGE_90:.0%} there",
    }


# The laws that can size a hero (they predict N*(C)); a study's primary law is chosen among them.
PRIMARY_CAPABLE = ("isoflop", "parametric", "vpnls")


def table_features(table: pd.DataFrame) -> dict[str, float]:
    """The sweep features method choice compares (`beyond.sweep_features`) of a results table's
    isoFLOP rows (anchor rungs are not part of any budget's sweep)."""
    return sweep_features(isoflop_rows(table))


def choose_primary(
    table: pd.DataFrame, fits: Sequence[str], calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A study's `primary_fit: auto`: `choose_method` on the table's sweep features (as `calibrate_final`
    computes them), among the laws that can size a hero (PRIMARY_CAPABLE) that the study fits. The
    choice, its table and the calibration's provenance, to be recorded once and never re-chosen."""
    candidates = [m for m in PRIMARY_CAPABLE if m in fits]
    if not candidates:
        raise DelphiError(
            f"primary_fit: auto chooses among {list(PRIMARY_CAPABLE)}, and fits {list(fits)} has none of them"
        )
    calibration = calibration if calibration is not None else load_calibration()
    choice = choose_method(table_features(table), calibration, candidates)
    return {**choice, "candidates": candidates, "calibration": calibration_provenance(calibration)}


def primary_note(chosen: str, primary: str | None, primary_fit: str | None) -> str:
    """How the public-sweep method choice (`chosen`) stands to the study's primary law, the law that
    made the sealed prediction, given the study's `primary_fit` setting (None: not known)."""
    if primary is None:
        return "The study's primary law has no calibration entry; it made the sealed prediction all the same."
    if chosen == primary:
        return f"It names the study's primary law, {primary}, the law that made the sealed prediction."
    why = {
        None: "this evidence did not choose it",
        "auto": (
            "with `primary_fit: auto` the fit stage chose it once, among the laws this study fits "
            '(see "Primary law chosen by evidence")'
        ),
    }
    return (
        f"It differs from the study's primary law, {primary}, which made the sealed prediction all the same: "
        + why.get(
            primary_fit,
            f"the study fixes `primary_fit: {primary_fit}`, and a fixed primary law is not re-chosen by this evidence",
        )
        + "."
    )


def method_choice_lines(choice: dict[str, Any], note: str = "", lead: str = "") -> list[str]:
    """Markdown: a `choose_method` answer (`lead` before it, its rule and the choice, `note` after it)
    and the table behind it."""
    lines = [
        " ".join(
            part
            for part in (
                lead,
                f"Method choice ({choice['rule']}): **{choice['method']}**. "
                f"Similar sweeps: {', '.join(s['source'] for s in choice['similar_sources'])}.",
                note,
            )
            if part
        ),
        "",
        "| method | held-out points | mean abs error (calibrated) | uncalibrated | 50% coverage | 90% coverage |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {r['method']} | {r['n']} | {r['mean_abs_rel_error']:.2%} | {r['mean_abs_rel_error_uncalibrated']:.2%} | "
        f"{r['coverage_50']:.0%} | {r['coverage_90']:.0%} |"
        for r in choice["table"]
    ]
