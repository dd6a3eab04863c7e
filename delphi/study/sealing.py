"""The study's seals: the gates, the evidence every seal is judged on (delphi.prereg.evidence), the
primary's seal with every competing law beside it, the probes' seals, and the refusal of a seal the
study did not make."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from delphi.errors import CheckFailed, DelphiError
from delphi.io import atomic_write_json
from delphi.path_policy import check_output_file
from delphi.prereg import gates as gt
from delphi.prereg.competing import competing_predictions
from delphi.prereg.create import create_prereg, gates_path
from delphi.prereg.evidence import Evidence, PredictionRule, SealTerms
from delphi.prereg.measure import compute_gates
from delphi.prereg.predict import hero_prediction
from delphi.prereg_format import read
from delphi.study.fitting import (
    default_rationale,
    fit_one,
    primary_choice_sentence,
    sized_run,
)
from delphi.study.seal_identity import foreign_seal, foreign_seal_message, sealed_seeds
from delphi.study.seeds import seed_runs
from delphi.study.spec import PREDICTION_GATES, own_probe_name
from delphi.study.state import (
    Study,
    format_value,
    ladder_spec,
    load_table,
    lr_calibration_paths,
    pin_lr_calibration,
    pin_probes,
    primary_backtest,
    probe_runs,
    rehearsal_result,
    say,
)
from delphi.train.config import load_train_config
from delphi.train.rundir import METRICS_FILE, SUMMARY_FILE


def stage_gates(study: Study) -> dict:
    """Every gate, PASS/FAIL, before the hero trains; a failure stops the study here unless `force: true`."""
    hero = load_train_config(study.hero_config)
    pin_lr_calibration(study)
    pin_probes(study)
    # While the study's own probes are untrained, the prediction they will correct is not known yet:
    # the ladder's gates decide whether to spend their compute, the prediction's wait for the seal.
    # Under the law alone nothing waits for them: the seals stage seals every prediction before any trains.
    pending = [
        m
        for m in study.spec.hero.probe_multiples
        if study.spec.hero.probe_correction and not (study.probes_dir / own_probe_name(m) / SUMMARY_FILE).is_file()
    ]
    evidence = _seal_evidence(study)
    rule = _seal_rule(study, probe_correction=study.spec.hero.probe_correction and not pending)
    final, fit = hero_prediction(evidence, hero, rule)  # what prereg will seal
    thresholds = study.spec.thresholds()
    gates = compute_gates(fit, evidence, hero, final, rule, thresholds)
    deferred = [g for g in gates if pending and g.name in PREDICTION_GATES]
    deciding = [g for g in gates if g not in deferred]
    report = gt.gate_report(deciding, forced=study.spec.force, thresholds=thresholds) | {"prediction": final}
    forced_gates = {n: study.spec.gates.force[n] for n in report["failed"] if n in study.spec.gates.force}
    if forced_gates:
        report["forced_gates"] = forced_gates
    if deferred:
        report["deferred"] = {
            "gates": [g.to_json() for g in deferred],
            "why": f"the study's probes at {', '.join(f'{m:g}x' for m in pending)} have not trained: "
            "these gates are evaluated at the seal, after them",
        }
    atomic_write_json(study.gates, report)
    for line in gt.gate_lines(deciding):
        say(f"gate {line}")
    for g in deferred:
        say(f"gate DEFERRED {g.name}: evaluated at the seal, after the study's probes")
    for name, reason in forced_gates.items():
        say(f"gate {name} FORCED by the study (gates.force): {reason}")
    if not report["passed"] and set(report["failed"]) - set(forced_gates):
        if not study.spec.force:
            raise CheckFailed(
                f"gates failed before the hero trained: {', '.join(report['failed'])}; the hero was NOT "
                f"trained and nothing was sealed (report {study.gates}). Fix the ladder (more seeds, "
                f"budgets, healthier rungs) or set `force: true` in the study file to go on anyway."
            )
        say(
            f"GATES FAILED ({', '.join(report['failed'])}); going on because the study says force: true "
            "(the preregistration records it)"
        )
    return {
        "passed": report["passed"],
        "failed": report["failed"],
        "forced": not report["passed"],
        "gates": report["gates"],
    }


def stage_seals(study: Study) -> dict:
    """Under the law alone (`hero.probe_correction: false`), seal every prediction beyond the ladder
    before any of them has a step: each of hero.probe_multiples, smallest first, sized
    like the hero and sealed into STUDY/probes/NAME.prereg.yaml, then the hero into its
    preregistration. No prediction depends on another run, so nothing waits for a probe; each seal
    evaluates the gates (the ladder's, as for the hero) and is refused unless they all pass or the
    study says `force: true`: a probe is a prediction of the paper, not evidence for the hero.

    `delphi study SPEC --out DIR --stop-after seals` ends there, so the seals can be committed
    before any run beyond the ladder trains; the probes and hero stages then train against them.
    A seal already present (an earlier attempt, or a study dir whose prereg stage sealed it) is kept,
    never rewritten. With `hero.probe_correction: true` the hero's seal needs the trained probes:
    this stage is skipped, and the probes and prereg stages seal and train in turn."""
    if study.spec.hero.probe_correction:
        return {
            "skipped": "hero.probe_correction: true: each probe is sealed and trained in turn (stage probes), "
            "the hero sealed after them, corrected by them (stage prereg)"
        }
    probes = []
    for multiple in sorted(study.spec.hero.probe_multiples):
        name = own_probe_name(multiple)
        probes.append(_seal_or_stop(name, probe_prereg(study, multiple), lambda m=multiple: seal_probe(study, m)))
    hero = _seal_or_stop("the hero", study.prereg, lambda: seal_hero(study))
    for name, sealed in [*((p["name"], p) for p in probes), ("hero", hero)]:
        final, i90 = sealed.get("final") or {}, (sealed.get("final") or {}).get("loss_90")
        say(
            f"seal {name}: {format_value(sealed.get('flops'), '.3g')} FLOPs, predicted {format_value(final.get('loss'))}"
            + (f" [{i90[0]:.4f}, {i90[1]:.4f}]" if i90 else "")
            + (" FORCED" if sealed.get("forced") else "")
            + f", {'sealed earlier, kept' if sealed.get('note') else 'sealed'} in {sealed['prereg']}"
        )
    return {"probes": probes, "hero": hero}


def _seal_or_stop(what: str, prereg: Path, seal: Callable[[], dict]) -> dict:
    """One seal of stage seals; a gate that refuses it stops the study before any run beyond the
    ladder trains, as the gates stage would (the seals written before it stay: never rewritten)."""
    try:
        return seal()
    except CheckFailed as refused:
        report_path = gates_path(prereg)
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        for g in report.get("gates", []):
            if not g.get("passed"):
                say(f"gate {gt.gate_lines([gt.Gate.from_json(g)])[0]} ({what})")
        failed = ", ".join(report.get("failed", [])) or str(refused)
        raise CheckFailed(
            f"gates failed before any run beyond the ladder trained: {failed} at the seal of {what}; "
            f"{what} was NOT sealed and no probe or hero was trained (report {report_path}). Fix the "
            f"ladder (more seeds, budgets, healthier rungs) or set `force: true` in the study file to go "
            f"on anyway.",
            result={
                "gates_file": str(report_path),
                "failed_gates": report.get("failed", []),
                "gates": report.get("gates", []),
            },
        ) from refused


def _seal_evidence(study: Study) -> Evidence:
    """What the gates and every seal of the study are judged on: the primary fit, the ladder and
    its results, the fit's backtest, the rehearsal, the pinned LR calibration and gates.probes, and
    the recipe check; the hero's and (under the law alone) each probe's seal see the same gates."""
    rehearsal = rehearsal_result(study)
    return Evidence(
        fit_path=study.fit_path(study.primary_fit),
        results=study.results,
        ladder=study.ladder_dir,
        backtest=primary_backtest(study),
        rehearsal_run=study.rehearsal_run if rehearsal is not None else None,
        rehearsal=rehearsal,
        lr_calibration=lr_calibration_paths(study),
        probe_runs=probe_runs(study),
        recipe_check=getattr(study, "recipe_check", None),
    )


def _seal_rule(study: Study, *, probe_correction: bool, point_correction: bool = True) -> PredictionRule:
    """How the study's prediction is made (its hero block): corrected by the probes or not, and by
    the design's measured bias only where `point_correction` (a probe's seal carries none)."""
    hero = study.spec.hero
    return PredictionRule(
        probe_correction=probe_correction,
        probe_carry=hero.probe_carry,
        noise_scope=hero.noise_scope,
        seeds=list(hero.seeds) or None,
        point_correction=hero.point_correction if point_correction else None,
    )


def _seal_terms(study: Study, rationale: str, trajectory_from_probes: bool = False) -> SealTerms:
    """What the study seals beside a prediction: its tolerance, thresholds, author, the gates it
    forces (each with its reason), the competing laws, `rationale`, and where the trajectory's shape comes from."""
    return SealTerms(
        tolerance_rel=study.spec.hero.tolerance,
        thresholds=study.spec.thresholds(),
        force=study.spec.force,
        forced_gates=dict(study.spec.gates.force),
        author=study.spec.author,
        rationale=rationale,
        curve_bootstrap=min(study.spec.bootstrap, 200),
        curve_seed=study.spec.seed,
        trajectory_from_probes=trajectory_from_probes,
        competing=lambda hero, final: _competing(study, hero, final),
    )


