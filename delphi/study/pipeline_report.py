"""`delphi report`: report.md and figures for a pipeline assembled by hand from a results table, a
fit, a seal and a run's log, drawn and written with a study report's pieces (`delphi.study.report`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.errors import DelphiError
from delphi.fits import load_fit, load_results
from delphi.fits.calibration import report_lines
from delphi.hashes import sha256_file
from delphi.io import atomic_write_text, read_json
from delphi.plot import figures as pf
from delphi.prereg.check import check, read_hero_run
from delphi.prereg.create import gates_path
from delphi.prereg_format import load_prereg, seal_status
from delphi.study.report import (
    FigureSet,
    allocation_of,
    frontier_of,
    gates_lines,
    markdown_table,
    residuals_of,
    verdict_table,
)
from delphi.study.state import format_value
from delphi.train.runlog import LogOptions

REPORT_COMMAND = "report"  # what report.md and its figures say wrote them (delphi.io's output policy)
PIPELINE_FIGURES = ("isoflop", "allocation", "frontier", "prediction", "residuals")
MAX_TABLE_ROWS = 200  # a larger results table is summarised, not copied into the report


@dataclass(frozen=True)
class PipelineInputs:
    """The pieces of a pipeline assembled by hand (`delphi report`); each may be absent, and a run
    is judged against the seal, so `runs` needs `prereg` (one run, or one per seed of a multi-seed seal)."""

    results: Path | None = None
    table_options: dict[str, Any] = field(default_factory=dict)  # delphi.fits.data.load_results's keywords
    fit: Path | None = None
    prereg: Path | None = None
    runs: tuple[Path, ...] = ()
    log: LogOptions = LogOptions()


def pipeline_report(inputs: PipelineInputs, out: Path) -> dict:
    """report.md and figures/ in `out` for `inputs`, drawn and written as a study's are: the verdict
    of the run against the seal (checked, nothing recorded beside the seal), the seal's gates, its
    calibrated interval, the fit's summary, the figures and the table."""
    if inputs.runs and inputs.prereg is None:
        raise DelphiError("--run: a run is judged against a preregistration; give --prereg too")
    table = load_results(inputs.results, **inputs.table_options) if inputs.results is not None else None
    fit = load_fit(inputs.fit) if inputs.fit is not None else None
    prereg = load_prereg(inputs.prereg) if inputs.prereg is not None else None
    checked, run, seed_runs = None, None, None
    if prereg is not None and inputs.runs:
        checked, _, run = check(inputs.prereg, run_dirs=list(inputs.runs), record=False, log=inputs.log)
        if checked.get("seeds"):
            seed_runs = {
                s["seed"]: read_hero_run(prereg.doc, Path(s["run"]), None, inputs.log) for s in checked["seeds"]
            }
    (out / "figures").mkdir(parents=True, exist_ok=True)
    figures = FigureSet(
        out / "figures", written_by=REPORT_COMMAND, say=lambda line: print(f"delphi report: {line}", file=sys.stderr)
    )
    hero = prereg.doc["hero"] if prereg is not None else {}
    hero_point = {"compute": hero.get("flops"), "params": hero.get("params"), "tokens": hero.get("tokens")}
    optima = fit.extra.optima if fit is not None else None
    actual = (checked or {}).get("actual_final_loss")
    if table is not None:
        figures.draw("isoflop", lambda: pf.isoflop_figure(table, optima))
        figures.draw("frontier", lambda: frontier_of(table, fit, prereg.doc if prereg else None, actual))
        if fit is not None and fit.kind != "frontier":
            figures.draw("residuals", lambda: residuals_of(table, fit))
    if fit is not None and (optima or table is not None):
        figures.draw("allocation", lambda: allocation_of(table, optima, fit, hero_point))
    if prereg is not None:
        figures.draw(
            "prediction", lambda: pf.prediction_figure(prereg.doc, run, (checked or {}).get("verdict"), seed_runs)
        )
    drawn = figures.result()
    text = render_pipeline_report(
        inputs, table, fit, prereg, checked, [Path(p) for p in drawn["files"]], drawn["not_drawn"]
    )
    atomic_write_text(out / "report.md", text, written_by=REPORT_COMMAND)
    return {
        "report": str(out / "report.md"),
        "figures": drawn["files"],
        "not_drawn": drawn["not_drawn"],
        **({"check": {k: v for k, v in checked.items() if k != "points"}} if checked else {}),
    }


