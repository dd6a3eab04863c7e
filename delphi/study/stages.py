"""The stages of a study, in order (`STAGES`), and `run_study`, which runs or resumes them:

    prepare -> plan -> ladder -> collect -> fit -> backtest -> hero -> gates -> dress_rehearsal
            -> seals -> probes -> prereg -> train_hero -> check -> figures -> report

Each stage is a function of the `Study` that returns a JSON-able result; `run_study` writes it to
`stages/<name>.json` when the stage completes and skips the completed ones on a rerun (docs/cli.md).
The gates and seals are in `delphi.study.sealing`.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delphi.errors import CheckFailed, DelphiError
from delphi.fits import backtest, load_fit
from delphi.fits.backtest import all_holdouts
from delphi.io import atomic_write_json
from delphi.ladder.collect import collect_ladder, write_results
from delphi.ladder.hero import hero_preflight
from delphi.ladder.manifest import format_table, write_ladder
from delphi.ladder.plan import plan_ladder
from delphi.ladder.recipe_check import study_report_path
from delphi.ladder.runner import run_ladder
from delphi.prereg.check import check
from delphi.prereg.gates import gate_dress_rehearsal
from delphi.prereg.predict import predict_hero, run_noise_nats, run_predicted_vs_actual
from delphi.study.fitting import (
    compare_conventions,
    fit_one,
    primary_for,
    sized_run,
)
from delphi.study.report import stage_figures, stage_report
from delphi.study.sealing import check_seal_paths, seal_hero, seal_probe, stage_gates, stage_seals
from delphi.study.seeds import finished, seed_runs, train_seeds
from delphi.study.spec import load_study
from delphi.study.state import (
    Study,
    format_value,
    hero_compute,
    ladder_spec,
    load_table,
    pin_study,
    say,
)
from delphi.study.store import check_store_unchanged, current_store
from delphi.train.checkpoint import check_checkpoint_path
from delphi.train.config import load_train_config
from delphi.train.environment import check_cache_dirs
from delphi.train.rundir import CONFIG_FILE
from delphi.train.trainer import train


def stage_prepare(study: Study) -> dict:
    """The corpus store the ladder trains on, pinned by its sha256 (`delphi.study.store`)."""
    return current_store(study)


def stage_plan(study: Study) -> dict:
    ladder = ladder_spec(study)
    preflight = _hero_preflight(study, ladder)
    rows = write_ladder(ladder, plan_ladder(ladder), study.ladder_dir)
    print(format_table(rows), file=sys.stderr)
    return {"rungs": len(rows), "flops": sum(float(r["flops"]) for r in rows), "hero_preflight": preflight}


def _hero_preflight(study: Study, ladder) -> dict:
    """Before the ladder trains: would the rehearsal and the hero fit the ladder's ranges if the
    optimum came out where the spec expects it? If not at the expected optimum itself, the gates
    would refuse after hours of ladder; stop now unless `force: true`."""
    if ladder.isoflop is None:
        return {"skipped": "a tokens_per_param ladder has no expected optimum"}
    runs = {"hero": hero_compute(study)}
    if study.spec.hero.rehearsal_multiple is not None:
        runs["rehearsal"] = study.spec.hero.rehearsal_multiple * max(ladder.budgets)
    out = {}
    for name, compute in runs.items():
        facts = out[name] = hero_preflight(ladder, compute)
        band = facts["inside_factors"]
        expected = facts["expected"]
        say(
            f"preflight {name} at {compute:.3g} FLOPs: at the expected N* ({facts['expected_params']:.3g}) it would be "
            f"{expected['run_id']} ({expected['steps']:,} steps), "
            + (
                f"inside the ladder's ranges and depths for a fitted N* {band[0]:g}-{band[1]:g}x the expected"
                if band
                else "outside the ladder's ranges or depths at every N* from 0.5x to 2x the expected"
            )
        )
        if not expected["inside"] and not study.spec.force:
            raise CheckFailed(
                f"preflight: the {name} at {compute:.3g} FLOPs would leave the ladder's ranges or depths "
                f"({', '.join(expected['outside'])}) even if the fit found the optimum the ladder spec expects; "
                f"the gates hero_ranges / hero_depth would refuse it after the ladder trained. Nothing was "
                f"trained. Lower hero.compute_multiple, add anchors (long rungs of small shapes), widen "
                f"isoflop.span, or choose a depth rule that keeps the hero at a depth trained near the optimum."
            )
    return out


def stage_ladder(study: Study) -> dict:
    check_store_unchanged(study)
    summary = run_ladder(study.ladder_dir, workers=study.spec.workers)
    if summary.get("failed"):
        raise DelphiError(f"ladder: rungs failed: {summary['failed']}; see {study.ladder_dir}/logs and rerun the study")
    return summary


def stage_collect(study: Study) -> dict:
    table = collect_ladder(study.ladder_dir)
    write_results(table, study.results)
    return {"rows": len(table), "results": str(study.results)}


def stage_fit(study: Study) -> dict:
    conventions = compare_conventions(study)
    atomic_write_json(study.conventions, conventions)
    convention = conventions["chosen"]
    table = load_table(study, convention)
    # primary_fit: auto is resolved here, once, on the chosen convention's table (the features the
    # seal's calibration compares), and recorded in this stage's result: Study.primary_fit reads it.
    primary, choice = primary_for(study, table)
    if choice is not None:
        atomic_write_json(study.conventions, conventions | {"primary_fit": primary})
    say(f"parameter convention: {convention} ({conventions['why']})")
    for name, row in conventions["conventions"].items():
        say(
            f"  {name}: isoFLOP a = {format_value(row.get('isoflop_a'), '.3f')}, {row.get('primary_fit', primary)} a = "
            f"{format_value(row.get('law_a'), '.3f')}, backtest |error| {format_value(row.get('backtest_mean_abs_rel_error'), '.2%')}"
            + (f" ({row['error']})" if row.get("error") else "")
        )
    if choice is not None:
        say(
            f"primary law: {primary}, chosen by evidence (primary_fit: auto) among {', '.join(choice['candidates'])}: "
            + ", ".join(f"{r['method']} {r['mean_abs_rel_error']:.2%}" for r in choice["table"])
            + f" out-of-sample |error| on {', '.join(s['source'] for s in choice['similar_sources'])}"
        )
    out: dict[str, Any] = {}
    for method in study.spec.fits:
        start = time.perf_counter()
        try:
            fit = fit_one(study, method, table, study.spec.bootstrap)
        except DelphiError as e:
            if method == primary:
                raise
            out[method] = {"error": str(e)}  # a secondary law that cannot be fitted here is reported, not fatal
            say(f"fit {method}: failed ({e})")
            continue
        atomic_write_json(study.fit_path(method), fit.to_json())
        out[method] = {
            "params": fit.params,
            "seconds": round(time.perf_counter() - start, 2),
            "status": getattr(fit, "status", None),
            "allocation": getattr(fit, "allocation", None),
            "seed_noise_nats": fit.diagnostics.seed_noise_nats,
        }
        say(
            f"fit {method}: {', '.join(f'{k}={v:.4g}' for k, v in fit.params.items() if isinstance(v, (int, float)))}"
            + (f" [{fit.status}]" if getattr(fit, "status", "ok") != "ok" else "")
        )
    result: dict[str, Any] = {"params_convention": convention, "fits": out}
    if choice is not None:
        result |= {"primary_fit": primary, "primary_choice": choice}
    return result


# The backtest's own bootstrap: enough draws for a 90% interval, fewer than the final fits'.
BACKTEST_BOOTSTRAP_MAX = 100


def stage_backtest(study: Study) -> dict:
    """Hold out the top budget (every method, with 90% intervals and coverage), then every budget above
    the third in turn (mean |error| and coverage per method)."""
    table = load_table(study)
    n_boot = min(study.spec.bootstrap, BACKTEST_BOOTSTRAP_MAX)
    methods = [m for m in study.spec.fits if m != "envelope"]
    out: dict[str, Any] = {}
    for method in methods:
        try:
            result = backtest(table, lambda t, m=method: fit_one(study, m, t, n_boot))
        except DelphiError as e:  # too few budgets below the cut for this method
            out[method] = {"error": str(e)}
            continue
        out[method] = result
        for b in result["budgets"]:
            i90 = b.get("loss_interval_90")
            say(
                f"backtest {method}: budget {b['budget']:.3g}: predicted {b['predicted_loss']:.4f}"
                + (f" [{i90[0]:.4f}, {i90[1]:.4f}]" if i90 else "")
                + f", observed {b['observed_best_loss']:.4f} ({b['rel_error']:+.2%})"
            )
    atomic_write_json(study.fits_dir / "backtest.json", out)
    summary = None
    try:
        many = all_holdouts(table, {m: (lambda t, m=m: fit_one(study, m, t, n_boot)) for m in methods})
        atomic_write_json(study.fits_dir / "backtest_all.json", many)
        summary = many["summary"]
    except DelphiError as e:  # too few budgets for more than one cut
        say(f"backtest over every held-out budget: skipped ({e})")
    return {"methods": sorted(out), "summary": summary}


def stage_hero(study: Study) -> dict:
    fit = load_fit(study.fit_path(study.primary_fit))
    n_star = fit.predict(compute=hero_compute(study)).get("params")
    if n_star is None or not float(n_star) > 0:
        bound = ", ".join(fit.diagnostics.at_bound or []) or "none"
        raise CheckFailed(
            f"the {study.primary_fit} fit has no compute-optimal point (status {getattr(fit, 'status', '?')}, "
            f"on a bound: {bound}; parameters {fit.params}): gate fit_status fails and the hero cannot be "
            f"sized; nothing was trained or sealed. The ladder does not determine the law: add budgets or seeds."
        )
    return sized_run(study, hero_compute(study), "hero", study.hero_config)


def stage_dress_rehearsal(study: Study) -> dict:
    """Predict and train one run at ~3x the top budget, sized like the hero; its error is a gate.

    It runs after the other gates passed (no compute is spent on a rehearsal of a ladder the gates
    already refuse) and stops the study before the hero when it misses, unless `force: true`."""
    multiple = study.spec.hero.rehearsal_multiple
    if multiple is None:
        return {"skipped": "hero.rehearsal_multiple is null: no dress rehearsal"}
    compute = multiple * max(ladder_spec(study).budgets)
    check_store_unchanged(study)
    if not study.rehearsal_config.is_file():
        sized_run(study, compute, "rehearsal", study.rehearsal_config)
    fit = load_fit(study.fit_path(study.primary_fit))
    cfg = load_train_config(study.rehearsal_config)

    predicted = predict_hero(fit, cfg)[0]
    say(f"dress rehearsal at {compute:.3g} FLOPs ({multiple:g}x the top budget): predicted {predicted['loss']:.4f}")
    finished(
        train(cfg, study.rehearsal_run, resume=(study.rehearsal_run / CONFIG_FILE).exists()), "the dress rehearsal"
    )
    result = run_predicted_vs_actual(
        fit, study.rehearsal_run, run_noise_nats(fit, load_table(study), study.spec.hero.noise_scope)[0]
    )
    say(
        f"dress rehearsal: actual {result['actual']:.4f} vs predicted {result['predicted']:.4f} ({result['rel_error']:+.2%})"
    )
    thresholds = study.spec.thresholds()
    gate = gate_dress_rehearsal(
        result | {"compute": compute}, thresholds.rehearsal_tolerance_rel or thresholds.tolerance_rel
    )
    say(f"gate {'PASS' if gate.passed else 'FAIL'} {gate.name}: {gate.detail}")
    if not gate.passed and not study.spec.force:
        raise CheckFailed(
            f"gates failed before the hero trained: dress_rehearsal ({gate.detail}; {gate.threshold}); "
            "the hero was NOT trained and nothing was sealed. Set `force: true` in the study file to go on anyway."
        )
    return result | {"multiple": multiple, "gate_passed": gate.passed}


def stage_probes(study: Study) -> dict:
    """Each of hero.probe_multiples, smallest first, trained against its seal: under the law alone
    the seals stage sealed them all (with the hero) before this stage; with probe_correction each is
    sized and sealed here (`seal_probe`, with force: the gates judge the hero, not a probe) just
    before it trains. A probe that started before its seal existed is refused; an interrupted one
    resumes."""
    multiples = sorted(study.spec.hero.probe_multiples)
    if not multiples:
        return {"skipped": "hero.probe_multiples is empty: no probes of the study's own"}
    check_store_unchanged(study)
    fit = load_fit(study.fit_path(study.primary_fit))
    noise = run_noise_nats(fit, load_table(study), study.spec.hero.noise_scope)[0]
    results = []
    for multiple in multiples:
        sealed = seal_probe(study, multiple)
        name, run, seal = sealed["name"], study.probes_dir / sealed["name"], Path(sealed["prereg"])
        cfg = load_train_config(Path(sealed["config"]))
        say(f"probe {name}: {cfg.flops:.3g} FLOPs, sealed in {seal}")
        runs = seed_runs(Path(sealed["config"]), run, study.spec.hero.seeds)
        train_seeds(runs, seal, f"probe {name}")
        result = run_predicted_vs_actual(fit, run, noise)
        if len(runs) > 1:
            verdict, _, _ = check(seal, run_dirs=[r for _, r in runs])
            result |= {
                "seeds": verdict.get("seeds"),
                "actual": verdict["actual_final_loss"],
                "rel_error": verdict["rel_error"],
            }
        say(
            f"probe {name}: actual {result['actual']:.4f} vs predicted {result['predicted']:.4f} ({result['rel_error']:+.2%})"
        )
        results.append(result | {"name": name, "multiple": multiple})
    return {"probes": results}


def stage_prereg(study: Study) -> dict:
    """The hero's seal (`seal_hero`); under the law alone the seals stage wrote it already ("sealed earlier")."""
    return seal_hero(study)