def _competing(study: Study, hero, final: dict) -> dict:
    """Every other law's prediction for a run beyond the ladder, sealed beside the primary:
    the study's fits and the asymptotic frontier law (fitted here once, on the fit stage's table). A
    law that cannot be fitted here is sealed as such (its error), beside the primary's seal."""
    paths = {m: study.fit_path(m) for m in study.spec.fits if study.fit_path(m).is_file()}
    unfitted: dict[str, dict] = {}
    if "asymptotic" not in paths:
        path = study.fit_path("asymptotic")
        if not path.is_file():
            convention = (study.done("fit") or {}).get("result", {}).get("params_convention")
            try:
                fit = fit_one(study, "asymptotic", load_table(study, convention), study.spec.bootstrap)
            except (DelphiError, ValueError, ArithmeticError) as e:
                unfitted["asymptotic"] = {"error": f"cannot be fitted on this ladder ({e})"}
                say(f"competing law asymptotic: cannot be fitted ({e}); sealed as such")
            else:
                atomic_write_json(path, fit.to_json())
        if "asymptotic" not in unfitted:
            paths["asymptotic"] = path
    return (
        competing_predictions(
            paths,
            study.primary_fit,
            final,
            hero,
            study.results,
            study.spec.hero.noise_scope,
            len(study.spec.hero.seeds) or 1,
        )
        | unfitted
    )


