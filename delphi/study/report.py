"""What a study shows: its figures (`stage_figures`) and report.md (`render_report`), every number
read from the stage markers and the files they name. The same pieces make the report of a pipeline
assembled by hand (`delphi.study.pipeline_report`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.editions import seed_runs_of
from delphi.errors import DelphiError
from delphi.fits import curves as cv
from delphi.fits import load_fit
from delphi.fits.calibration import report_lines
from delphi.fits.isoflop import per_budget_optima
from delphi.fits.method_choice import method_choice_lines
from delphi.fits.probes import correction_text
from delphi.io import atomic_write_text, read_yaml
from delphi.ladder.collect import HEALTH_TABLE_COLUMNS, relaxed_in_table
from delphi.model.flops import count_params
from delphi.plot import figures as pf
from delphi.plot.style import save_figure
from delphi.prereg.gates import gate_table, ladder_top_budget
from delphi.prereg.predict import score_probes
from delphi.prereg_format import load_prereg, read
from delphi.study.spec import AUTO_PRIMARY
from delphi.study.state import Study, format_value, load_table, probe_runs, rehearsal_result, say
from delphi.train.config import load_train_config
from delphi.train.runlog import read_run_dir
from delphi.train.verdict import compare


def _hero_point(study: Study) -> dict:
    if not study.hero_config.is_file():
        return {}
    cfg = load_train_config(study.hero_config)
    return {"compute": cfg.flops, "params": count_params(cfg.model).nonembedding, "tokens": cfg.tokens}


def _residual_prediction(fit: Any, table: pd.DataFrame):
    import numpy as np

    terms = {t: table[t].to_numpy(float) for t in fit.law_terms if t in table}
    pred = fit.predict_run(
        params=table["params"].to_numpy(float),
        tokens=table["tokens"].to_numpy(float),
        flops=table["flops"].to_numpy(float),
        **terms,
    )
    return np.asarray(pred["loss"], float)


class FigureSet:
    """Figures drawn into one directory as NAME.png and NAME.svg; a figure whose input is missing or
    unusable is named in `not_drawn` and does not lose the others."""

    def __init__(self, directory: Path, written_by: str | None = None, say: Callable[[str], None] = say) -> None:
        self.directory = directory
        self.written_by = written_by
        self.say = say
        self.files: list[str] = []
        self.failed: list[str] = []

    def draw(self, name: str, make: Callable[[], Any]) -> None:
        try:
            self.files.extend(save_figure(make(), str(self.directory / f"{name}.png"), written_by=self.written_by))
        except (DelphiError, ValueError, KeyError) as e:
            self.failed.append(f"{name} ({e})")

    def result(self) -> dict:
        for problem in self.failed:
            self.say(f"figure not drawn: {problem}")
        return {"files": sorted(p for p in self.files if p.endswith(".png")), "not_drawn": self.failed}


def allocation_of(table: pd.DataFrame, optima: list[dict] | None, fit: Any, hero: dict):
    """N*(C) and D*(C): the isoFLOP optima given, else the table's own per-budget parabolas."""
    optima = optima or per_budget_optima(table)[0]
    frame = pd.DataFrame(
        {
            "budget": [o["flops"] for o in optima],
            "params": [o["params_opt"] for o in optima],
            "tokens": [o["tokens_opt"] for o in optima],
        }
    )
    return pf.allocation_figure(frame, fit, hero.get("compute"), hero.get("params"), hero.get("tokens"))


def frontier_of(table: pd.DataFrame, fit: Any, prereg_doc: dict | None, actual: float | None):
    """The compute frontier with the sealed hero's 90% interval and its actual final loss."""
    hero_c = interval = None
    if prereg_doc is not None:
        final = prereg_doc["prediction"]["final"]
        hero_c = prereg_doc["hero"]["flops"]
        lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
        interval = (final["loss"], lo, hi)
    return pf.frontier_figure(table, fit, hero_c, interval, actual)


def residuals_of(table: pd.DataFrame, fit: Any):
    return pf.residuals_figure(
        table, _residual_prediction(fit, table), title=f"{fit.kind} fit ({fit.method}) residuals"
    )


