"""What the text says about a seal: its gates as sealed beside the gates as the code judges them
today, the runs beyond the ladder against every law, the LR transfer check, and the order of
seal and hero."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from delphi.fits import load_fit
from delphi.fits.probes import probe_trend
from delphi.paper.beyond import count_words, run_vs_law
from delphi.paper.law_alone import is_law_alone_study
from delphi.paper.study_data import LAW_NAMES, pinned_spec, probe_dirs
from delphi.prereg.gates import gate_method_agreement, gate_probes
from delphi.prereg.measure import cross_check_predictions
from delphi.prereg.predict import fit_convention, load_tables, run_predicted_vs_actual
from delphi.train.config import load_train_config
from delphi.train.rundir import read_metrics


def forced_sentence(prereg_doc: dict) -> str:
    """The gates a seal forced, each with the reason sealed beside it (`gates.force`)."""
    forced = prereg_doc.get("forced_gates") or {}
    if not forced:
        return (
            "No gate was forced."
            if not prereg_doc.get("forced")
            else "The seal was forced (`--force`); no reason is recorded."
        )
    return " ".join(f'Gate `{name}` was forced, with its reason sealed: "{reason}"' for name, reason in forced.items())


def beyond_ladder_numbers(
    data_dir: Path,
    primary_fit: str,
    gates: list[dict],
    top_budget: float,
    tolerance_rel: float,
    carry: str | None = None,
) -> dict[str, Any]:
    """The runs beyond the ladder (the study's pinned probes, then the hero) against every law the
    study fitted, each at the run's own N, D and exact FLOPs (`predict_hero`, the code the seal runs),
    and the gate that held the primary law to the probes. With a `carry` (the seal was the primary
    law x its probe trend, carried so) a last column gives that rule at each run from the runs before
    it only."""
    probes = probe_dirs(data_dir)
    configs = {run: load_train_config(run / "config.yaml") for run in probes}
    probes.sort(key=lambda run: configs[run].flops)
    multiples = [configs[run].flops / top_budget for run in probes]
    out: dict[str, Any] = {
        "primary_law": LAW_NAMES.get(primary_fit, primary_fit),
        "n_probes": count_words(len(probes)),
        "probe_multiples": " and ".join(f"{m:.0f}x" for m in multiples) or "none",
    }
    gate = next((g for g in gates if g["name"] == "probes"), None)
    fits = {m: load_fit(path) for m in LAW_NAMES if (path := data_dir / "fits" / f"{m}.json").is_file()}
    spec = pinned_spec(data_dir)
    own = (
        f"The study's own probes at {' and '.join(f'{m:g}x' for m in sorted(spec.hero.probe_multiples))} the top budget "
        "were sealed with the ladder's law alone, with the hero and before any of them trained: predictions like the "
        "hero's, not evidence for a correction."
        if is_law_alone_study(spec)
        else ""
    )
    if gate is None:
        out["probes_sentence"] = own or "No probes beyond the ladder were given."
    else:  # the sealed record, beside the gate as the code stands today (a gate changed after an outcome shows as such)
        hero_cfg = load_train_config(data_dir / "hero.yaml")
        now = gate_probes(
            {p.name: run_predicted_vs_actual(fits[primary_fit], p) for p in probes},
            tolerance_rel,
            top_budget=top_budget,
            hero_compute=hero_cfg.flops,
            corrected=carry is not None,
            carry=carry or "linear",
        )
        out["probes_sentence"] = (
            f"The sealed file records gate probes as {'passed' if gate['passed'] else 'failed'}: {gate['detail']}. "
            f"Gate probes as the code stands today: **{'PASS' if now.passed else 'FAIL'}** ({now.threshold}): "
            f"{now.detail}." + (f" {own}" if own else "")
        )
    runs = probes + ([data_dir / "hero"] if (data_dir / "hero" / "summary.json").is_file() else [])
    rule = [f"{primary_fit} x trend of the runs before"] if carry is not None else []
    rows = [
        "| run | FLOPs | shape | tokens | actual | "
        + " | ".join([f"{m}{' (primary)' if m == primary_fit else ''}" for m in fits] + rule)
        + " |",
        "|---|---|---|---|---|" + "---|" * (len(fits) + len(rule)),
    ]
    before: dict[str, dict] = {}  # the primary law's error at each run so far, for the rule's column
    for run in runs:
        scored = {method: run_vs_law(fit, run) for method, fit in fits.items()}
        cfg, _, actual = next(iter(scored.values()))
        cells = [f"{predicted:.4f} ({actual / predicted - 1:+.2%})" for _, predicted, _ in scored.values()]
        if carry is not None:
            law = scored[primary_fit][1]
            trend = probe_trend(before, top_budget, carry)
            ruled = None if trend is None else law * (1 + trend.at(cfg.flops))
            cells.append("n/a (< 2 runs before)" if ruled is None else f"{ruled:.4f} ({actual / ruled - 1:+.2%})")
            before[run.name] = {"compute": cfg.flops, "rel_error": actual / law - 1}
        rows.append(
            f"| {run.name} | {cfg.flops:.3g} ({cfg.flops / top_budget:.0f}x) | d{cfg.model.d_model} L{cfg.model.n_layers} "
            f"| {float(cfg.tokens):.3g} | {actual:.4f} | " + " | ".join(cells) + " |"
        )
    out["beyond_ladder_table"] = "\n".join(rows) if runs else "(no runs beyond the ladder)"
    return out


def lr_sentence(calibration_path: Path, gates: list[dict]) -> str:
    """How the LR transfer rule was checked: the study's merged `lr-calibrate` report and the verdict
    of gate `lr_transfer` on it, or the plain fact that it was not."""
    if not calibration_path.is_file():
        return "The LR transfer rule's constants were tuned on a handful of proxy runs and not calibrated on the ladder's own family."
    points = json.loads(calibration_path.read_text())["points"]
    widths = sorted({int(p["d_model"]) for p in points})
    runs = sum(len(p["multipliers"]) for p in points)
    gate = next((g for g in gates if g["name"] == "lr_transfer"), None)
    verdict = (
        f" Gate lr_transfer {'passed' if gate['passed'] else 'failed'}: {gate['detail']}."
        if gate
        else " Gate lr_transfer was not evaluated."
    )
    return (
        f"The LR transfer rule was calibrated on the ladder's own family with `delphi ladder lr-calibrate`: {len(points)} points "
        f"(d_model {widths[0]} to {widths[-1]}, up to {max(float(p['tokens']) for p in points):.3g} tokens), {runs} runs, one seed per LR, "
        f"so each optimum is uncertain by about the seed noise.{verdict}"
    )


def cross_check_sentence(
    data_dir: Path, primary_fit: str, prereg_doc: dict, predicted: float, actual: float | None
) -> str:
    """The cross-check laws refitted on the ladder and gate method_agreement as the code stands
    today, beside the sealed record: a gate changed after an outcome is shown as such."""
    fit_path = data_dir / "fits" / f"{primary_fit}.json"
    if not fit_path.is_file() or not (data_dir / "hero.yaml").is_file():
        return "No cross-check laws were fitted."
    fit = load_fit(fit_path)
    fit_table, _ = load_tables(data_dir / "results.csv", fit_convention(fit))
    rehearsal = data_dir / "rehearsal" if (data_dir / "rehearsal" / "summary.json").is_file() else None
    checks = cross_check_predictions(
        fit,
        fit_table,
        load_train_config(data_dir / "hero.yaml"),
        rehearsal,
        probe_dirs(data_dir),
        noise_scope=prereg_doc["prediction"]["final"].get("noise_scope", "pooled"),
    )
    tolerance = float(prereg_doc["decision"]["tolerance_rel"])
    now = gate_method_agreement(predicted, checks, tolerance)
    sealed = next((g for g in prereg_doc.get("gates") or [] if g["name"] == "method_agreement"), None)
    laws = [predicted, *(float(v["loss"]) for v in checks.values() if v.get("loss") is not None)]
    where = (
        "n/a"
        if actual is None
        else "between the laws"
        if min(laws) <= actual <= max(laws)
        else "outside the laws' span"
    )
    record = (
        "the sealed file records no such gate"
        if sealed is None
        else f"the sealed file records it as {'passed' if sealed['passed'] else 'failed'}"
    )
    return (
        f"**The cross-check laws.** Refitted on the same ladder: {now.detail}. The outcome lies {where}. Gate "
        f"method_agreement as the code stands today: **{'PASS' if now.passed else 'FAIL'}** ({now.threshold}); {record}."
    )


def timeline(prereg_doc: dict, hero_dir: Path) -> str:
    """When the prediction was sealed against when the hero logged its first and last step."""
    records = [r for r in read_metrics(hero_dir) if r.get("time") is not None] if hero_dir.is_dir() else []
    if not records:
        return f"Sealed at {prereg_doc.get('created')}."
    stamp = lambda t: datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    started = records[0]["time"] - records[0].get("wall_s", 0.0)
    return (
        f"Sealed at {prereg_doc.get('created')}; the hero started at {stamp(started)} and logged its last step at "
        f"{stamp(records[-1]['time'])}."
    )