def probe_prereg(study: Study, multiple: float) -> Path:
    """Where the seal of one of hero.probe_multiples goes (StudySpec.probe_preregistration)."""
    template = study.spec.probe_preregistration
    if template is None:
        return study.probes_dir / f"{own_probe_name(multiple)}.prereg.yaml"
    return study.prereg.parent / template.format(multiple=f"{multiple:g}")


def _sealed_earlier(study: Study, path: Path, config: Path, seeds: list[int] | None) -> dict:
    """A seal written on an earlier attempt (or stage) of this study: checked to be this study's seal
    of the run `config` at `seeds` (`foreign_seal`), never rewritten."""
    if problem := foreign_seal(study, path, config, seeds):
        raise DelphiError(foreign_seal_message(path, problem))
    return {"prereg": str(path), "note": "sealed earlier"} | _sealed_summary(read(path))


def check_seal_paths(study: Study, study_file: str | Path | None) -> None:
    """Before any stage: every seal the study will write (the hero's, each of hero.probe_multiples')
    has a path it can write, and a file already there is this study's own seal (`foreign_seal`),
    kept as it is; otherwise exit 2 naming the difference, before the ladder trains."""
    where = str(study_file) if study_file is not None else "the default study"
    seals = [(study.prereg, study.hero_config, "preregistration", sealed_seeds(study, probe=False))]
    seals += [
        (
            probe_prereg(study, m),
            study.probes_dir / f"{own_probe_name(m)}.yaml",
            "probe_preregistration",
            sealed_seeds(study, probe=True),
        )
        for m in study.spec.hero.probe_multiples
    ]
    for path, config, key, seeds in seals:
        check_output_file(path, flag=f"{where}: {key}")
        if path.exists() and (problem := foreign_seal(study, path, config, seeds)):
            raise DelphiError(foreign_seal_message(path, problem))


