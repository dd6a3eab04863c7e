"""`delphi study`: the whole loop from one study file, resumably.

    prepare -> plan -> ladder -> collect -> fit -> backtest -> hero -> prereg
            -> train_hero (checked live) -> check -> figures -> report

Each stage writes `stages/<name>.json` when it completes; re-running the study
skips completed stages, and the two training stages resume their runs (the
ladder runner skips finished rungs, the trainer continues from its last
checkpoint). The preregistration stage always completes before the hero's
first step, so the sealed prediction provably precedes the outcome.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from delphi.config_schema import from_dict, to_dict
from delphi.errors import DelphiError
from delphi.io import atomic_write_json, atomic_write_text, atomic_write_yaml, read_yaml

DEFAULT_STUDY = "default_study.yaml"  # package data in delphi/defaults/
FIT_METHODS = ("isoflop", "parametric", "vpnls", "frontier", "envelope", "moe")


@dataclass(frozen=True)
class HeroSpec:
    compute: float | None = None  # FLOPs; None: compute_multiple x the largest ladder budget
    compute_multiple: float = 10.0
    tolerance: float = 0.01  # relative error of the final loss that counts as a pass
    eval_every: int | None = None  # None: about 10 eval points along the curve


@dataclass(frozen=True)
class StudySpec:
    name: str = "study"
    ladder: str = "ladder_default.yaml"  # ladder spec, relative to the study file
    fits: tuple[str, ...] = ("isoflop", "parametric", "vpnls", "frontier")
    primary_fit: str = "vpnls"  # the law that sizes the hero and makes the prediction
    bootstrap: int = 200
    seed: int = 0
    workers: int | None = None  # ladder processes; None: one per core
    hero: HeroSpec = field(default_factory=HeroSpec)
    author: str | None = None
    rationale: str = ""
    # Where the sealed preregistration goes, relative to the study file (None: inside --out).
    # The project's own study writes into preregistrations/ so that git history dates it.
    preregistration: str | None = None

    def validate(self, where: str) -> "StudySpec":
        for method in self.fits:
            if method not in FIT_METHODS:
                raise DelphiError(f"{where}: fits: unknown method {method!r} (expected one of {', '.join(FIT_METHODS)})")
        if self.primary_fit not in self.fits:
            raise DelphiError(f"{where}: primary_fit: {self.primary_fit!r} is not among fits {list(self.fits)}")
        if self.primary_fit not in ("isoflop", "parametric", "vpnls"):
            raise DelphiError(f"{where}: primary_fit: {self.primary_fit!r} must predict N*(C): isoflop, parametric or vpnls")
        if self.bootstrap < 0:
            raise DelphiError(f"{where}: bootstrap: must be >= 0, got {self.bootstrap}")
        if self.workers is not None and self.workers < 1:
            raise DelphiError(f"{where}: workers: must be >= 1, got {self.workers}")
        hero = self.hero
        if hero.compute is not None and not hero.compute > 0:
            raise DelphiError(f"{where}: hero.compute: must be positive FLOPs, got {hero.compute}")
        if not hero.compute_multiple > 1:
            raise DelphiError(f"{where}: hero.compute_multiple: must be > 1, got {hero.compute_multiple}")
        if not 0 < hero.tolerance < 1:
            raise DelphiError(f"{where}: hero.tolerance: must be in (0, 1), got {hero.tolerance}")
        return self


def load_study(path: str | Path | None) -> tuple[StudySpec, Path, Path | None]:
    """The study spec, its ladder spec path and its preregistration path (None: inside the study dir).

    With `path` None this is the built-in default study."""
    if path is None:
        base = Path(str(resources.files("delphi") / "defaults"))
        path = base / DEFAULT_STUDY
    path = Path(path)
    spec = from_dict(StudySpec, read_yaml(path), str(path)).validate(str(path))
    ladder = (path.parent / spec.ladder).resolve()
    if not ladder.is_file():
        raise DelphiError(f"{path}: ladder: {ladder} not found")
    prereg = (path.parent / spec.preregistration).resolve() if spec.preregistration else None
    return spec, ladder, prereg


# ---- stage bookkeeping ---------------------------------------------------------------------------


class Study:
    """Paths of a study directory and its stage markers."""

    def __init__(self, out: str | Path, spec: StudySpec, ladder_spec_path: Path, prereg: Path | None = None) -> None:
        self.out = Path(out)
        self.spec = spec
        self.ladder_spec_path = ladder_spec_path
        self.ladder_dir = self.out / "ladder"
        self.results = self.out / "results.csv"
        self.fits_dir = self.out / "fits"
        self.hero_config = self.out / "hero.yaml"
        self.prereg = prereg or self.out / "preregistration.yaml"
        self.hero_run = self.out / "hero"
        self.figures = self.out / "figures"
        self.report = self.out / "report.md"

    def fit_path(self, method: str) -> Path:
        return self.fits_dir / f"{method}.json"

    def marker(self, stage: str) -> Path:
        return self.out / "stages" / f"{stage}.json"

    def done(self, stage: str) -> dict | None:
        path = self.marker(stage)
        return json.loads(path.read_text()) if path.is_file() else None


def _say(text: str) -> None:
    print(f"[study] {text}", file=sys.stderr, flush=True)


def _pin_study(study: Study) -> None:
    """Record the resolved study and ladder spec; refuse to continue a different study in the same dir."""
    from delphi.ladder.spec import ladder_spec_to_dict, load_ladder_spec

    pinned = {"study": to_dict(study.spec), "ladder": ladder_spec_to_dict(load_ladder_spec(study.ladder_spec_path))}
    path = study.out / "study.json"
    if path.is_file():
        if json.loads(path.read_text()) != json.loads(json.dumps(pinned)):
            raise DelphiError(f"--out: {study.out} holds a different study (study.json differs); choose a new directory")
        return
    atomic_write_json(path, pinned)


# ---- stages --------------------------------------------------------------------------------------


def stage_prepare(study: Study) -> dict:
    from delphi.data.store import resolve_store
    from delphi.ladder.spec import load_ladder_spec

    ladder = load_ladder_spec(study.ladder_spec_path)
    store = resolve_store(ladder.run.store)
    meta = json.loads((store / "meta.json").read_text())
    return {"store": str(store), "sha256": meta.get("sha256"), "train_tokens": meta.get("n_train")}


def stage_plan(study: Study) -> dict:
    from delphi.ladder.plan import format_table, plan_ladder, write_ladder
    from delphi.ladder.spec import load_ladder_spec

    ladder = load_ladder_spec(study.ladder_spec_path)
    rows = write_ladder(ladder, plan_ladder(ladder), study.ladder_dir)
    print(format_table(rows), file=sys.stderr)
    return {"rungs": len(rows), "flops": sum(float(r["flops"]) for r in rows)}


def stage_ladder(study: Study) -> dict:
    from delphi.ladder.runner import run_ladder

    summary = run_ladder(study.ladder_dir, workers=study.spec.workers)
    if summary.get("failed"):
        raise DelphiError(f"ladder: rungs failed: {summary['failed']}; see {study.ladder_dir}/logs and rerun the study")
    return summary


def stage_collect(study: Study) -> dict:
    from delphi.ladder.collect import collect_ladder, write_results

    table = collect_ladder(study.ladder_dir)
    write_results(table, study.results)
    return {"rows": len(table), "results": str(study.results)}


def _fit_one(study: Study, method: str, table: pd.DataFrame, n_bootstrap: int) -> Any:
    from delphi.fits import FITTERS

    kwargs: dict[str, Any] = {"n_bootstrap": n_bootstrap, "seed": study.spec.seed}
    if method == "frontier":
        kwargs["target_compute"] = [hero_compute(study)]
    return FITTERS[method](table, **kwargs)


def stage_fit(study: Study) -> dict:
    from delphi.fits import load_results

    table = load_results(study.results)
    out = {}
    for method in study.spec.fits:
        start = time.perf_counter()
        fit = _fit_one(study, method, table, study.spec.bootstrap)
        atomic_write_json(study.fit_path(method), fit.to_json())
        out[method] = {"params": fit.params, "seconds": round(time.perf_counter() - start, 2)}
        _say(f"fit {method}: {', '.join(f'{k}={v:.4g}' for k, v in fit.params.items() if isinstance(v, (int, float)))}")
    return out


def stage_backtest(study: Study) -> dict:
    from delphi.fits import backtest, load_results

    table = load_results(study.results)
    out = {}
    for method in study.spec.fits:
        if method == "envelope":
            continue
        try:
            result = backtest(table, lambda t, m=method: _fit_one(study, m, t, 0))
        except DelphiError as e:  # too few budgets below the cut for this method
            out[method] = {"error": str(e)}
            continue
        out[method] = result
        for b in result["budgets"]:
            _say(f"backtest {method}: budget {b['budget']:.3g}: predicted {b['predicted_loss']:.4f}, "
                 f"observed {b['observed_best_loss']:.4f} ({b['rel_error']:+.2%})")
    atomic_write_json(study.fits_dir / "backtest.json", out)
    return {"methods": sorted(out)}


def hero_compute(study: Study) -> float:
    from delphi.ladder.spec import load_ladder_spec

    if study.spec.hero.compute is not None:
        return float(study.spec.hero.compute)
    return study.spec.hero.compute_multiple * max(load_ladder_spec(study.ladder_spec_path).budgets)


def stage_hero(study: Study) -> dict:
    from delphi.ladder.hero import hero_from_fit
    from delphi.ladder.spec import load_ladder_spec
    from delphi.train.config import train_config_from_dict, train_config_to_dict

    rung, details = hero_from_fit(study.fit_path(study.spec.primary_fit), hero_compute(study),
                                  load_ladder_spec(study.ladder_spec_path), seed=study.spec.seed)
    config = train_config_to_dict(rung.train)
    every = study.spec.hero.eval_every or max(1, rung.train.steps // 10)
    config.update(name="hero", eval_every=every, checkpoint_every=every)
    atomic_write_yaml(study.hero_config, train_config_to_dict(train_config_from_dict(config)))
    return details


def stage_prereg(study: Study) -> dict:
    from delphi.prereg.create import create_prereg

    if study.prereg.exists():  # sealed on an earlier, interrupted attempt: never rewrite it
        from delphi.prereg.format import read, seal_status

        if not seal_status(read(study.prereg))["ok"]:
            raise DelphiError(f"{study.prereg}: exists but its seal is broken; it was edited after sealing")
        return {"prereg": str(study.prereg), "note": "sealed earlier"}
    if (study.hero_run / "metrics.jsonl").exists():
        raise DelphiError(f"{study.hero_run}: the hero started before a preregistration existed; remove it to start over")
    doc = create_prereg(
        study.fit_path(study.spec.primary_fit), study.hero_config, study.prereg,
        ladder=study.ladder_dir, results=study.results, tolerance_rel=study.spec.hero.tolerance,
        author=study.spec.author, rationale=study.spec.rationale or _default_rationale(study),
        bootstrap=min(study.spec.bootstrap, 200), seed=study.spec.seed,
    )
    final = doc.get("prediction", {}).get("final", {}) if isinstance(doc.get("prediction"), dict) else {}
    return {"prereg": str(study.prereg), "final": final}


def _default_rationale(study: Study) -> str:
    return (f"Study {study.spec.name}: the {study.spec.primary_fit} law fitted on the ladder sizes the hero "
            f"and predicts its final loss; the trajectory comes from the LR-annealing curve law fitted on the ladder's curves.")


def stage_train_hero(study: Study) -> dict:
    from delphi.train.config import load_train_config
    from delphi.train.trainer import train

    cfg = load_train_config(study.hero_config)
    resume = (study.hero_run / "config.yaml").exists()
    return train(cfg, study.hero_run, resume=resume, prereg=study.prereg)


def stage_check(study: Study) -> dict:
    from delphi.prereg.check import check

    result, _, _ = check(study.prereg, run_dir=study.hero_run)
    _say(f"verdict: {result['verdict']}")
    return result


def stage_figures(study: Study) -> dict:
    """Every figure of the study, drawn by the same code as `delphi plot ...`."""
    from delphi.cli import main as delphi_main

    fig = lambda name: str(study.figures / f"{name}.png")
    primary = str(study.fit_path(study.spec.primary_fit))
    requests = [
        ["isoflop", str(study.results), "--out", fig("isoflop")]
        + (["--fit", str(study.fit_path("isoflop"))] if "isoflop" in study.spec.fits else []),
        ["allocation", primary, "--results", str(study.results), "--hero", str(study.hero_config), "--out", fig("allocation")],
        ["frontier", str(study.results), "--fit", primary, "--prereg", str(study.prereg), "--run", str(study.hero_run),
         "--out", fig("frontier")],
        ["prediction", str(study.prereg), "--run", str(study.hero_run), "--out", fig("prediction")],
        ["curves", str(study.ladder_dir), "--out", fig("ladder_curves")],
    ] + [["residuals", str(study.results), "--fit", str(study.fit_path(m)), "--out", fig(f"residuals_{m}")]
         for m in study.spec.fits if m != "frontier"]
    study.figures.mkdir(parents=True, exist_ok=True)
    failed = [r[0] for r in requests if delphi_main(["plot", *r]) != 0]
    if failed:
        raise DelphiError(f"figures: could not draw {', '.join(failed)} (see the errors above)")
    return {"files": sorted(str(p) for p in study.figures.glob("*.png"))}


def stage_report(study: Study) -> dict:
    atomic_write_text(study.report, render_report(study))
    return {"report": str(study.report)}


STAGES: tuple[tuple[str, Callable[[Study], dict]], ...] = (
    ("prepare", stage_prepare),
    ("plan", stage_plan),
    ("ladder", stage_ladder),
    ("collect", stage_collect),
    ("fit", stage_fit),
    ("backtest", stage_backtest),
    ("hero", stage_hero),
    ("prereg", stage_prereg),
    ("train_hero", stage_train_hero),
    ("check", stage_check),
    ("figures", stage_figures),
    ("report", stage_report),
)


STAGE_NAMES = tuple(name for name, _ in STAGES)


def run_study(study_path: str | Path | None, out: str | Path, *, stop_after: str | None = None) -> dict:
    """Run (or resume) the stages of a study; return the verdict and the report path.

    `stop_after` ends the invocation after that stage, e.g. "prereg" so the sealed
    file can be committed before the hero's first step; the next call resumes.
    """
    if stop_after is not None and stop_after not in STAGE_NAMES:
        raise DelphiError(f"--stop-after: unknown stage {stop_after!r} (expected one of {', '.join(STAGE_NAMES)})")
    spec, ladder_spec_path, prereg = load_study(study_path)
    study = Study(out, spec, ladder_spec_path, prereg)
    _pin_study(study)
    started = time.perf_counter()
    for name, stage in STAGES:
        if study.done(name) is not None:
            _say(f"{name}: done earlier, skipped")
            continue
        _say(f"{name}: running")
        t0 = time.perf_counter()
        result = stage(study)
        atomic_write_json(study.marker(name), {"stage": name, "seconds": round(time.perf_counter() - t0, 2), "result": result})
        _say(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        if name == stop_after:
            _say(f"stopped after {name}, as asked; run the same command without --stop-after to continue")
            return {"out": str(study.out), "stopped_after": name, "verdict": None}
    verdict = study.done("check")["result"]
    _say(f"report: {study.report} ({time.perf_counter() - started:.0f} s this invocation)")
    return {"out": str(study.out), "report": str(study.report), "verdict": verdict.get("verdict"),
            "predicted_loss": verdict.get("predicted_final_loss"), "actual_loss": verdict.get("actual_final_loss"),
            "rel_error": verdict.get("rel_error"), "covered_90": verdict.get("covered_90")}


# ---- report --------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return f"[{_fmt(x[0], spec)}, {_fmt(x[1], spec)}]"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def render_report(study: Study) -> str:
    """report.md: every number comes from the stage markers and the files they name."""
    plan = study.done("plan")["result"]
    fits = study.done("fit")["result"]
    hero = study.done("hero")["result"]
    check = study.done("check")["result"]
    backtest = json.loads((study.fits_dir / "backtest.json").read_text())
    table = pd.read_csv(study.results)
    lines = [
        f"# Study `{study.spec.name}`",
        "",
        f"Ladder: {plan['rungs']} runs, {plan['flops']:.3g} FLOPs in all, budgets "
        f"{', '.join(f'{b:.3g}' for b in sorted(table['budget'].unique()))}. "
        f"Hero: {hero['compute']:.3g} FLOPs ({hero['compute'] / table['budget'].max():.0f}x the largest budget), "
        f"d_model {hero.get('d_model')}, {hero.get('n_layers')} layers, N = {_fmt(hero.get('params'))}, "
        f"D = {_fmt(hero.get('tokens'))} tokens.",
        "",
        "## Preregistered prediction against the outcome",
        "",
        "| quantity | predicted | actual | relative error | inside 90% interval | verdict |",
        "|---|---|---|---|---|---|",
        f"| hero final val loss (nats/byte) | {_fmt(check.get('predicted_final_loss'))} | {_fmt(check.get('actual_final_loss'))} "
        f"| {_fmt(check.get('rel_error'), '+.2%')} | {_fmt(check.get('covered_90'))} | {check.get('verdict')} |",
        "",
        f"{check.get('why', '')}",
        "",
        "## Fits",
        "",
        "| method | parameters |",
        "|---|---|",
    ]
    for method, info in fits.items():
        params = ", ".join(f"{k} = {_fmt(v)}" for k, v in info["params"].items() if isinstance(v, (int, float)))
        lines.append(f"| {method} | {params} |")
    lines += ["", "## Backtests (fit below the top budget, predict it)", "",
              "| method | budget | predicted best loss | observed best loss | relative error | 90% covered |", "|---|---|---|---|---|---|"]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            lines.append(f"| {method} | {b['budget']:.3g} | {_fmt(b['predicted_loss'])} | {_fmt(b['observed_best_loss'])} "
                         f"| {_fmt(b['rel_error'], '+.2%')} | {_fmt(b.get('covered_90'))} |")
        if "error" in result:
            lines.append(f"| {method} | - | - | - | {result['error']} | - |")
    lines += ["", "## Figures", ""]
    for png in sorted(study.figures.glob("*.png")):
        lines.append(f"![{png.stem}](figures/{png.name})")
    lines += ["", "## Ladder", "", _markdown_table(table), ""]
    return "\n".join(lines)


def _markdown_table(table: pd.DataFrame) -> str:
    cols = [c for c in ("run_id", "budget", "d_model", "n_layers", "params", "tokens", "steps", "lr", "loss", "status") if c in table]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table[cols].iterrows():
        rows.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(rows)