def stage_figures(study: Study) -> dict:
    """Every figure of the study, drawn by the library functions behind `delphi plot ...`."""
    study.figures.mkdir(parents=True, exist_ok=True)
    figures = FigureSet(study.figures)
    table = load_table(study)
    primary = load_fit(study.fit_path(study.primary_fit))
    fits = {m: load_fit(study.fit_path(m)) for m in study.spec.fits if study.fit_path(m).is_file()}
    optima = fits["isoflop"].extra.optima if "isoflop" in fits else None

    figures.draw("isoflop", lambda: pf.isoflop_figure(table, optima))
    figures.draw("allocation", lambda: allocation_of(table, optima, primary, _hero_point(study)))
    prereg = load_prereg(study.prereg) if study.prereg.is_file() else None
    run = read_run_dir(study.hero_run) if study.hero_run.is_dir() else None
    figures.draw(
        "frontier", lambda: frontier_of(table, primary, prereg.doc if prereg else None, run.final_loss if run else None)
    )
    if prereg is not None:

        def prediction():
            dirs = [d for d in seed_runs_of(prereg.doc, study.hero_run) if d.is_dir()]
            if run is None or len(dirs) < 2:
                return pf.prediction_figure(prereg.doc, run, compare(prereg, run)["verdict"] if run else None)
            # A multi-seed hero: each seed's curve; the verdict on their mean is the check stage's.
            verdict = ((study.done("check") or {}).get("result") or {}).get("verdict")
            return pf.prediction_figure(
                prereg.doc, run, verdict, seed_runs={_seed_of(d): read_run_dir(d) for d in dirs}
            )

        figures.draw("prediction", prediction)

    def ladder_curves():
        curves = cv.load_ladder_curves(study.ladder_dir)
        law = cv.fit_curve_law(curves, bootstrap=0, seed=study.spec.seed, lr_ref=cv.ladder_lr_ref(study.ladder_dir))
        return pf.curves_figure(curves, law, None)

    figures.draw("ladder_curves", ladder_curves)
    for method, f in fits.items():
        if method != "frontier":
            figures.draw(f"residuals_{method}", lambda f=f: residuals_of(table, f))
    return figures.result()


def _seed_of(run_dir: Path) -> int:
    return int(read_yaml(run_dir / "config.yaml")["seed"])


def stage_report(study: Study) -> dict:
    atomic_write_text(study.report, render_report(study))
    return {"report": str(study.report)}


def render_report(study: Study) -> str:
    """report.md: every number comes from the stage markers and the files they name."""
    plan = study.done("plan")["result"]
    fits = study.done("fit")["result"]
    fits = fits.get("fits", fits)  # studies before conventions stored the fits at the top level
    hero = study.done("hero")["result"]
    check = study.done("check")["result"]
    backtest = json.loads((study.fits_dir / "backtest.json").read_text())
    table = pd.read_csv(study.results)
    top = table["budget"].max()
    lines = [
        f"# Study `{study.spec.name}`",
        "",
        f"Ladder: {plan['rungs']} runs, {plan['flops']:.3g} FLOPs in all, budgets "
        f"{', '.join(f'{b:.3g}' for b in sorted(table['budget'].unique()))}. "
        f"Hero: {hero['compute']:.3g} FLOPs ({hero['compute'] / ladder_top_budget(table):.3g}x the top isoFLOP budget, "
        f"{hero['compute'] / top:.3g}x the largest run), "
        f"d_model {hero.get('d_model')}, {hero.get('n_layers')} layers, N = {format_value(hero.get('params'))}, "
        f"D = {format_value(hero.get('tokens'))} tokens.",
        "",
        "## Preregistered prediction against the outcome",
        "",
        *verdict_table(check),
        "",
        f"{check.get('why', '')}",
        "",
    ]
    final = json.loads(study.gates.read_text()).get("prediction", {}) if study.gates.is_file() else {}
    lines += primary_law_lines(study.primary_fit, study.spec.primary_fit, final, check.get("actual_final_loss"))
    lines += gates_section(study)

    lines += report_lines(final, primary_fit=study.spec.primary_fit, primary_law=study.primary_fit)
    lines += primary_choice_section(study)
    lines += _rehearsal_section(study)
    lines += _probes_section(study)
    lines += conventions_section(study)
    lines += ["## Fits", "", "| method | status | allocation | parameters |", "|---|---|---|---|"]
    for method, info in fits.items():
        if "error" in info:
            lines.append(f"| {method} | failed | - | {info['error']} |")
            continue
        params = ", ".join(f"{k} = {format_value(v)}" for k, v in info["params"].items() if isinstance(v, (int, float)))
        lines.append(
            f"| {method} | {format_value(info.get('status'))} | {format_value(info.get('allocation'))} | {params} |"
        )
    lines += [
        "",
        "## Backtests (fit below the top budget, predict it)",
        "",
        "| method | budget | predicted best loss | 90% interval | observed best loss | relative error | 90% covered |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            lines.append(
                f"| {method} | {b['budget']:.3g} | {format_value(b['predicted_loss'])} | {format_value(b.get('loss_interval_90'))} "
                f"| {format_value(b['observed_best_loss'])} | {format_value(b['rel_error'], '+.2%')} | {format_value(b.get('covered_90'))} |"
            )
        if "error" in result:
            lines.append(f"| {method} | - | - | - | - | {result['error']} | - |")
    summary = (study.done("backtest") or {}).get("result", {}).get("summary")
    if summary:
        lines += [
            "",
            "Every budget above the third held out in turn:",
            "",
            "| method | points | mean abs error | 90% coverage |",
            "|---|---|---|---|",
        ]
        for method, s in summary.items():
            lines.append(
                f"| {method} | {s.get('n')} | {format_value(s.get('mean_abs_rel_error'), '.2%')} | {format_value(s.get('coverage_90'), '.0%')} |"
            )
    lines += ["", "## Figures", ""]
    for png in sorted(study.figures.glob("*.png")):
        lines.append(f"![{png.stem}](figures/{png.name})")
    lines += ["", "## Rung health", "", health_table(table), "", "## Ladder", "", markdown_table(table), ""]
    return "\n".join(lines)