def render_pipeline_report(
    inputs: PipelineInputs,
    table: pd.DataFrame | None,
    fit: Any,
    prereg: Any,
    checked: dict | None,
    figure_files: list[Path],
    not_drawn: list[str] = (),
) -> str:
    """report.md of a pipeline assembled by hand, from what `pipeline_report` read."""
    lines = [
        "# Report",
        "",
        "Assembled by hand (`delphi report`) from:",
        "",
        *_input_lines(inputs, table, fit, prereg, checked),
        "",
    ]
    if prereg is not None:
        doc = prereg.doc
        final = doc["prediction"]["final"]
        lines += [
            "## Preregistered prediction against the outcome",
            "",
            *verdict_table(
                checked or {"predicted_final_loss": final["loss"], "verdict": "no run given"}, _loss_unit(doc)
            ),
            "",
        ]
        if checked is not None:
            lines += [checked.get("why", ""), ""]
            if checked.get("judged"):
                lines += [f"What the seal judges: {checked['judged']}.", ""]
        lines += [_seal_sentence(doc, fit, inputs.fit), ""]
        lines += _seal_gates_lines(inputs.prereg, doc)
        lines += report_lines(final, primary_law=(doc.get("provenance") or {}).get("fit_kind"))
    if fit is not None:
        lines += ["## Fit", "", f"`{inputs.fit}`:", "", "```text", fit.summary(), "```", ""]
    lines += ["## Figures", ""]
    lines += [f"![{png.stem}](figures/{png.name})" for png in figure_files] or ["(none: no input draws one)"]
    lines += ["", *(f"Not drawn: {why}." for why in not_drawn)] if not_drawn else []
    lines.append("")
    if table is not None:
        lines += ["## Results table", ""]
        lines += (
            [markdown_table(table)]
            if len(table) <= MAX_TABLE_ROWS
            else [
                f"{len(table)} rows (more than {MAX_TABLE_ROWS}: not copied here); budgets "
                f"{', '.join(f'{b:.3g}' for b in sorted(table['budget'].unique()))}."
            ]
        )
        lines.append("")
    return "\n".join(lines)


def _input_lines(
    inputs: PipelineInputs, table: pd.DataFrame | None, fit: Any, prereg: Any, checked: dict | None
) -> list[str]:
    lines = []
    if table is not None:
        query = table.attrs.get("query")
        lines.append(
            f"- results table `{inputs.results}` (sha256 {sha256_file(inputs.results)[:12]}): {len(table)} rows"
            + (f" selected by `{query}`" if query else "")
        )
    if fit is not None:
        lines.append(
            f"- fit `{inputs.fit}` (sha256 {sha256_file(inputs.fit)[:12]}): {fit.kind} ({fit.method}), "
            f"{fit.n_points} points, status {fit.status}"
        )
    if prereg is not None:
        seal = seal_status(prereg.doc)
        lines.append(
            f"- preregistration `{inputs.prereg}`: id {prereg.id}, created {prereg.doc['created']}, "
            f"seal {'ok' if seal['ok'] else 'BROKEN'} ({str(seal['recorded'])[:12]})"
        )
    described = [checked.get("log")] + [s.get("log") for s in checked.get("seeds") or []] if checked else []
    for run in inputs.runs:
        log = next((d for d in described if d and Path(d["path"]).resolve().is_relative_to(Path(run).resolve())), None)
        if log is None:
            how = "a Delphi run dir"
        else:
            where = "" if Path(log["path"]) == Path(run) else f" ({log['path']})"
            how = f"a metrics log{where} read as " + ", ".join(f"{k} = {v}" for k, v in log["columns"].items())
        lines.append(f"- run `{run}`: {how}")
    return lines


def _loss_unit(doc: dict) -> str:
    """The unit of the sealed loss: per byte for a byte-level hero, per token for another vocabulary."""
    config = (doc.get("hero") or {}).get("config")
    vocab = ((config or {}).get("model") or {}).get("vocab_size") if isinstance(config, dict) else None
    return "nats/byte" if vocab == 256 else "nats/token"


def _seal_sentence(doc: dict, fit: Any, fit_path: Path | None) -> str:
    """What the seal predicts, from which fit, and whether the fit given is that fit."""
    final, hero, prov = doc["prediction"]["final"], doc["hero"], doc.get("provenance") or {}
    lo, hi = final.get("loss_90") or (final["loss"], final["loss"])
    text = (
        f"The seal `{doc['id']}` (tolerance {float(doc['decision']['tolerance_rel']):.2%}) predicts the hero's final loss "
        f"{final['loss']:.4f}, 90% [{lo:.4f}, {hi:.4f}], at N = {format_value(hero.get('params'))}, D = {format_value(hero.get('tokens'))} "
        f"tokens, C = {format_value(hero.get('flops'), '.3g')} FLOPs, made by the {prov.get('fit_kind', '?')} fit "
        f"`{prov.get('fit_path', '?')}` (sha256 {str(prov.get('fit_sha256'))[:12]})."
    )
    if doc.get("forced"):
        text += " It was sealed with --force over failed gates."
    if fit is not None and fit_path is not None:
        same = sha256_file(fit_path) == prov.get("fit_sha256")
        text += (
            " The fit given here is that fit."
            if same
            else f" The fit given here (`{fit_path}`) is not the one the seal names: its sha256 differs."
        )
    return text


def _seal_gates_lines(prereg_path: Path, doc: dict) -> list[str]:
    """The seal's gates: its gate report beside it (NAME.gates.json) where there is one, else the
    gates sealed in the file."""
    beside = gates_path(prereg_path)
    if beside.is_file():
        report = read_json(beside, what="gate report")
    elif doc.get("gates"):
        gates = doc["gates"]
        report = {
            "passed": all(g.get("passed") for g in gates),
            "gates": gates,
            "forced": bool(doc.get("forced")),
            "failed": [g.get("name") for g in gates if not g.get("passed")],
        }
    else:
        return []
    return gates_lines(report, forced_by="sealed with --force, recorded in the seal")
