"""How often Delphi's 50% and 90% intervals covered what happened: one table the README can quote,
`delphi fit coverage`.

Every row is counted from files committed in the repository, named in its `source`, and nothing is
refitted:

1. The default study (`benchmarks/default_study/summary.csv`, one row per archived run): its current
   edition, one hero per study seed (the newest run of a seed with an outcome), covered by the sealed
   90% interval (`sealed_90_lo`, `sealed_90_hi` against `actual`). Its 50% interval is counted only
   where the summary records one (`sealed_50_lo`, `sealed_50_hi`). The current edition is the newest
   plain-numbered `edition` with outcomes: a value with a letter (5b, 5c) is a variant round of its
   edition (a recentred grid, uniform steps; benchmarks/default_study/README.md), not the shipped
   study; `edition=` picks any.
1b. The same heroes against the intervals today's code seals on their ladders
   (`benchmarks/default_study/reseal.csv`, written by `benchmarks/default_study/reseal.py`): the
   rows of the shipped resample (`resample` = RESEAL_RESAMPLE), `lo90`/`hi90` and `lo50`/`hi50`
   against `actual`. Re-sealed after each outcome was known: labelled post hoc. Where the table has
   a `correction` column, one row per value: "none" (the law's own point) and "leave-one-seed-out"
   (the design's bias corrected as the study seals it, hero.point_correction, each seed's
   correction measured on the other seeds).
2. The public sweeps, leave-one-source-out (`benchmarks/results/beyond/public_rows.csv`, written by
   `benchmarks/backtest_beyond.py` with the committed calibration): every law's prediction beyond its
   fitted budgets on each of the eight sweeps, by extrapolation bin (`beyond.EXTRAPOLATION_BINS`, from
   each row's `factor`), the calibrated intervals (`cal_lo_*`, `cal_hi_*`: fitted on the other
   sources) and the fit-only ones (`lo_*`, `hi_*`) beside them. The laws are pooled (`by_method`
   splits them). The rows' per-source, per-law counts are checked against the LOSO table of the
   committed calibration (`delphi/fits/data/beyond_calibration.json`, key `loso`).
3. Every sealed outcome in `preregistrations/`: each NAME.yaml with a NAME.outcome.json, its
   `actual_final_loss` against the sealed `prediction.final.loss_50` and `loss_90` (recomputed, not
   read from the outcome's booleans; a disagreement is a note), and, for seals with competing laws
   (`prediction.competing`), one more row: each competing law's own intervals against the same outcome.

Every count is recomputed from an interval and the observed loss (lo <= observed <= hi). A 90% row
is flagged "within 85-95%" or "outside 85-95%" when it has at least MIN_POINTS points, "too few
points (n<10)" otherwise. Bad input (a missing file, a column or key that is not there, a value that
is not a number) is a DelphiError naming the file and the column or key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.fits.beyond import EXTRAPOLATION_BINS, extrapolation_bin
from delphi.fits.coverage_rows import (
    BAND_90,
    MIN_POINTS,
    boolean,
    covered,
    interval_of,
    make_row,
    number,
    read_csv_rows,
    require_columns,
    shown,
)
from delphi.io import read_json, read_yaml
from delphi.prereg_format import outcome_path

REPO_ROOT = Path(__file__).resolve().parents[2]
SUMMARY = Path("benchmarks/default_study/summary.csv")
RESEAL = Path("benchmarks/default_study/reseal.csv")
RESEAL_RESAMPLE = "cells"  # delphi.fits.isoflop.ISOFLOP_RESAMPLE, the rows reseal.py writes for the shipped rule
RESEAL_COLUMNS = ("run", "study_seed", "resample", "lo90", "hi90", "lo50", "hi50", "actual")
BEYOND_ROWS = Path("benchmarks/results/beyond/public_rows.csv")
CALIBRATION = Path("delphi/fits/data/beyond_calibration.json")
PREREGISTRATIONS = Path("preregistrations")


SUMMARY_COLUMNS = ("edition", "study_seed", "sealed_90_lo", "sealed_90_hi", "actual")
BEYOND_COLUMNS = (
    "source",
    "method",
    "factor",
    "observed_best_loss",
    "lo_50",
    "hi_50",
    "lo_90",
    "hi_90",
    "cal_lo_50",
    "cal_hi_50",
    "cal_lo_90",
    "cal_hi_90",
)
EDITION = re.compile(r"(\d+)([A-Za-z]*)")
LOSO_TOLERANCE = 1e-9  # the calibration's LOSO coverages are floats of the same counts


# --------------------------------------------------------------------------- 1. the default study


def edition_key(edition: str) -> tuple[int, str] | None:
    m = EDITION.fullmatch(edition.strip())
    return (int(m.group(1)), m.group(2).lower()) if m else None


def current_edition(editions: Iterable[str]) -> str:
    """The newest plain-numbered edition (a lettered one, 5b, is a variant round of its edition);
    the newest of any kind when none is plain."""
    keyed = [(edition_key(e), e) for e in set(editions) if edition_key(e) is not None]
    plain = [t for t in keyed if not t[0][1]]
    return max(plain or keyed)[1]


def default_study_row(path: Path, root: Path = REPO_ROOT, edition: str | None = None) -> dict[str, Any]:
    """The default study's current edition: one hero per study seed, its sealed 90% interval (and 50%
    where the summary records one) against its outcome (module docstring, 1)."""
    path = Path(path)
    columns, rows = read_csv_rows(path, "default-study summary")
    require_columns(path, columns, SUMMARY_COLUMNS, "default-study summary")
    has_50 = "sealed_50_lo" in columns and "sealed_50_hi" in columns
    with_outcome = [(line, r) for line, r in rows if (r.get("actual") or "").strip()]
    if not with_outcome:
        raise DelphiError(f"{path}: no row has an outcome in column 'actual'; nothing to count")
    for line, r in with_outcome:
        if edition_key(r["edition"] or "") is None:
            raise DelphiError(
                f"{path}: line {line}, column 'edition' is {quoted(r['edition'])}; expected a number with an "
                "optional letter (5, 5b)"
            )
    editions = sorted({r["edition"].strip() for _, r in with_outcome}, key=edition_key)
    chosen = edition if edition is not None else current_edition(editions)
    if chosen not in editions:
        raise DelphiError(
            f"{path}: no row of edition {chosen!r} has an outcome in column 'actual' (editions with "
            f"outcomes: {', '.join(editions)})"
        )
    newest: dict[str, tuple[int, dict[str, str]]] = {}
    superseded = []
    for line, r in with_outcome:
        if (r["edition"] or "").strip() != chosen:
            continue
        seed = (r["study_seed"] or "").strip()
        if not seed:
            raise DelphiError(f"{path}: line {line}, column 'study_seed' is empty; expected the study's seed")
        if seed in newest:
            superseded.append(newest[seed][1].get("run") or f"line {newest[seed][0]}")
        newest[seed] = (line, r)  # the file lists runs in the order they were archived: the last is the newest
    hits_50, hits_90, notes, runs = [], [], [], []
    for _seed, (line, r) in sorted(newest.items(), key=lambda t: (len(t[0]), t[0])):
        actual = number(path, line, "actual", r["actual"])
        sealed_90 = interval_of(path, line, "sealed_90_lo", "sealed_90_hi", r["sealed_90_lo"], r["sealed_90_hi"])
        if sealed_90 is None:
            raise DelphiError(
                f"{path}: line {line}, column 'sealed_90_lo'/'sealed_90_hi' is empty; a run with an outcome "
                "needs its sealed 90% interval"
            )
        hit = covered(sealed_90, actual)
        hits_90.append(hit)
        recorded = boolean(r.get("sealed_90_covered"))
        if recorded is not None and recorded != hit:
            notes.append(f"{r.get('run') or f'line {line}'}: sealed_90_covered says {recorded}, recomputed {hit}")
        if has_50:
            hits_50.append(
                covered(
                    interval_of(path, line, "sealed_50_lo", "sealed_50_hi", r["sealed_50_lo"], r["sealed_50_hi"]),
                    actual,
                )
            )
        runs.append(r.get("run") or f"line {line}")
    if not has_50:
        notes.append("no 50% interval in the summary (columns sealed_50_lo, sealed_50_hi): 50% not recorded")
    if superseded:
        notes.append(f"a seed run again: the newest run counts, not {', '.join(superseded)}")
    refused = [
        r.get("run") or f"line {line}"
        for line, r in rows
        if (r.get("edition") or "").strip() == chosen and not (r.get("actual") or "").strip()
    ]
    if refused:
        notes.append(f"runs of edition {chosen} without an outcome, not counted: {', '.join(refused)}")
    others = [e for e in editions if e != chosen]
    if others:
        notes.append(f"other editions with outcomes, not counted: {', '.join(others)}")
    seeds = ", ".join(sorted(newest, key=lambda s: (len(s), s)))
    return make_row(
        f"default study, edition {chosen}: one hero per study seed ({seeds}), sealed interval",
        shown(path, root),
        len(newest),
        hits_50 if has_50 else None,
        hits_90,
        section="default_study",
        notes=notes,
        edition=chosen,
        runs=runs,
    )


def reseal_rows(path: Path, root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """The default study's heroes against today's interval rule on their own ladders, post hoc, one
    row per value of `correction` (module docstring, 1b)."""
    path = Path(path)
    columns, rows = read_csv_rows(path, "default-study reseal table")
    require_columns(path, columns, RESEAL_COLUMNS, "default-study reseal table")
    corrections = sorted({(r.get("correction") or "none").strip() for _, r in rows}, key=lambda c: c != "none")
    return [reseal_row(path, rows, correction, root) for correction in corrections]


def reseal_row(
    path: Path, rows: list[tuple[int, dict[str, str]]], correction: str, root: Path = REPO_ROOT
) -> dict[str, Any]:
    mine = [
        (line, r)
        for line, r in rows
        if (r["resample"] or "").strip() == RESEAL_RESAMPLE and (r.get("correction") or "none").strip() == correction
    ]
    if not mine:
        raise DelphiError(f"{path}: no row has resample {RESEAL_RESAMPLE!r}; nothing to count")
    hits_50, hits_90, seeds = [], [], []
    for line, r in mine:
        actual = number(path, line, "actual", r["actual"])
        hits_90.append(covered(interval_of(path, line, "lo90", "hi90", r["lo90"], r["hi90"]), actual))
        hits_50.append(covered(interval_of(path, line, "lo50", "hi50", r["lo50"], r["hi50"]), actual))
        seeds.append((r["study_seed"] or "").strip())
    how = (
        "the law's own point"
        if correction == "none"
        else f"the design's bias corrected as the study seals it, each seed's correction measured {correction}"
    )
    label = (
        f"default study, today's intervals (isoFLOP bootstrap over {RESEAL_RESAMPLE}; {how}) re-sealed on each "
        f"seed's ladder after its outcome ({', '.join(seeds)}): post hoc"
    )
    return make_row(
        label,
        shown(path, root),
        len(mine),
        hits_50,
        hits_90,
        section="default_study_reseal",
        runs=[r["run"] for _, r in mine],
    )


# --------------------------------------------------------------------------- 2. the public sweeps, leave-one-source-out


def public_sweep_rows(
    path: Path, calibration_path: Path, root: Path = REPO_ROOT, by_method: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per extrapolation bin (and all bins): the calibrated (LOSO) and fit-only intervals' coverage on
    the public sweeps, laws pooled or (`by_method`) one pair of rows per law; and notes, among them
    the check against the committed calibration's LOSO table (module docstring, 2)."""
    path, calibration_path = Path(path), Path(calibration_path)
    columns, rows = read_csv_rows(path, "table of leave-one-source-out predictions")
    require_columns(path, columns, BEYOND_COLUMNS, "table of leave-one-source-out predictions")
    if not rows:
        raise DelphiError(f"{path}: no rows; expected one per prediction beyond a sweep's fitted budgets")
    points, notes = [], []
    bin_disagrees = in_sample = 0
    for line, r in rows:
        factor = number(path, line, "factor", r["factor"])
        if factor <= 1:
            raise DelphiError(
                f"{path}: line {line}, column 'factor' is {factor:g}; expected > 1 (a prediction beyond the "
                "fitted budgets)"
            )
        label = extrapolation_bin(factor)
        if "bin" in columns and (r["bin"] or "").strip() not in ("", label):
            bin_disagrees += 1
        if "calibration_sources" in columns and r["source"] in (r["calibration_sources"] or "").split("|"):
            in_sample += 1
        observed = number(path, line, "observed_best_loss", r["observed_best_loss"])
        point = {"source": r["source"] or "", "method": r["method"] or "", "bin": label}
        for prefix in ("", "cal_"):
            for level in ("50", "90"):
                interval = interval_of(
                    path,
                    line,
                    f"{prefix}lo_{level}",
                    f"{prefix}hi_{level}",
                    r[f"{prefix}lo_{level}"],
                    r[f"{prefix}hi_{level}"],
                )
                point[f"{prefix}covered_{level}"] = covered(interval, observed)
        points.append(point)
    if in_sample:
        raise DelphiError(
            f"{path}: column 'calibration_sources': {in_sample} row(s) were calibrated on their own source; "
            "expected leave-one-source-out"
        )
    if "calibration_sources" not in columns:
        notes.append(
            f"{shown(path, root)} has no column 'calibration_sources': that each row was calibrated without its "
            "own source is not checked"
        )
    if bin_disagrees:
        notes.append(
            f"{shown(path, root)}: {bin_disagrees} row(s) name another bin than their factor's; the factor's "
            "(EXTRAPOLATION_BINS) is counted"
        )
    for prefix, _name in (("", "fit-only"), ("cal_", "calibrated")):
        for level in ("50", "90"):
            key = f"{prefix}covered_{level}"
            if key in columns:
                differ = sum(
                    1 for (_, r), p in zip(rows, points) if boolean(r[key]) is not None and boolean(r[key]) != p[key]
                )
                if differ:
                    notes.append(
                        f"{shown(path, root)}: column {key!r} disagrees with the recomputed count on {differ} row(s)"
                    )
    notes.append(loso_check(points, calibration_path, root))

    methods = list(dict.fromkeys(p["method"] for p in points))
    groups = [(m, [p for p in points if p["method"] == m]) for m in methods] if by_method else [(None, points)]
    out = []
    source = shown(path, root)
    n_sources = len({p["source"] for p in points})
    for method, group in groups:
        laws = method if method is not None else f"{len(methods)} laws pooled"
        for label in [b[0] for b in EXTRAPOLATION_BINS] + ["all"]:
            part = group if label == "all" else [p for p in group if p["bin"] == label]
            if not part:
                continue
            where = "all factors" if label == "all" else f"{label} beyond the fit"
            sweeps = len({p["source"] for p in part})
            for prefix, kind in (("cal_", "calibrated (LOSO)"), ("", "fit-only, uncalibrated")):
                out.append(
                    make_row(
                        f"public sweeps ({sweeps} of {n_sources}), {where}, {laws}: {kind}",
                        source,
                        len(part),
                        [p[f"{prefix}covered_50"] for p in part],
                        [p[f"{prefix}covered_90"] for p in part],
                        section="public_sweeps",
                        bin=label,
                        method=method or "pooled",
                        interval="calibrated" if prefix else "fit-only",
                    )
                )
    return out, notes