def verdict_table(check: dict, unit: str = "nats/byte") -> list[str]:
    """The hero's preregistered final loss against the outcome (the check stage's result): predicted
    and actual to the same 4 decimals, so that 1.5030 and 1.5000 read as the numbers they are."""
    return [
        "| quantity | predicted | actual | relative error | inside 90% interval | verdict |",
        "|---|---|---|---|---|---|",
        f"| hero final val loss ({unit}) | {format_value(check.get('predicted_final_loss'), '.4f')} "
        f"| {format_value(check.get('actual_final_loss'), '.4f')} "
        f"| {format_value(check.get('rel_error'), '+.2%')} | {format_value(check.get('covered_90'))} | {check.get('verdict')} |",
    ]


def primary_law_lines(law: str, setting: str, final: dict | None = None, actual: float | None = None) -> list[str]:
    """Which law made the sealed prediction (the study's primary law, `law`) and why: the study's
    `primary_fit` setting (`setting`), a fixed law or `auto` and the evidence. The method-choice
    table further down is public-sweep evidence and may name another law where the study fixed its own.
    `final` is the sealed prediction: corrected by the probes, or by a design's measured bias
    (hero.point_correction), whose law-alone point it names with, once the hero has trained, its
    error against `actual`."""
    final = final or {}
    made = f"the {law} law" + (
        ', corrected by its error trend at the probes (see "Probes beyond the ladder")'
        if final.get("probe_correction")
        else ""
    )
    if point_correction := final.get("point_correction"):
        law_loss = float(final["uncorrected"]["loss"])
        made += (
            f", x (1 {point_correction['rel']:+.2%}): this design's measured bias (sd {point_correction['sd_rel']:.2%}; "
            f"{point_correction['source']}). The law alone predicted {law_loss:.4f}"
            + (f", an error of {actual / law_loss - 1:+.2%} against the outcome" if actual is not None else "")
        )
    if setting == AUTO_PRIMARY:
        why = (
            f"the study leaves the choice to the evidence (`primary_fit: auto`), and the fit stage chose {law} once, before "
            f'the hero was sized, by the public-sweep method choice (see "Primary law chosen by evidence")'
        )
    else:
        why = (
            f"the study file fixes it (`primary_fit: {setting}`), so it sized the hero and made the prediction; the "
            f"method-choice table further down is public-sweep evidence beside it and may name another law"
        )
    return [f"The sealed prediction was made by the study's primary law, {made}. Why {law}: {why}.", ""]


def gates_section(study: Study) -> list[str]:
    if not study.gates.is_file():
        return []
    return gates_lines(json.loads(study.gates.read_text()), forced_by="the study went on with force: true")


def gates_lines(report: dict, forced_by: str) -> list[str]:
    """The gates section of a report from a gate report (NAME.gates.json): whether every gate passed,
    and the table; `forced_by` says how a seal went on over failed gates."""
    verdict = (
        "all passed"
        if report["passed"]
        else (f"FAILED ({', '.join(report['failed'])})" + (f"; {forced_by}" if report.get("forced") else ""))
    )
    return [
        "## Gates (evaluated before the hero trained)",
        "",
        f"Gates: {verdict}.",
        "",
        gate_table(report["gates"]),
        "",
    ]


def _rehearsal_section(study: Study) -> list[str]:
    r = rehearsal_result(study)
    if r is None:
        return []
    return [
        "## Dress rehearsal",
        "",
        f"At {r['compute']:.3g} FLOPs ({r.get('multiple', float('nan')):g}x the top budget): predicted {r['predicted']:.4f}"
        f" (90% {format_value(r.get('loss_interval_90'))}), actual {r['actual']:.4f}, error {r['rel_error']:+.2%}.",
        "",
    ]


