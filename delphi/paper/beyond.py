"""The runs beyond the ladder under the law alone: each sealed run against its own seal, and an
earlier recipe's law alone beside it at the same multiples of each ladder's top budget.

Under `hero.probe_correction: false` a study seals every prediction beyond the ladder -- its own
probes into STUDY/probes/NAME.prereg.yaml and the hero into its preregistration -- before any of
them trains (`delphi.study.sealing.stage_seals`). Each is scored against its OWN seal with
`delphi.prereg.check.check` (read only: nothing is written beside a committed seal), with the order
of seal and first step the check establishes; the old recipe's side is `run_vs_law`
(`predict_hero`, the code a seal runs, at each run's own N, D and FLOPs). `delphi.paper.numbers`
puts the tables into the paper's text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from delphi.editions import seed_runs_of
from delphi.errors import CheckFailed, DelphiError
from delphi.prereg.check import check, read_outcome
from delphi.prereg.create import parse_utc
from delphi.prereg.predict import predict_hero
from delphi.prereg_format import read, seal_status
from delphi.train.config import load_train_config, train_config_from_dict
from delphi.train.runlog import read_run_dir
from delphi.train.verdict import FINAL_VERDICTS

# The edition whose study holds the old recipe's runs beyond its ladder (its gates.probes and its
# hero), set beside a study of the law alone at the same multiples of the top budget.
OLD_RECIPE_EDITION = "v7"

# Two runs stand at the same multiple of their ladders' top budgets when their multiples differ by
# less than this factor: a run's exact FLOPs match its target within a fraction of a percent, and
# the multiples compared (3x, 10x, 30x) lie a factor >= 3 apart.
SAME_MULTIPLE_FACTOR = 1.25

NOT_SEALED = "not sealed"
NOT_TRAINED = "sealed, not yet trained"
NOT_AVAILABLE = "n/a"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


# ---- the law alone at finished runs (the old recipe's side) --------------------------------------


def run_vs_law(fit: Any, run_dir: Path) -> tuple[Any, float, float]:
    """A finished run's train config, the law's prediction at its own N, D and exact FLOPs
    (`predict_hero`, the code a seal runs) and the run's final validation loss."""
    cfg = load_train_config(run_dir / "config.yaml")
    predicted = float(predict_hero(fit, cfg)[0]["loss"])
    actual = float(json.loads((run_dir / "summary.json").read_text())["val_loss"])
    return cfg, predicted, actual


def shape_of(cfg: Any) -> str:
    return f"d{cfg.model.d_model} L{cfg.model.n_layers}"


def law_alone_rows(fit: Any, run_dirs: Sequence[Path], top_budget: float) -> list[dict[str, Any]]:
    """Each finished run against the law alone, smallest compute first: run, FLOPs, multiple of the
    top budget, shape, predicted, actual, relative error (actual / predicted - 1)."""
    rows = []
    for run in run_dirs:
        cfg, predicted, actual = run_vs_law(fit, run)
        rows.append(
            {
                "run": run.name,
                "flops": float(cfg.flops),
                "multiple": float(cfg.flops) / top_budget,
                "shape": shape_of(cfg),
                "predicted": predicted,
                "actual": actual,
                "rel_error": actual / predicted - 1,
            }
        )
    return sorted(rows, key=lambda r: r["flops"])


# ---- each sealed run against its own seal (the new recipe's side) --------------------------------


def _utc(epoch_s: float | None) -> str:
    return NOT_AVAILABLE if epoch_s is None else datetime.fromtimestamp(epoch_s, tz=UTC).strftime(TIME_FORMAT)