def loso_check(points: list[dict[str, Any]], calibration_path: Path, root: Path = REPO_ROOT) -> str:
    """Whether the rows' calibrated counts per (source, law) are the committed calibration's LOSO table."""
    calibration = read_json(calibration_path, what="calibration file")
    table = calibration.get("loso") if isinstance(calibration, dict) else None
    if not isinstance(table, list) or not all(isinstance(e, dict) for e in table):
        raise DelphiError(f"{calibration_path}: no key 'loso' with a list of per-source, per-law entries")
    mine: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in points:
        if p["cal_covered_90"] is not None:
            mine.setdefault((p["source"], p["method"]), []).append(p)
    theirs = {}
    for i, e in enumerate(table):
        for key in ("source", "method", "n", "coverage_50", "coverage_90"):
            if key not in e:
                raise DelphiError(f"{calibration_path}: loso[{i}] has no key {key!r}")
        theirs[(str(e["source"]), str(e["method"]))] = e
    differ = []
    for cell in sorted(set(mine) | set(theirs)):
        ps, e = mine.get(cell, []), theirs.get(cell)
        if e is None or not ps:
            differ.append(f"{cell[0]} {cell[1]}: {'not in the calibration' if e is None else 'no rows here'}")
            continue
        c50 = sum(bool(p["cal_covered_50"]) for p in ps) / len(ps)
        c90 = sum(bool(p["cal_covered_90"]) for p in ps) / len(ps)
        if (
            len(ps) != number(calibration_path, "loso", "n", e["n"])
            or abs(c50 - number(calibration_path, "loso", "coverage_50", e["coverage_50"])) > LOSO_TOLERANCE
            or abs(c90 - number(calibration_path, "loso", "coverage_90", e["coverage_90"])) > LOSO_TOLERANCE
        ):
            differ.append(
                f"{cell[0]} {cell[1]}: n {len(ps)}, 50% {c50:.3f}, 90% {c90:.3f} here; "
                f"n {e['n']}, 50% {float(e['coverage_50']):.3f}, 90% {float(e['coverage_90']):.3f} there"
            )
    cal = shown(calibration_path, root)
    if differ:
        return (
            f"the rows disagree with the LOSO table of {cal} in {len(differ)} of {len(set(mine) | set(theirs))} "
            f"(source, law) cells: {'; '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}"
        )
    return f"the rows' calibrated counts agree with the LOSO table of {cal} in all {len(theirs)} (source, law) cells"