def _probes_section(study: Study) -> list[str]:
    """The probes beyond the ladder against the primary law, and how the seal used them."""
    runs = probe_runs(study)
    if not runs:
        return []

    lines = [
        "## Probes beyond the ladder",
        "",
        f"The {study.primary_fit} law at each probe's own N and D (error = actual / predicted - 1):",
        "",
        "| probe | FLOPs | predicted | actual | error |",
        "|---|---|---|---|---|",
    ]
    for name, r in score_probes(load_fit(study.fit_path(study.primary_fit)), runs).items():
        lines.append(
            f"| {name} | {r['compute']:.3g} | {r['predicted']:.4f} | {r['actual']:.4f} | {r['rel_error']:+.2%} |"
        )
    check = (study.done("check") or {}).get("result", {})
    final = read(study.prereg)["prediction"]["final"] if study.prereg.is_file() else {}
    if final:
        lines += [
            "",
            correction_text(final, check.get("actual_final_loss"), primary_law=f"the {study.primary_fit} law")[
                "correction_sentence"
            ],
        ]
    return lines + [""]


def primary_choice_section(study: Study) -> list[str]:
    """With `primary_fit: auto`: the law the fit stage chose and the table behind it (stages/fit.json)."""
    choice = (study.done("fit") or {}).get("result", {}).get("primary_choice")
    if not choice:
        return []
    return (
        [
            "## Primary law chosen by evidence (primary_fit: auto)",
            "",
            f"The fit stage chose the primary law once, among {', '.join(choice['candidates'])} (the laws that can size "
            f"a hero and that the study fits), on this ladder's sweep features ({choice['features']['n_budgets']} budgets, "
            f"median N 10^{choice['features']['log10_median_params']:.2f}); calibration {choice['calibration']['path']}, "
            f"sha256 {choice['calibration']['sha256'][:12]}.",
            "",
        ]
        + method_choice_lines(choice)
        + [""]
    )


def conventions_section(study: Study) -> list[str]:
    if not study.conventions.is_file():
        return []
    data = json.loads(study.conventions.read_text())
    lines = [
        "## How N is counted",
        "",
        f"Chosen: **{data['chosen']}** ({data['why']}).",
        "",
        f"| convention | isoFLOP exponent a [90%] | {data.get('primary_fit', 'primary')} exponent a | backtest mean abs error | note |",
        "|---|---|---|---|---|",
    ]
    for name, row in data["conventions"].items():
        lines.append(
            f"| {name} | {format_value(row.get('isoflop_a'), '.3f')} {format_value(row.get('isoflop_a_interval_90'), '.3f')} "
            f"| {format_value(row.get('law_a'), '.3f')} | {format_value(row.get('backtest_mean_abs_rel_error'), '.2%')} | {_convention_note(row, data)} |"
        )
    return lines + [""]


def _convention_note(row: dict, data: dict) -> str:
    """A convention's error, or (primary_fit: auto) the law its own table's evidence picked where it is not the header's."""
    if row.get("error"):
        return row["error"]
    law = row.get("primary_fit")
    return f"law: {law} (chosen on this convention's table)" if law and law != data.get("primary_fit") else ""


def health_table(table: pd.DataFrame) -> str:
    """One row per rung: what its health bounds check, and whether it met them (the columns of
    delphi.ladder.collect's rung health view that the table has), after a line naming any bound the
    ladder spec set looser than the defaults."""
    if "health_ok" not in table:
        return "(the results table has no health columns)"
    cols = [c for c in HEALTH_TABLE_COLUMNS if c in table and c != "health_relaxed"]
    relaxed = relaxed_in_table(table)
    rows = (
        [f"The ladder spec's health bounds are looser than the defaults (issue 10): {', '.join(relaxed)}.", ""]
        if relaxed
        else []
    )
    rows += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.sort_values(["budget", "run_id"] if "run_id" in table else ["budget"])[cols].iterrows():
        rows.append(
            "| "
            + " | ".join(str(r[c]) if c in ("run_id", "cell_id") else format_value(r[c], ".3g") for c in cols)
            + " |"
        )
    return "\n".join(rows)


def markdown_table(table: pd.DataFrame) -> str:
    cols = [
        c
        for c in ("run_id", "budget", "d_model", "n_layers", "params", "tokens", "steps", "lr", "loss", "status")
        if c in table
    ]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table[cols].iterrows():
        rows.append("| " + " | ".join(format_value(r[c]) for c in cols) + " |")
    return "\n".join(rows)