def sealed_run(name: str, seal: Path, run_dir: Path, top_budget: float) -> dict[str, Any]:
    """One run beyond the ladder against its own seal: what the seal predicted (final loss, 50% and
    90% intervals, the competing laws sealed beside it, whether it is the law alone, when it was
    made) and, once the run has a step, the check's verdict, final loss (a multi-seed seal: the mean
    of its seeds, each seed's beside it), error, coverage, every competing law's score and the order
    of seal and first step. A run with no step yet is NOT_TRAINED; a broken seal or a run that is
    not the sealed one is reported, not scored."""
    row: dict[str, Any] = {
        "run": name,
        "seal": str(seal),
        "status": NOT_SEALED,
        "actual": None,
        "rel_error": None,
        "covered_50": None,
        "covered_90": None,
        "first_step_time": None,
        "created_before_start": None,
        "verdict": None,
        "seeds": [],
        "scores": {},
    }
    if not seal.is_file():
        return row
    doc = read(seal)
    final = doc["prediction"]["final"]
    cfg = train_config_from_dict(doc["hero"]["config"], f"{seal}: hero.config")
    row |= {
        "flops": float(doc["hero"]["flops"]),
        "multiple": float(doc["hero"]["flops"]) / top_budget,
        "shape": shape_of(cfg),
        "predicted": float(final["loss"]),
        "loss_50": final.get("loss_50"),
        "loss_90": final.get("loss_90"),
        "competing": (doc["prediction"].get("competing") or {}),
        "law_alone": not final.get("probe_correction"),
        "created": doc["created"],
        "created_time": parse_utc(doc["created"]),
        "forced": bool(doc.get("forced")),
        "forced_gates": sorted(doc.get("forced_gates") or {}),
        "seal_ok": seal_status(doc)["ok"],
        "tolerance_rel": float(doc["decision"]["tolerance_rel"]),
        "recorded_verdict": (read_outcome(seal) or {}).get("verdict"),
        "status": NOT_TRAINED,
    }
    runs = seed_runs_of(doc, run_dir)
    if not any(run.is_dir() for run in runs):
        return row
    try:
        result, _, run = check(seal, run_dirs=runs, record=False)
    except (CheckFailed, DelphiError) as refused:  # a seal edited after sealing; a run that is not the sealed one
        return row | {"status": "not checked", "verdict": "not checked", "why": str(refused)}
    starts = (
        [t for r in runs if (t := read_run_dir(r).first_step_time) is not None]
        if len(runs) > 1
        else [run.first_step_time]
    )
    row |= {
        "first_step_time": min(starts, default=None),
        "created_before_start": result.get("created_before_start"),
        "verdict": result["verdict"],
        "why": result.get("why"),
        "seeds": [(int(s["seed"]), s.get("actual_final_loss")) for s in result.get("seeds", [])],
    }
    if result["verdict"] == "not-started":
        return row
    row["status"] = result.get("status", run.status)
    if result["verdict"] in FINAL_VERDICTS and result.get("actual_final_loss") is not None:
        row |= {
            "actual": float(result["actual_final_loss"]),
            "rel_error": float(result["rel_error"]),
            "covered_50": result.get("covered_50"),
            "covered_90": result.get("covered_90"),
            "scores": result.get("competing") or {},
        }
    return row


def sealed_runs(seals: Sequence[tuple[str, Path, Path]], top_budget: float) -> list[dict[str, Any]]:
    """`sealed_run` for each (name, seal file, run dir), in the order given (probes nearest first, then the hero)."""
    return [sealed_run(name, seal, run_dir, top_budget) for name, seal, run_dir in seals]


def _pct(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:+.2%}"


def _loss(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:.4f}"


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: NOT_AVAILABLE}[value]


def _seal_interval(pair: Any) -> str:
    return NOT_AVAILABLE if not pair or pair[0] is None else f"[{float(pair[0]):.4f}, {float(pair[1]):.4f}]"


def _verdict_cell(row: dict[str, Any]) -> str:
    if row["status"] in (NOT_SEALED, NOT_TRAINED):
        return row["status"]
    verdict = str(row.get("verdict"))
    if verdict in ("on-track", "deviating"):
        return f"training ({verdict})"
    cell = (
        f"**{verdict}** (tolerance {row['tolerance_rel']:.0%})" if verdict in ("passed", "failed") else f"**{verdict}**"
    )
    if row.get("recorded_verdict") not in (None, row.get("verdict")):
        cell += f"; its outcome file records {row['recorded_verdict']}"
    return cell


def _forced_words(row: dict[str, Any]) -> str:
    if not row["forced"]:
        return ""
    return f" (gate {', '.join(row['forced_gates'])} forced)" if row.get("forced_gates") else " (forced)"