# --------------------------------------------------------------------------- 3. sealed preregistrations


def _sealed_interval(path: Path, entry: dict[str, Any], key: str, where: str) -> tuple[float, float] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise DelphiError(f"{path}: key '{where}.{key}' is {quoted(value)}; expected [lo, hi]")
    return interval_of(path, f"key '{where}.{key}'", "lo", "hi", value[0], value[1])


def prereg_rows(directory: Path, root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """The primary prediction of every sealed outcome in `directory`, and the competing laws of the
    seals that sealed some (module docstring, 3)."""

    directory = Path(directory)
    if not directory.is_dir():
        raise DelphiError(f"{directory}: preregistrations directory not found")
    seals = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    sealed_outcomes = {outcome_path(p) for p in seals}
    notes = [
        f"{o.name}: no {o.name.removesuffix('.outcome.json')}.yaml beside it, not counted"
        for o in sorted(directory.glob("*.outcome.json"))
        if o not in sealed_outcomes
    ]
    primary_50, primary_90, competing_50, competing_90, competing_notes = [], [], [], [], []
    names, competing_seals, n_competing = [], [], 0
    for seal in seals:
        outcome_file = outcome_path(seal)
        if not outcome_file.is_file():
            continue
        doc, outcome = read_yaml(seal), read_json(outcome_file, what="outcome file")
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("prediction"), dict)
            or not isinstance(doc["prediction"].get("final"), dict)
        ):
            raise DelphiError(f"{seal}: no key 'prediction.final'; expected a sealed preregistration")
        if not isinstance(outcome, dict):
            raise DelphiError(f"{outcome_file}: expected a JSON object")
        if outcome.get("actual_final_loss") is None:
            notes.append(f"{outcome_file.name}: no actual_final_loss (verdict {outcome.get('verdict')!r}), not counted")
            continue
        actual = number(outcome_file, "", "actual_final_loss", outcome["actual_final_loss"])
        final = doc["prediction"]["final"]
        sealed_50 = _sealed_interval(seal, final, "loss_50", "prediction.final")
        sealed_90 = _sealed_interval(seal, final, "loss_90", "prediction.final")
        if sealed_90 is None:
            raise DelphiError(f"{seal}: no key 'prediction.final.loss_90'; expected the sealed 90% interval")
        for level, interval, hits in (("50", sealed_50, primary_50), ("90", sealed_90, primary_90)):
            hit = covered(interval, actual)
            hits.append(hit)
            recorded = outcome.get(f"covered_{level}")
            if isinstance(recorded, bool) and hit is not None and recorded != hit:
                notes.append(f"{outcome_file.name}: covered_{level} says {recorded}, recomputed {hit}")
        names.append(seal.name.removesuffix(seal.suffix))
        competing = doc["prediction"].get("competing")
        if not competing:
            continue
        if not isinstance(competing, dict):
            raise DelphiError(f"{seal}: key 'prediction.competing' is {quoted(competing)}; expected a mapping of laws")
        competing_seals.append(names[-1])
        scored = outcome.get("competing") if isinstance(outcome.get("competing"), dict) else {}
        if not scored:
            competing_notes.append(f"{outcome_file.name}: the seal has competing laws, the outcome scores none")
        for law, entry in competing.items():
            if not isinstance(entry, dict) or entry.get("loss_90") is None:
                competing_notes.append(
                    f"{seal.name}: competing law {law!r} has no 90% interval "
                    f"({(entry or {}).get('error', 'none sealed') if isinstance(entry, dict) else entry}), not counted"
                )
                continue
            where = f"prediction.competing.{law}"
            hit_50 = covered(_sealed_interval(seal, entry, "loss_50", where), actual)
            hit_90 = covered(_sealed_interval(seal, entry, "loss_90", where), actual)
            competing_50.append(hit_50)
            competing_90.append(hit_90)
            n_competing += 1
            theirs = scored.get(law) if isinstance(scored.get(law), dict) else {}
            for level, hit in (("50", hit_50), ("90", hit_90)):
                recorded = theirs.get(f"covered_{level}")
                if isinstance(recorded, bool) and hit is not None and recorded != hit:
                    competing_notes.append(
                        f"{outcome_file.name}: competing {law!r} covered_{level} says {recorded}, recomputed {hit}"
                    )
    source = f"{shown(directory, root)}/"  # every NAME.yaml with a NAME.outcome.json in it
    rows = [
        make_row(
            f"sealed preregistrations: the primary prediction of each outcome ({len(names)})",
            source,
            len(names),
            primary_50,
            primary_90,
            section="preregistrations",
            notes=notes,
            seals=names,
        )
    ]
    if competing_seals:
        rows.append(
            make_row(
                f"sealed preregistrations: competing laws' intervals ({n_competing} laws of "
                f"{', '.join(competing_seals)})",
                source,
                n_competing,
                competing_50,
                competing_90,
                section="competing",
                notes=competing_notes,
                seals=competing_seals,
            )
        )
    return rows