def _sealed_summary(doc: dict) -> dict:
    """What a stage records of a seal: the run's FLOPs, the final prediction, whether it was forced."""
    final = doc.get("prediction", {}).get("final", {}) if isinstance(doc.get("prediction"), dict) else {}
    return {"flops": (doc.get("hero") or {}).get("flops"), "final": final, "forced": doc.get("forced", False)}


def seal_probe(study: Study, multiple: float) -> dict:
    """Size one of hero.probe_multiples like the hero (STUDY/probes/NAME.yaml) and seal its prediction
    (NAME.prereg.yaml) before its first step. Under the law alone it is a prediction like the hero's,
    judged by the same gates (force only if the study says so); with probe_correction it is evidence
    for the hero's correction, sealed with force on the ladder's own evidence (the gates judge the
    hero, not a probe). A present seal is kept; a probe that started before its seal existed is refused."""
    name = own_probe_name(multiple)
    run, config, seal = study.probes_dir / name, study.probes_dir / f"{name}.yaml", probe_prereg(study, multiple)
    if not config.is_file():
        sized_run(study, multiple * max(ladder_spec(study).budgets), name, config)
    out = {"name": name, "multiple": multiple, "config": str(config)}
    if seal.exists():
        return out | _sealed_earlier(study, seal, config, sealed_seeds(study, probe=True))
    for _, seed_run in seed_runs(config, run, study.spec.hero.seeds):
        if (seed_run / METRICS_FILE).exists():
            raise DelphiError(
                f"{seed_run}: the probe started before its preregistration existed; remove it to start over"
            )
    if study.spec.hero.probe_correction:
        evidence = Evidence(
            fit_path=study.fit_path(study.primary_fit),
            results=study.results,
            ladder=study.ladder_dir,
            backtest=primary_backtest(study),
        )
        terms = SealTerms(
            tolerance_rel=study.spec.hero.tolerance,
            thresholds=study.spec.thresholds(),
            force=True,
            author=study.spec.author,
            rationale=f"Study {study.spec.name}: probe at {multiple:g}x the top budget, evidence for the hero's gates "
            "(sealed with force: the gates judge the hero, not a probe).",
            curve_bootstrap=min(study.spec.bootstrap, 200),
            curve_seed=study.spec.seed,
        )
        doc = create_prereg(evidence, seal, hero_path=config, terms=terms)
    else:
        rationale = (
            f"Study {study.spec.name}: a prediction at {multiple:g}x the top budget, the "
            f"{study.primary_fit} law fitted on the ladder alone, sealed with every other "
            "prediction beyond the ladder before any of them trained." + primary_choice_sentence(study)
        )
        doc = create_prereg(
            _seal_evidence(study),
            seal,
            hero_path=config,
            rule=_seal_rule(study, probe_correction=False, point_correction=False),
            terms=_seal_terms(study, rationale),
        )
    return out | {"prereg": str(seal)} | _sealed_summary(doc)


def seal_hero(study: Study) -> dict:
    """The hero's preregistration (study.prereg), sealed before its first step: by stage seals under
    the law alone, by stage prereg (after the probes that correct it) otherwise. One sealed earlier
    is kept, never rewritten; a hero that started before its seal existed is refused."""
    if study.prereg.exists():  # sealed on an earlier, interrupted attempt or by stage seals: never rewrite it
        return _sealed_earlier(study, study.prereg, study.hero_config, sealed_seeds(study, probe=False))
    for _, seed_run in seed_runs(study.hero_config, study.hero_run, study.spec.hero.seeds):
        if (seed_run / METRICS_FILE).exists():
            raise DelphiError(f"{seed_run}: the hero started before a preregistration existed; remove it to start over")
    doc = create_prereg(
        _seal_evidence(study),
        study.prereg,
        hero_path=study.hero_config,
        rule=_seal_rule(study, probe_correction=study.spec.hero.probe_correction),
        terms=_seal_terms(
            study,
            (study.spec.rationale or default_rationale(study)) + primary_choice_sentence(study),
            trajectory_from_probes=study.spec.hero.trajectory == "probes",
        ),
    )
    return {"prereg": str(study.prereg)} | _sealed_summary(doc)