def stage_train_hero(study: Study) -> dict:
    check_store_unchanged(study)
    runs = seed_runs(study.hero_config, study.hero_run, study.spec.hero.seeds)
    summaries = train_seeds(runs, study.prereg, "the hero")
    return summaries[0] if len(summaries) == 1 else {"status": "completed", "seeds": summaries}


def stage_check(study: Study) -> dict:
    runs = seed_runs(study.hero_config, study.hero_run, study.spec.hero.seeds)
    result, _, _ = check(study.prereg, run_dirs=[r for _, r in runs])
    say(f"verdict: {result['verdict']}")
    return result


STAGES: tuple[tuple[str, Callable[[Study], dict]], ...] = (
    ("prepare", stage_prepare),
    ("plan", stage_plan),
    ("ladder", stage_ladder),
    ("collect", stage_collect),
    ("fit", stage_fit),
    ("backtest", stage_backtest),
    ("hero", stage_hero),
    ("gates", stage_gates),
    ("dress_rehearsal", stage_dress_rehearsal),
    ("seals", stage_seals),
    ("probes", stage_probes),
    ("prereg", stage_prereg),
    ("train_hero", stage_train_hero),
    ("check", stage_check),
    ("figures", stage_figures),
    ("report", stage_report),
)


STAGE_NAMES = tuple(name for name, _ in STAGES)