# --------------------------------------------------------------------------- the table


def coverage_table(
    root: Path = REPO_ROOT,
    *,
    summary: Path | None = None,
    beyond_rows: Path | None = None,
    calibration: Path | None = None,
    preregistrations: Path | None = None,
    edition: str | None = None,
    by_method: bool = False,
    reseal: Path | None = None,
) -> dict[str, Any]:
    """Every row (module docstring) and the notes behind them. Paths default to the committed files
    under `root`."""
    root = Path(root)
    summary = Path(summary) if summary is not None else root / SUMMARY
    beyond_rows = Path(beyond_rows) if beyond_rows is not None else root / BEYOND_ROWS
    calibration = Path(calibration) if calibration is not None else root / CALIBRATION
    preregistrations = Path(preregistrations) if preregistrations is not None else root / PREREGISTRATIONS
    rows = [default_study_row(summary, root, edition)]
    if reseal is not None or (root / RESEAL).is_file():  # optional under another --root
        rows += reseal_rows(Path(reseal) if reseal is not None else root / RESEAL, root)
    sweep_rows, sweep_notes = public_sweep_rows(beyond_rows, calibration, root, by_method)
    rows += sweep_rows
    rows += prereg_rows(preregistrations, root)
    notes = [f"{r['label'].split(':')[0]}: {n}" for r in rows for n in r["notes"]] + sweep_notes
    return {
        "rows": rows,
        "notes": notes,
        "band_90": list(BAND_90),
        "min_points": MIN_POINTS,
        "markdown": markdown(rows),
    }


def fraction(c: dict[str, int] | None) -> str:
    if c is None:
        return "not recorded"
    return f"{c['k']}/{c['n']} ({c['k'] / c['n']:.0%})" if c["n"] else "0/0"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| intervals | source | n | 50% covered | 90% covered | 90% flag |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['label']} | `{r['source']}` | {r['n']} | {fraction(r['covered_50'])} | {fraction(r['covered_90'])} | "
        f"{r['flag']} |"
        for r in rows
    ]
    return "\n".join(lines)