def _forced_clause(forced: Sequence[dict[str, Any]]) -> str:
    """Which seals were forced, grouped by the gates each forced (`gates.force`; plain --force names none)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in forced:
        groups.setdefault(tuple(r.get("forced_gates") or ()), []).append(r["run"])
    return "; ".join(
        f"{', '.join(runs)}: gate {', '.join(gates)} forced" if gates else f"{', '.join(runs)} with --force"
        for gates, runs in groups.items()
    )


def _actual(row: dict[str, Any]) -> str:
    """The final loss: a multi-seed seal's mean with each seed's beside it."""
    if row["actual"] is None or len(row.get("seeds") or []) < 2:
        return _loss(row["actual"])
    return f"{row['actual']:.4f} (seeds {', '.join(f'{s}: {_loss(v)}' for s, v in row['seeds'])})"


def sealed_runs_table(rows: Sequence[dict[str, Any]]) -> str:
    """One row per sealed run: the sealed prediction (law alone) and 90% interval, the final loss,
    error and coverage, the verdict, and when the seal was made against the run's first step."""
    out = [
        "| run | FLOPs | shape | sealed prediction | 90% interval | actual | error | 90% interval covered | verdict "
        "| sealed at | first step | sealed before its first step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] == NOT_SEALED:
            out.append(f"| {r['run']} | {NOT_AVAILABLE} | {NOT_AVAILABLE} | {NOT_SEALED} |" + f" {NOT_AVAILABLE} |" * 8)
            continue
        seal = _utc(r["created_time"]) + ("" if r["seal_ok"] else " (**seal broken**)") + _forced_words(r)
        started = r["status"] not in (NOT_TRAINED,)
        out.append(
            f"| {r['run']} | {r['flops']:.3g} ({r['multiple']:.0f}x) | {r['shape']} | {_sealed_loss(r)} "
            f"| {_seal_interval(r['loss_90'])} | {_actual(r)} | {_pct(r['rel_error'])} | {_yes_no(r['covered_90'])} "
            f"| {_verdict_cell(r)} | {seal} | {_utc(r['first_step_time'])} "
            f"| {_yes_no(r['created_before_start']) if started else 'yes (no step yet)'} |"
        )
    return "\n".join(out)


def seal_order_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """Whether every seal came before the first step of any run beyond the ladder (a study of the law
    alone seals them all before any trains), from the seals' `created` and the runs' first steps."""
    sealed = [r for r in rows if r["status"] != NOT_SEALED]
    if not sealed:
        return "No run beyond the ladder is sealed."
    missing = [r["run"] for r in rows if r["status"] == NOT_SEALED]
    law = (
        "each the ladder's law alone"
        if all(r["law_alone"] for r in sealed)
        else f"not all the law alone ({', '.join(r['run'] for r in sealed if not r['law_alone'])} corrected)"
    )
    forced = [r["run"] for r in sealed if r["forced"]]
    broken = [r["run"] for r in sealed if not r["seal_ok"]]
    first_seal, last_seal = (min(sealed, key=lambda r: r["created_time"]), max(sealed, key=lambda r: r["created_time"]))
    text = (
        f"{count_words(len(sealed)).capitalize()} prediction{'s were' if len(sealed) > 1 else ' was'} sealed, {law}, "
        f"from {_utc(first_seal['created_time'])} to {_utc(last_seal['created_time'])}"
        + (f" ({_forced_clause([r for r in sealed if r['forced']])})" if forced else "")
        + "."
    )
    if missing:
        text += f" Not sealed: {', '.join(missing)}."
    if broken:
        text += f" **The seal of {', '.join(broken)} does not match its content** (edited after sealing)."
    started = [r for r in sealed if r["first_step_time"] is not None]
    if not started:
        return text + " None of them has taken a step."
    first = min(started, key=lambda r: r["first_step_time"])
    before_all = first["first_step_time"] >= last_seal["created_time"]
    text += f" The first step of any of them ({first['run']}) was logged at {_utc(first['first_step_time'])}, " + (
        "after every seal." if before_all else f"**before the seal of {last_seal['run']}**."
    )
    unproven = [
        r["run"]
        for r in sealed
        if r["status"] not in (NOT_TRAINED, "not checked") and r["created_before_start"] is not True
    ]
    if unproven:
        text += f" The check cannot show that {', '.join(unproven)} started after its own seal."
    untrained = [r["run"] for r in sealed if r["status"] == NOT_TRAINED]
    if untrained:
        text += f" Not yet trained: {', '.join(untrained)}."
    return text


def runs_summary(rows: Sequence[dict[str, Any]]) -> str:
    """One clause per sealed run for an abstract: multiple, sealed point, outcome and verdict."""
    parts = []
    for r in rows:
        if r["status"] == NOT_SEALED:
            continue
        head = f"at {r['multiple']:.0f}x the law alone sealed {r['predicted']:.4f}"
        n = len(r.get("seeds") or [])
        if r["actual"] is None:
            parts.append(f"{head} ({'not yet trained' if r['status'] == NOT_TRAINED else 'still training'})")
            continue
        cover = "inside" if r["covered_90"] else "outside"
        parts.append(
            f"{head} and the {'mean of ' + count_words(n) + ' seeds' if n > 1 else 'run'} reached {r['actual']:.4f} "
            f"({r['rel_error']:+.2%}, **{r['verdict']}**, {cover} its 90% interval)"
        )
    return "; ".join(parts) + "." if parts else "No run beyond the ladder was sealed."


# ---- every law sealed beside the primary ----------------------------------------------------------


def law_scores(row: dict[str, Any], primary: str) -> dict[str, dict[str, Any]]:
    """Every law sealed for one run, the primary first, then `prediction.competing` in sealed
    order: {law: sealed point and intervals, and once the run is scored its error against the mean
    of the seeds, each seed's error, and whether its 50% and 90% (and calibrated 90%) intervals
    covered}. A competing law that could not predict the run keeps its reason."""
    sealed = {
        f"{primary} (primary)": {"loss": row["predicted"], "loss_50": row.get("loss_50"), "loss_90": row.get("loss_90")}
    }
    sealed |= row.get("competing") or {}
    scores = {
        f"{primary} (primary)": {
            "rel_error": row["rel_error"],
            "covered_50": row["covered_50"],
            "covered_90": row["covered_90"],
        }
    } | (row.get("scores") or {})
    out = {}
    for law, entry in sealed.items():
        if "loss" not in entry:
            out[law] = {"error": entry.get("error", "no prediction")}
            continue
        one = {"predicted": float(entry["loss"]), "loss_50": entry.get("loss_50"), "loss_90": entry.get("loss_90")}
        if row["actual"] is not None:
            one |= {k: (scores.get(law) or {}).get(k) for k in ("covered_50", "covered_90", "calibrated_covered_90")}
            one["rel_error"] = row["actual"] / one["predicted"] - 1
            one["seed_errors"] = [
                (seed, None if v is None else v / one["predicted"] - 1) for seed, v in row.get("seeds") or []
            ]
        out[law] = one
    return out


def _covered_count(cells: Sequence[bool | None]) -> str:
    known = [c for c in cells if c is not None]
    return f"{sum(known)} of {len(known)}" if known else NOT_AVAILABLE


def laws_ranking(rows: Sequence[dict[str, Any]], primary: str) -> list[dict[str, Any]]:
    """One entry per sealed law: its error at each run (None: not scored), mean |error| over the
    scored runs and its coverage counts; ordered by mean |error|, laws not yet scored last."""
    laws: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["status"] == NOT_SEALED:
            continue
        for law, score in law_scores(row, primary).items():
            entry = laws.setdefault(law, {"law": law, "runs": {}, "covered_50": [], "covered_90": []})
            entry["runs"][row["run"]] = score
            if score.get("rel_error") is not None:
                entry["covered_50"].append(score.get("covered_50"))
                entry["covered_90"].append(score.get("covered_90"))
    for entry in laws.values():
        errors = [abs(s["rel_error"]) for s in entry["runs"].values() if s.get("rel_error") is not None]
        entry["mean_abs_error"] = sum(errors) / len(errors) if errors else None
        entry["n_scored"] = len(errors)
    return sorted(laws.values(), key=lambda e: (e["mean_abs_error"] is None, e["mean_abs_error"] or 0.0))


def laws_ranking_table(rows: Sequence[dict[str, Any]], primary: str) -> str:
    """Which law held: each sealed law's prediction and error at each run, its mean |error| and
    how often its intervals covered the seed mean."""
    runs = [r for r in rows if r["status"] != NOT_SEALED]
    head = " | ".join(f"{r['run']} ({r['multiple']:.0f}x)" for r in runs)
    out = [f"| law | {head} | mean abs error | 50% covered | 90% covered |", "|---|" + "---|" * (len(runs) + 3)]
    for entry in laws_ranking(rows, primary):
        cells = []
        for r in runs:
            score = entry["runs"].get(r["run"], {})
            if "predicted" not in score:
                cells.append(NOT_AVAILABLE)
            elif score.get("rel_error") is None:
                cells.append(f"{score['predicted']:.4f} (not yet scored)")
            else:
                cells.append(f"{score['predicted']:.4f} ({score['rel_error']:+.2%})")
        mean = (
            NOT_AVAILABLE
            if entry["mean_abs_error"] is None
            else f"{entry['mean_abs_error']:.2%} over {count_words(entry['n_scored'])}"
        )
        out.append(
            f"| {entry['law']} | " + " | ".join(cells) + f" | {mean} | {_covered_count(entry['covered_50'])} "
            f"| {_covered_count(entry['covered_90'])} |"
        )
    return "\n".join(out)


def laws_run_table(row: dict[str, Any], primary: str) -> str:
    """One run's sealed laws against the mean of its seeds and against each seed."""
    seeds = [seed for seed, _ in row.get("seeds") or []] if row["actual"] is not None else []
    out = [
        "| law | sealed | 50% interval | 90% interval | error (mean) | "
        + "".join(f"error (seed {s}) | " for s in seeds)
        + "50% covered | 90% covered | calibrated 90% covered |",
        "|---|" + "---|" * (7 + len(seeds)),
    ]
    for law, score in law_scores(row, primary).items():
        if "predicted" not in score:
            out.append(f"| {law} | {score['error']} |" + f" {NOT_AVAILABLE} |" * (6 + len(seeds)))
            continue
        seed_cells = "".join(f"{_pct(e)} | " for _, e in score.get("seed_errors") or [])
        out.append(
            f"| {law} | {score['predicted']:.4f} | {_seal_interval(score['loss_50'])} | {_seal_interval(score['loss_90'])} "
            f"| {_pct(score.get('rel_error'))} | {seed_cells}{_yes_no(score.get('covered_50'))} "
            f"| {_yes_no(score.get('covered_90'))} | {_yes_no(score.get('calibrated_covered_90'))} |"
        )
    return "\n".join(out)


def laws_section(rows: Sequence[dict[str, Any]], primary: str) -> str:
    """The paper's text on every law sealed beside the primary: the ranking, then each run's table."""
    sealed = [r for r in rows if r["status"] != NOT_SEALED and r.get("competing")]
    if not sealed:
        return ""
    ranking = laws_ranking(rows, primary)
    scored = [e for e in ranking if e["mean_abs_error"] is not None]
    n = max(e["n_scored"] for e in scored) if scored else 0
    held = (
        f"Closest over the {count_words(n)} scored run{'s' if n > 1 else ''}: **{scored[0]['law']}**, mean |error| "
        f"{scored[0]['mean_abs_error']:.2%}; farthest: {scored[-1]['law']}, {scored[-1]['mean_abs_error']:.2%}."
        if scored
        else "No run is scored yet."
    )
    text = (
        "\n\n### Every law sealed beside the primary\n\n"
        "Each law's prediction was sealed with the primary's, before its run trained; only the primary decides the "
        f"verdict. Error = mean of the seeds / sealed - 1. {held}\n\n{laws_ranking_table(rows, primary)}"
    )
    for row in sealed:
        seeds = ", ".join(f"seed {s} {_loss(v)}" for s, v in row.get("seeds") or [])
        outcome = (
            f"mean {row['actual']:.4f} ({seeds})"
            if row["actual"] is not None
            else f"{'not yet trained' if row['status'] == NOT_TRAINED else 'training'}"
        )
        text += (
            f"\n\n#### {row['run']}: {row['flops']:.3g} FLOPs ({row['multiple']:.0f}x), {row['shape']}, {outcome}\n\n"
            f"{laws_run_table(row, primary)}"
        )
    return text


# ---- the old recipe against the new one ----------------------------------------------------------


def _same_multiple(a: float, b: float) -> bool:
    return abs(math.log(a / b)) < math.log(SAME_MULTIPLE_FACTOR)


def recipe_comparison(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per multiple of the top budget: the old recipe's run there (`law_alone_rows`) beside
    the new recipe's sealed run at the same multiple (`sealed_runs`), either side None where it
    has none; ordered by multiple."""
    new_left = [r for r in new if r["status"] != NOT_SEALED]
    rows = []
    for o in old:
        match = next((n for n in new_left if _same_multiple(n["multiple"], o["multiple"])), None)
        if match is not None:
            new_left.remove(match)
        rows.append({"multiple": o["multiple"], "old": o, "new": match})
    rows += [{"multiple": n["multiple"], "old": None, "new": n} for n in new_left]
    return sorted(rows, key=lambda r: r["multiple"])


def _sealed_loss(row: dict[str, Any]) -> str:
    return f"{row['predicted']:.4f}" + ("" if row["law_alone"] else " (corrected, not the law alone)")


def recipe_comparison_table(rows: Sequence[dict[str, Any]]) -> str:
    out = [
        "| beyond the top budget | old recipe: run | law alone | actual | error | new recipe: run | law alone (sealed) "
        "| actual | error | 90% interval covered |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, n = r["old"], r["new"]
        old_cells = (
            f"{o['run']} | {o['predicted']:.4f} | {o['actual']:.4f} | {o['rel_error']:+.2%}"
            if o
            else f"no run | {NOT_AVAILABLE} | {NOT_AVAILABLE} | {NOT_AVAILABLE}"
        )
        if n is None:
            new_cells = f"no run | {NOT_AVAILABLE} | {NOT_AVAILABLE} | {NOT_AVAILABLE} | {NOT_AVAILABLE}"
        elif n["actual"] is None:
            state = "not yet trained" if n["status"] == NOT_TRAINED else f"not scored ({n.get('verdict')})"
            new_cells = f"{n['run']} | {_sealed_loss(n)} | {state} | {NOT_AVAILABLE} | {NOT_AVAILABLE}"
        else:
            new_cells = (
                f"{n['run']} | {_sealed_loss(n)} | {n['actual']:.4f} | {n['rel_error']:+.2%} "
                f"| {_yes_no(n['covered_90'])}"
            )
        out.append(f"| {r['multiple']:.0f}x | {old_cells} | {new_cells} |")
    return "\n".join(out)


def recipe_comparison_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """Each recipe's law-alone errors in order of distance, and their mean |error| where every run is scored."""

    def errors(side: str) -> str:
        scored = [
            (r["multiple"], r[side]["rel_error"]) for r in rows if r[side] and r[side].get("rel_error") is not None
        ]
        if not scored:
            return "none scored yet"
        listed = ", ".join(f"{e:+.2%} at {m:.0f}x" for m, e in scored)
        mean = sum(abs(e) for _, e in scored) / len(scored)
        return f"{listed} (mean |error| {mean:.2%} over {count_words(len(scored))})"

    pending = [r["new"]["run"] for r in rows if r["new"] and r["new"]["actual"] is None]
    scored_new = any(r["new"] and r["new"]["actual"] is not None for r in rows)
    new_side = (
        f"the new recipe's sealed predictions by {errors('new')}"
        if scored_new
        else "none of the new recipe's sealed predictions is scored yet"
    )
    return f"The old recipe's law alone missed by {errors('old')}; {new_side}." + (
        f" Not yet scored: {', '.join(pending)}." if pending else ""
    )


def law_alone_section(
    sealed: Sequence[dict[str, Any]], old: Sequence[dict[str, Any]] | None, old_source: str | None
) -> str:
    """The paper's text for a study of the law alone: each sealed run against its own seal, then
    (when the old recipe's data are present) the old recipe's law alone against the new one's."""
    text = (
        "\n\n### Each prediction against its own seal\n\n"
        "Each run beyond the ladder is checked against its own sealed file (`delphi prereg check`: error = actual / "
        f"sealed - 1). {seal_order_sentence(sealed)}\n\n{sealed_runs_table(sealed)}"
    )
    if old:
        comparison = recipe_comparison(old, sealed)
        text += (
            "\n\n### The old recipe's law alone against the new recipe's\n\n"
            f"The old recipe's runs at the same multiples of its top budget (`{old_source}`), against its own ladder's "
            f"primary law alone at each run's N, D and exact FLOPs. {recipe_comparison_sentence(comparison)}\n\n"
            f"{recipe_comparison_table(comparison)}"
        )
    return text


def count_words(k: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}.get(k, str(k))