def _refusal(study: Study) -> dict:
    """What a study that stopped on a failed check reports with it: the gate report, when there is one."""
    if not study.gates.is_file():
        return {}
    report = json.loads(study.gates.read_text())
    return {"gates_file": str(study.gates), "failed_gates": report.get("failed", []), "gates": report.get("gates", [])}


def run_study(
    study_path: str | Path | None, out: str | Path, *, stop_after: str | None = None, accept_store: str | None = None
) -> dict:
    """Run (or resume) the stages of a study; return the verdict and the report path.

    `stop_after` ends the invocation after that stage, e.g. "seals" (under the law alone) or
    "prereg" so the sealed files can be committed before any of their runs' first step; the next
    call resumes.
    `accept_store` (a sha256) goes on with a corpus store that differs from the one pinned at
    prepare, when it is that store (`check_store_unchanged`; recorded in store_accepted.json).
    """
    if stop_after is not None and stop_after not in STAGE_NAMES:
        raise DelphiError(f"--stop-after: unknown stage {stop_after!r} (expected one of {', '.join(STAGE_NAMES)})")
    if accept_store is not None and not re.fullmatch(r"[0-9a-f]{64}", accept_store):
        raise DelphiError(
            f"--accept-store: {accept_store!r} is not a store's sha256 (64 lowercase hex digits, "
            "as the study's refusal prints it)"
        )
    spec, ladder_spec_path, prereg, calibrations, probes = load_study(study_path)
    study = Study(out, spec, ladder_spec_path, prereg, calibrations, probes, accept_store)

    study.recipe_check = study_report_path(study_path, spec.gates.recipe_check)
    check_seal_paths(study, study_path)

    check_cache_dirs()  # the store and every rung use them: refused before the first stage
    check_checkpoint_path(study.out)  # every run of the study checkpoints under it
    pin_study(study)
    started = time.perf_counter()
    for name, stage in STAGES:
        if study.done(name) is not None:
            say(f"{name}: done earlier, skipped")
        else:
            say(f"{name}: running")
            t0 = time.perf_counter()
            try:
                result = stage(study)
            except CheckFailed as failed:  # a refusal is the study's result too (`--json`)
                failed.result = (
                    {"out": str(study.out), "stopped_at": name, "verdict": None}
                    | _refusal(study)
                    | (failed.result or {})
                )
                raise
            atomic_write_json(
                study.marker(name), {"stage": name, "seconds": round(time.perf_counter() - t0, 2), "result": result}
            )
            say(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        if name == stop_after:  # also when it was done earlier: the invocation goes no further
            say(f"stopped after {name}, as asked; run the same command without --stop-after to continue")
            return {"out": str(study.out), "stopped_after": name, "verdict": None}
    verdict = study.done("check")["result"]
    say(f"report: {study.report} ({time.perf_counter() - started:.0f} s this invocation)")
    return {
        "out": str(study.out),
        "report": str(study.report),
        "verdict": verdict.get("verdict"),
        "predicted_loss": verdict.get("predicted_final_loss"),
        "actual_loss": verdict.get("actual_final_loss"),
        "rel_error": verdict.get("rel_error"),
        "covered_90": verdict.get("covered_90"),
    }
