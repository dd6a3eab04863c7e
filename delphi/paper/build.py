"""`delphi paper build`: regenerate the paper's figures and numbers from its data files.

A paper (PAPER_DIR/paper.md) is rendered from PAPER_DIR/template.md. Every number in
the text is a `$placeholder` filled from a finished study's compact data (results table, fits,
backtests, gates, the rehearsal, the hero's metrics, the preregistration), so nothing in the prose
is typed by hand and nothing needs training to rebuild.

paper/paper.md is the current edition; paper/editions/vN/ holds every edition's data in compact form
(`delphi.editions`: a curves table and an archive of small files, not a directory per run), and each
earlier edition's text and figures. The current edition's data is the newest paper/editions/vN/.

    delphi paper build                      # the current edition (paper/paper.md) from the newest edition's data
    delphi paper build --edition v3         # the third edition, into paper/editions/v3/paper.md
    delphi paper build --all                # every edition with a template.md
    delphi paper build --paper-dir paper/editions/v3 --data paper/editions/v3/study   # the same, spelled out
    delphi paper build --from-study runs/paper      # import a finished study into PAPER_DIR/data, then build
"""

from __future__ import annotations

import json
import shutil
import string
from datetime import UTC
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.editions import EDITIONS_DIR, NEXT_DIR, editions
from delphi.errors import DelphiError
from delphi.fits.data import ANCHOR_ROLE, isoflop_rows
from delphi.io import atomic_write_text
from delphi.paper.beyond import (
    NOT_AVAILABLE,
    NOT_SEALED,
    OLD_RECIPE_EDITION,
    count_words,
    law_alone_rows,
    law_alone_section,
    laws_section,
    run_vs_law,
    runs_summary,
    sealed_runs,
)


def import_study(study_dir: Path, data_dir: Path) -> list[str]:
    """Write a finished study's compact data (no checkpoints, no logs, no figures) into `data_dir`
    in the editions' form (`delphi.editions`: curves.csv.gz, files.csv.gz, small plain files)."""
    import tempfile

    from delphi.editions import pack

    if not (study_dir / "stages" / "report.json").is_file():
        raise DelphiError(f"--from-study: {study_dir} is not a finished study (no stages/report.json)")
    from delphi.study.snapshot import compact_files

    copied = []
    with tempfile.TemporaryDirectory() as tmp:
        for rel in compact_files(study_dir):
            if rel.parts[0] == "figures" or rel.name == "report.md":
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(study_dir / rel, Path(tmp) / rel)
            copied.append(str(rel))
        prereg = Path(json.loads((study_dir / "stages" / "prereg.json").read_text())["result"]["prereg"])
        if prereg.parent != study_dir:  # sealed outside the study dir (the project's own study)
            shutil.copy2(prereg, Path(tmp) / "preregistration.yaml")
            copied.append(f"preregistration.yaml (from {prereg})")
        pack(tmp, data_dir)
    return copied


def _stage(data_dir: Path, name: str) -> dict:
    path = data_dir / "stages" / f"{name}.json"
    if not path.is_file():
        raise DelphiError(f"{path}: stage {name!r} not found; the paper needs a finished study")
    return json.loads(path.read_text())["result"]


UNCHECKED = "not yet checked (the hero has not finished)"


def _check_stage(data_dir: Path) -> dict:
    """The hero's check. A study of the law alone has sealed every prediction beyond the ladder at
    stage seals, before any trains: its paper can be built from then on, each run shown as sealed,
    trained or checked (`law_alone_section`), the hero's verdict UNCHECKED until it has one."""
    if not (data_dir / "stages" / "check.json").is_file() and (data_dir / "stages" / "seals.json").is_file():
        return {}
    return _stage(data_dir, "check")


def prereg_file(data_dir: Path) -> Path:
    """The study's sealed preregistration: `preregistration.yaml` in the data (a study that sealed
    inside its directory, or `--from-study`'s copy), else the file its prereg stage names, looked up
    by name in a `preregistrations/` folder above the data (the project's own studies seal there;
    the stage records the absolute path of the machine that sealed it)."""
    local = data_dir / "preregistration.yaml"
    if local.is_file():
        return local
    named = Path(_stage(data_dir, "prereg")["prereg"])
    for parent in data_dir.resolve().parents:
        if (candidate := parent / "preregistrations" / named.name).is_file():
            return candidate
    if named.is_file():
        return named
    raise DelphiError(
        f"{data_dir}: preregistration {named.name} not found in the data or in a preregistrations/ folder above it"
    )


def _study_view(data_dir: Path, figures_dir: Path):
    """A `Study` whose paths point into the paper's data (and figures) directory."""
    from delphi.config_schema import from_dict
    from delphi.study.spec import StudySpec
    from delphi.study.state import Study

    pinned = json.loads((data_dir / "study.json").read_text())
    spec = from_dict(StudySpec, pinned["study"], f"{data_dir}/study.json")
    study = Study(data_dir, spec, data_dir / "ladder" / "ladder.yaml", prereg=prereg_file(data_dir))
    study.figures = figures_dir
    return study


def paper_numbers(data_dir: Path, shown_as: str | None = None, old_recipe: Path | None = None) -> dict[str, Any]:
    """Every number the text quotes, computed from the data files; `shown_as` is the data's path
    as the text quotes it (default: `data_dir`). `old_recipe` (a study's data, as the text quotes
    it) is set beside a study of the law alone run by run (`law_alone_section`)."""
    check, hero, plan = _check_stage(data_dir), _stage(data_dir, "hero"), _stage(data_dir, "plan")
    fits = {
        m: json.loads(p.read_text())
        for m in ("isoflop", "parametric", "vpnls", "frontier")
        if (p := data_dir / "fits" / f"{m}.json").is_file()
    }
    backtest = json.loads((data_dir / "fits" / "backtest.json").read_text())
    prereg_path = prereg_file(data_dir)
    prereg_doc = _read_prereg(prereg_path)
    final = prereg_doc["prediction"]["final"]
    table = pd.read_csv(data_dir / "results.csv")
    budgets = sorted(isoflop_rows(table)["budget"].unique())  # anchor rungs are not a budget of the ladder
    vp = fits.get("vpnls", {})
    iso = fits.get("isoflop", {})
    n: dict[str, Any] = {
        "n_runs": len(table),
        "n_budgets": len(budgets),
        "budget_min": f"{budgets[0]:.3g}",
        "budget_max": f"{budgets[-1]:.3g}",
        "budget_span": f"{budgets[-1] / budgets[0]:.0f}",
        "ladder_flops": f"{plan['flops']:.3g}",
        "hero_compute": f"{hero['compute']:.3g}",
        "extrapolation": f"{hero['compute'] / budgets[-1]:.0f}",
        "hero_d_model": hero.get("d_model"),
        "hero_layers": hero.get("n_layers"),
        "hero_params": f"{float(hero['params']):.3g}",
        "hero_tokens": f"{float(hero['tokens']):.3g}",
        "pred_loss": f"{final['loss']:.4f}",
        "pred_50": _interval(final.get("loss_50")),
        "pred_90": _interval(final.get("loss_90")),
        "actual_loss": f"{check['actual_final_loss']:.4f}" if check.get("actual_final_loss") is not None else "n/a",
        "rel_error": f"{check['rel_error']:+.2%}" if check.get("rel_error") is not None else "n/a",
        "abs_rel_error": f"{abs(check['rel_error']):.2%}" if check.get("rel_error") is not None else "n/a",
        "covered_90": {True: "inside", False: "outside", None: "n/a"}[check.get("covered_90")],
        "covered_50": {True: "inside", False: "outside", None: "n/a"}[check.get("covered_50")],
        "verdict": check.get("verdict", UNCHECKED),
        "tolerance": f"{check.get('tolerance_rel', prereg_doc['decision']['tolerance_rel']):.0%}",
        "prereg_created": prereg_doc.get("created"),
        "prereg_seal": str(prereg_doc.get("seal", {}).get("digest", ""))[:16],
    }
    for key in ("E", "A", "B", "alpha", "beta"):
        n[f"vpnls_{key}"] = f"{vp['params'][key]:.4g}" if key in vp.get("params", {}) else "n/a"
        n[f"vpnls_{key}_90"] = _interval((vp.get("intervals") or {}).get(key))
    derived = vp.get("derived", {})
    n["vpnls_a"] = f"{derived['a']:.3f}" if "a" in derived else "n/a"
    n["iso_a"] = f"{iso['params']['a']:.3f}" if "a" in iso.get("params", {}) else "n/a"
    n["iso_a_90"] = _interval((iso.get("intervals") or {}).get("a"))
    n["iso_b"] = f"{iso['params']['b']:.3f}" if "b" in iso.get("params", {}) else "n/a"
    n["iso_loss_exponent"] = (
        f"{iso['params']['loss_exponent']:.4f}" if "loss_exponent" in iso.get("params", {}) else "n/a"
    )
    n["vpnls_E_at_bound"] = "yes" if "E" in (vp.get("diagnostics") or {}).get("at_bound", []) else "no"
    frontier = fits.get("frontier", {})
    sens = frontier.get("sensitivity") or {}
    if sens.get("predicted_loss"):
        n["frontier_pred"] = f"{sens['predicted_loss'][0]:.4f}"
        n["frontier_pred_range"] = _interval(sens["predicted_loss_range_over_E_interval"][0])
        n["frontier_E_90"] = _interval(sens.get("E_interval_profile_90"))
    else:
        n["frontier_pred"] = n["frontier_pred_range"] = n["frontier_E_90"] = "n/a"
    # How far the hero's tokens per parameter lie beyond what the ladder showed at its width.
    hero_tpp = float(hero["tokens"]) / float(hero["params"])
    same_width = table[table["d_model"] == hero.get("d_model")]
    n["hero_tpp"] = f"{hero_tpp:.0f}"
    n["ladder_tpp_at_hero_width"] = (
        f"{(same_width['tokens'] / same_width['params']).max():.0f}"
        if len(same_width)
        else "n/a (no ladder run at the hero's width)"
    )
    n["ladder_tpp_max"] = f"{(table['tokens'] / table['params']).max():.0f}"
    points = check.get("points") or []
    worst = max(points, key=lambda p: abs(p["rel_error"])) if points else None
    n["traj_worst"] = f"{worst['rel_error']:+.2%} at {worst['tokens']:.3g} tokens" if worst else "n/a"
    n["traj_outside_90"] = f"{check.get('n_outside_90', 0)} of {check.get('n_points', 0)}"
    # The curve's evals use a smaller eval set than the final loss; on the same weights they differ.
    n["curve_last_vs_final"] = _curve_last_vs_final(check, float(hero["tokens"]))
    # The hero's loss through its stable phase (WSD: before the decay starts), 40% -> 80% of tokens.
    at = lambda frac: min(points, key=lambda p: abs(p["tokens"] - frac * float(hero["tokens"]))) if points else None
    p40, p80 = at(0.4), at(0.8)
    n["stable_from"] = f"{p40['actual']:.4f} at {p40['tokens']:.3g} tokens" if p40 else "n/a"
    n["stable_to"] = f"{p80['actual']:.4f} at {p80['tokens']:.3g} tokens" if p80 else "n/a"
    n["ladder_max_tokens"] = f"{table['tokens'].max():.3g}"
    sealed = "the corrected prediction" if _sealed_carry(final) else "the primary law"
    n["miss_side"] = (
        f"high side: {sealed} was too optimistic"
        if (check.get("rel_error") or 0) > 0
        else f"low side: {sealed} was too pessimistic"
    )
    n.update(_data_words(n, table, hero, check, vp, backtest, data_dir))
    n["stable_pred_to"] = f"{p80['predicted']:.4f}" if p80 else "n/a"
    n["backtest_table"] = _backtest_table(backtest)
    n["ladder_table"] = _ladder_table(table)
    n["trajectory_table"] = _trajectory_table(check)
    n["assumptions"] = "\n".join(f"- {a}" for a in prereg_doc.get("assumptions", []))
    n.update(_edition_numbers(data_dir, table, prereg_path, prereg_doc, hero, check, old_recipe))
    n["data_dir"] = shown_as if shown_as is not None else str(data_dir)
    return n


def _curve_last_vs_final(check: dict, tokens: float) -> str:
    """Each run's last curve point (the curve's eval set) against its final loss (the final set)."""
    points = check.get("points") or []
    finals = (
        [(s["seed"], s.get("actual_final_loss")) for s in check["seeds"]]
        if check.get("seeds")
        else [(None, check.get("actual_final_loss"))]
    )
    parts = []
    for seed, final_loss in finals:
        own = [p for p in points if p.get("seed") == seed]
        if not own or not final_loss or own[-1]["tokens"] < tokens:
            return "n/a"
        parts.append(
            ("" if seed is None else f"seed {seed}: ") + f"{own[-1]['actual']:.4f} on the curve's set against "
            f"{final_loss:.4f} on the final set ({final_loss / own[-1]['actual'] - 1:+.2%})"
        )
    return "; ".join(parts)


def _edition_numbers(
    data_dir: Path,
    table: pd.DataFrame,
    prereg_path: Path,
    prereg_doc: dict,
    hero: dict,
    check: dict,
    old_recipe: Path | None = None,
) -> dict[str, Any]:
    """What the third edition's text adds: the study's files, the anchor rungs, the gates, the
    rehearsal, rung health per cell, backtest coverage and the order of seal and hero."""
    from delphi.editions import resolve_data
    from delphi.fits.probes import correction_text

    pinned = json.loads((data_dir / "study.json").read_text())["study"]
    # primary_fit: auto is resolved by the study's fit stage (delphi.study.state.Study.primary_fit).
    primary = primary_fit_name(data_dir)
    out: dict[str, Any] = {
        "data_dir": str(data_dir),
        "study_name": pinned.get("name"),
        "ladder_file": pinned.get("ladder"),
        "prereg_file": f"preregistrations/{prereg_path.name}",
    }
    iso = isoflop_rows(table)
    anchors = table[table["role"].astype(str) == ANCHOR_ROLE] if "role" in table else table.iloc[0:0]
    out["n_isoflop_runs"] = len(iso)
    out["extrapolation_largest_run"] = f"{float(hero['compute']) / float(table['flops'].max()):.1f}"
    if len(anchors):
        widths = ", ".join(str(w) for w in sorted(anchors["d_model"].unique()))
        out["anchor_clause"] = (
            f", plus {len(anchors)} anchor runs (d_model {widths}) of {float(anchors['flops'].max()):.3g} FLOPs each, "
            f"trained {int(anchors['steps'].min()):,} to {int(anchors['steps'].max()):,} steps"
        )
        out["anchor_sentence"] = (
            f"**Anchor rungs.** {len(anchors)} runs of d_model {widths}, {count_words(int(anchors['n_layers'].min()))} layers, "
            f"{float(anchors['flops'].max()):.3g} FLOPs each ({float(anchors['flops'].max()) / float(iso['budget'].max()):.0f}x the top budget, "
            f"at its batch and seeds), {float(anchors['tokens_per_param'].min()):.0f} to {float(anchors['tokens_per_param'].max()):.0f} "
            f"tokens per parameter: runs far past their optimum, which identify the law's data term and carry the ladder's step "
            f"and tokens-per-parameter ranges to the hero's. They enter the (N, D) fits, not the isoFLOP parabolas or the laws in C."
        )
    else:
        out["anchor_clause"] = out["anchor_sentence"] = ""
    gates = prereg_doc.get("gates") or []
    failed = [g["name"] for g in gates if not g.get("passed")]
    forced = bool(prereg_doc.get("forced"))
    if not gates:
        out["gates_verdict"] = "were not evaluated (this preregistration predates them)"
    elif failed:
        out["gates_verdict"] = f"did not all pass ({', '.join(failed)} failed); the prediction was sealed with --force"
    else:
        out["gates_verdict"] = f"all passed ({len(gates)} gates), " + (
            "with --force given anyway" if forced else "without --force"
        )
    out["gates_table"] = _gates_table(gates)
    out["lobo"] = next((g["detail"] for g in gates if g["name"] == "lobo_spread"), "n/a")
    rehearsal = _stage(data_dir, "dress_rehearsal") if (data_dir / "stages" / "dress_rehearsal.json").is_file() else {}
    if rehearsal.get("actual") is not None:
        out["rehearsal_multiple"] = f"{float(rehearsal['multiple']):.0f}"
        out["rehearsal_sentence"] = (
            f"Before sealing, the study predicted and trained one run at {float(rehearsal['compute']):.3g} FLOPs "
            f"({float(rehearsal['multiple']):.0f}x the top budget): predicted {float(rehearsal['predicted']):.4f}, actual "
            f"{float(rehearsal['actual']):.4f}, {float(rehearsal['rel_error']):+.2%}, "
            f"{'inside' if rehearsal.get('covered_90') else 'outside'} its 90% interval {_interval(rehearsal.get('loss_interval_90'))}."
        )
    else:
        out["rehearsal_multiple"], out["rehearsal_sentence"] = "n/a", "No dress rehearsal was run."
    final = prereg_doc["prediction"]["final"]
    noise = {k: final.get(k) for k in ("residual_scatter_nats", "seed_noise_nats")}
    seed_noise = (
        "the seed noise at the top budget (the within-cell seed sd of its cells)"
        if final.get("noise_scope") == "top_budget"
        else "the pooled seed noise"
    )
    out["noise_sentence"] = (
        f"The law's residual scatter about the ladder's cells is {noise['residual_scatter_nats']:.4f} nats and {seed_noise} "
        f"{noise['seed_noise_nats']:.4f} nats; "
        + (
            f"the 90% interval is {final['interval']}."
            if int(final.get("n_seeds") or 1) > 1 and final.get("interval")
            else "the 90% interval is the fit's bootstrap interval widened in quadrature by one run's noise."
        )
        if None not in noise.values()
        else "The interval is the fit's bootstrap interval."
    )
    out["cross_check_sentence"] = _cross_check_sentence(
        data_dir, primary, prereg_doc, float(final["loss"]), check.get("actual_final_loss")
    )
    out["lr_sentence"] = _lr_sentence(data_dir / "lr_calibration.json", gates)
    out.update(
        _beyond_ladder_numbers(
            data_dir,
            primary,
            gates,
            float(iso["budget"].max()),
            float((pinned.get("gates") or {}).get("rehearsal_tolerance") or prereg_doc["decision"]["tolerance_rel"]),
            carry=_sealed_carry(final),
        )
    )
    # Under the law alone (hero.probe_correction: false, probes of its own): each run beyond the ladder
    # against its own seal, the old recipe's law alone beside it, and every law sealed beside the primary.
    rows = law_alone_runs(data_dir, prereg_path, float(iso["budget"].max()))
    old_rows = law_alone_at_runs(resolve_data(old_recipe)) if rows and old_recipe is not None else []
    out["law_alone_section"] = (
        (
            law_alone_section(rows, old_rows, None if old_recipe is None else str(old_recipe))
            + laws_section(rows, primary)
        )
        if rows
        else ""
    )
    out["runs_beyond_summary"] = runs_summary(rows)
    out["old_recipe_errors"] = (
        ", ".join(f"{r['rel_error']:+.2%} at {r['multiple']:.0f}x" for r in old_rows) if old_rows else NOT_AVAILABLE
    )
    out["forced_sentence"] = _forced_sentence(prereg_doc)
    out["health_table"] = _cell_table(table)
    out["coverage_table"] = _coverage_table(data_dir / "fits" / "backtest_all.json")
    out["timeline"] = _timeline(prereg_doc, data_dir / "hero")
    out.update(correction_text(final, check.get("actual_final_loss"), primary_law=LAW_NAMES.get(primary, primary)))
    return out


LAW_NAMES = {
    "isoflop": "the isoFLOP power law (Approach 2)",
    "vpnls": "VPNLS (the Chinchilla surface)",
    "parametric": "the parametric surface (Approach 3)",
    "frontier": "the compute frontier with E free",
}


def _probe_dirs(data_dir: Path) -> list[Path]:
    """The probes the study names (gates.probes, then its own hero.probe_multiples) that finished, as
    pinned in its data (`delphi.study.pin_probes`). A copy there that the study does not name, left
    by an earlier invocation, is not one of its probes (the seventh edition had one: probes/hero, a
    stale copy of hero60x, left out of its compact data)."""
    from delphi.study.spec import probe_names

    spec = _pinned_spec(data_dir)
    return [run for name in probe_names(spec) if ((run := data_dir / "probes" / name) / "summary.json").is_file()]


def _pinned_spec(data_dir: Path) -> Any:
    """The study's spec as its data pinned it (a `delphi.study.StudySpec`)."""
    from delphi.config_schema import from_dict
    from delphi.study.spec import StudySpec

    return from_dict(StudySpec, json.loads((data_dir / "study.json").read_text())["study"], f"{data_dir}/study.json")


def primary_fit_name(data_dir: Path) -> str:
    """The study's primary law: as pinned, or as its fit stage resolved `primary_fit: auto`
    (`delphi.study.state.Study.primary_fit`)."""
    pinned = json.loads((data_dir / "study.json").read_text())["study"]
    return _stage(data_dir, "fit")["primary_fit"] if pinned["primary_fit"] == "auto" else pinned["primary_fit"]


def _law_alone_study(spec: Any) -> bool:
    """A study that sealed its own probes with the ladder's law alone, like its hero (issue 29)."""
    return not spec.hero.probe_correction and bool(spec.hero.probe_multiples)


def law_alone_at_runs(data_dir: Path) -> list[dict]:
    """A finished study's runs beyond the ladder (its pinned probes, then the hero) against its
    primary law alone: the primary column of its table of runs beyond the ladder."""
    from delphi.fits import load_fit

    fit = load_fit(data_dir / "fits" / f"{primary_fit_name(data_dir)}.json")
    runs = _probe_dirs(data_dir) + ([data_dir / "hero"] if (data_dir / "hero" / "summary.json").is_file() else [])
    top_budget = float(isoflop_rows(pd.read_csv(data_dir / "results.csv"))["budget"].max())
    return law_alone_rows(fit, runs, top_budget)


def _probe_seal(data_dir: Path, prereg_path: Path, multiple: float) -> Path:
    """Where the study sealed its own probe at `multiple` (`delphi.study.stages.probe_prereg`): beside
    the hero's seal when the study names it (probe_preregistration), else in its probes/."""
    from delphi.study.spec import own_probe_name

    template = _pinned_spec(data_dir).probe_preregistration
    if template is None:
        return data_dir / "probes" / f"{own_probe_name(multiple)}.prereg.yaml"
    return prereg_path.parent / template.format(multiple=f"{multiple:g}")


def law_alone_runs(data_dir: Path, prereg_path: Path, top_budget: float) -> list[dict]:
    """A study of the law alone's sealed runs (its own probes, nearest first, then the hero), each
    against its own seal (`sealed_runs`: every seed, every competing law); empty for a study whose
    probes were evidence for the hero's seal."""
    from delphi.study.spec import own_probe_name

    spec = _pinned_spec(data_dir)
    if not _law_alone_study(spec):
        return []
    seals = [
        (own_probe_name(m), _probe_seal(data_dir, prereg_path, m), data_dir / "probes" / own_probe_name(m))
        for m in sorted(spec.hero.probe_multiples)
    ]
    return sealed_runs(seals + [("hero", prereg_path, data_dir / "hero")], top_budget)


def _forced_sentence(prereg_doc: dict) -> str:
    """The gates a seal forced, each with the reason sealed beside it (`gates.force`)."""
    forced = prereg_doc.get("forced_gates") or {}
    if not forced:
        return (
            "No gate was forced."
            if not prereg_doc.get("forced")
            else "The seal was forced (`--force`); no reason is recorded."
        )
    return " ".join(f'Gate `{name}` was forced, with its reason sealed: "{reason}"' for name, reason in forced.items())


LAW_ALONE_FIGURE = "law_alone_error.png"  # the figure of a study of the law alone (issue 40: the README's front figure)


def law_alone_figure(data_dir: Path, prereg_path: Path, old_recipe: Path | None, path: Path) -> list[str]:
    """Draw the edition's figure (`delphi.plot.figures.law_alone_error_figure`) into `path` (.png
    and .svg) for a study of the law alone with the old recipe's data beside it; nothing otherwise."""
    from delphi.editions import resolve_data
    from delphi.plot.figures import law_alone_error_figure
    from delphi.plot.style import save_figure

    top_budget = float(isoflop_rows(pd.read_csv(data_dir / "results.csv"))["budget"].max())
    rows = law_alone_runs(data_dir, prereg_path, top_budget)
    if not rows or old_recipe is None:
        return []
    old = law_alone_at_runs(resolve_data(old_recipe))
    return save_figure(law_alone_error_figure(old, [r for r in rows if r["status"] != NOT_SEALED]), str(path))


def old_recipe_data(shown: Path, paper_dir: Path) -> Path | None:
    """The old recipe's study (`OLD_RECIPE_EDITION`'s) as the text quotes it:
    among the editions beside the data's own edition, else under PAPER_DIR/editions; None where
    neither holds it."""
    from delphi.editions import edition_root

    roots = [root.parent] if (root := edition_root(shown)) is not None else []
    for editions_dir in [*roots, paper_dir / EDITIONS_DIR]:
        if (study := edition_data_or_none(editions_dir / OLD_RECIPE_EDITION)) is not None:
            return study
    return None


def _sealed_carry(final: dict) -> str | None:
    """How a corrected seal carried the probes' error (seals before `carry` was recorded: linear);
    None for a seal of the law alone."""
    correction = final.get("probe_correction")
    return correction.get("carry", "linear") if correction else None


def _beyond_ladder_numbers(
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
    from delphi.fits import load_fit
    from delphi.train.config import load_train_config

    probes = _probe_dirs(data_dir)
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
    spec = _pinned_spec(data_dir)
    own = (
        f"The study's own probes at {' and '.join(f'{m:g}x' for m in sorted(spec.hero.probe_multiples))} the top budget "
        "were sealed with the ladder's law alone, with the hero and before any of them trained: predictions like the "
        "hero's, not evidence for a correction."
        if _law_alone_study(spec)
        else ""
    )
    if gate is None:
        out["probes_sentence"] = own or "No probes beyond the ladder were given."
    else:  # the sealed record, beside the gate as the code stands today (a gate changed after an outcome shows as such)
        from delphi.prereg.gates import gate_probes
        from delphi.prereg.predict import run_predicted_vs_actual

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
            from delphi.fits.probes import probe_trend

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


def _lr_sentence(calibration_path: Path, gates: list[dict]) -> str:
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


def _cross_check_sentence(
    data_dir: Path, primary_fit: str, prereg_doc: dict, predicted: float, actual: float | None
) -> str:
    """The cross-check laws refitted on the ladder and gate method_agreement as the code stands
    today, beside the sealed record: a gate changed after an outcome is shown as such."""
    from delphi.fits import load_fit
    from delphi.prereg import gates as gt
    from delphi.prereg.create import cross_check_predictions
    from delphi.prereg.predict import fit_convention, load_tables
    from delphi.train.config import load_train_config

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
        _probe_dirs(data_dir),
        noise_scope=prereg_doc["prediction"]["final"].get("noise_scope", "pooled"),
    )
    tolerance = float(prereg_doc["decision"]["tolerance_rel"])
    now = gt.gate_method_agreement(predicted, checks, tolerance)
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


def _gates_table(gates: list[dict]) -> str:
    if not gates:
        return "(no gates recorded)"
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  thresholds quote |error|
    rows = ["| gate | passed | value | threshold | detail |", "|---|---|---|---|---|"]
    for g in gates:
        value = g.get("value")
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        rows.append(
            f"| {g['name']} | {'yes' if g.get('passed') else '**no**'} | {cell(shown)} | {cell(g.get('threshold', ''))} "
            f"| {cell(g.get('detail', ''))} |"
        )
    return "\n".join(rows)


def _cell_table(table: pd.DataFrame) -> str:
    """One row per cell (a shape at a budget, its seeds pooled): size, horizon and health."""
    if "cell_id" not in table:
        return "(the results table has no cells: one seed per rung, no health columns)"
    rows = [
        "| cell | role | budget | d_model | layers | seeds | steps | tokens/param | evals | max dropped share | loss (mean +- sd) | healthy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, g in table.sort_values(["budget", "params"]).groupby("cell_id", sort=False):
        r = g.iloc[0]
        sd = f"{g['loss'].std(ddof=1):.4f}" if len(g) > 1 else "n/a"
        rows.append(
            f"| {cell} | {r.get('role', 'isoflop')} | {r['budget']:.3g} | {int(r['d_model'])} | {int(r['n_layers'])} | {len(g)} "
            f"| {int(r['steps']):,} | {float(r['tokens_per_param']):.0f} | {int(g['n_evals'].min())} "
            f"| {float(g['drop_frac_mean'].max()):.2%} | {g['loss'].mean():.4f} +- {sd} | {'yes' if g['health_ok'].all() else '**no**'} |"
        )
    return "\n".join(rows)


def _coverage_table(path: Path) -> str:
    """Every held-out budget the ladder allows (`delphi fit backtest --all`), per method."""
    if not path.is_file():
        return "(no all-holdouts backtest in the data)"
    summary = json.loads(path.read_text())["summary"]
    rows = ["| method | held-out points | mean abs error | 90% coverage |", "|---|---|---|---|"]
    for method, s in summary.items():
        coverage = f"{s['coverage_90']:.0%}" if s.get("coverage_90") is not None else "n/a"
        rows.append(f"| {method} | {s['n']} | {s['mean_abs_rel_error']:.2%} | {coverage} |")
    return "\n".join(rows)


def _timeline(prereg_doc: dict, hero_dir: Path) -> str:
    """When the prediction was sealed against when the hero logged its first and last step."""
    from datetime import datetime

    from delphi.train.rundir import read_metrics

    records = [r for r in read_metrics(hero_dir) if r.get("time") is not None] if hero_dir.is_dir() else []
    if not records:
        return f"Sealed at {prereg_doc.get('created')}."
    stamp = lambda t: datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    started = records[0]["time"] - records[0].get("wall_s", 0.0)
    return (
        f"Sealed at {prereg_doc.get('created')}; the hero started at {stamp(started)} and logged its last step at "
        f"{stamp(records[-1]['time'])}."
    )


def _evals_per_run(table: pd.DataFrame, data_dir: Path) -> list[int]:
    """Eval points each ladder run logged: the results table's n_evals, else its metrics.jsonl."""
    if "n_evals" in table and table["n_evals"].notna().all():
        return [int(v) for v in table["n_evals"]]
    from delphi.train.rundir import METRICS_FILE, read_metrics

    counts = []
    for metrics in sorted((data_dir / "ladder").glob(f"runs/*/{METRICS_FILE}")):
        counts.append(sum(1 for r in read_metrics(metrics.parent) if r.get("val_loss") is not None))
    return counts


def _data_words(
    n: dict, table: pd.DataFrame, hero: dict, check: dict, vp: dict, backtest: dict, data_dir: Path
) -> dict[str, Any]:
    """Every verdict, adjective and count of the prose that depends on the data (issue 10: the
    template types none of them)."""
    out: dict[str, Any] = {}
    experts, top_k = int(hero.get("experts") or 0), int(hero.get("top_k") or 0)
    moe = experts > 1
    out["model_short"] = "MoE" if moe else "dense"
    out["model_desc"] = (
        f"Mixture-of-Experts language models ({experts} experts, top-{top_k}" if moe else "dense language models ("
    ) + ", byte-level)"
    out["ffn_desc"] = (
        f"MoE feed-forward with {experts} experts, top-{top_k}, aux-loss-free bias balancing"
        if moe
        else "dense feed-forward"
    )
    flops_error = (table["flops"] / table["budget"] - 1).abs().max()
    out["budget_match"] = f"{flops_error:.2%}"
    failed = check.get("verdict") != "passed"
    out["outcome_heading"] = "Why the prediction missed the tolerance" if failed else "Why the prediction held"
    rel = check.get("rel_error")
    tol = check.get("tolerance_rel")
    out["tolerance_side"] = "n/a" if rel is None or tol is None else ("outside" if abs(rel) > tol else "inside")
    # The asymptote.
    diag = vp.get("diagnostics") or {}
    at_bound = "E" in (diag.get("at_bound") or [])
    e_value = n["vpnls_E"]
    span, n_budgets = n["budget_span"], count_words(n["n_budgets"]).capitalize()
    if at_bound:
        out["E_sentence"] = (
            f"**The asymptote is not identified.** The VPNLS fit put E on its lower bound (E = {e_value}; "
            f"90% bootstrap interval {n['vpnls_E_90']}). A law with E = 0 keeps falling as a pure power law, so "
            f"extrapolating {n['extrapolation']}x in compute under-predicts the loss if the true E is positive. "
            f"{n_budgets} budgets spanning {span}x did not pin E."
        )
    else:
        out["E_sentence"] = (
            f"**The asymptote.** The VPNLS fit placed E = {e_value} inside its bounds "
            f"(90% bootstrap interval {n['vpnls_E_90']})."
        )
    # Tokens per parameter.
    hero_tpp = float(hero["tokens"]) / float(hero["params"])
    tpp_max = float((table["tokens"] / table["params"]).max())
    same_width = table[table["d_model"] == hero.get("d_model")] if "d_model" in table else table.iloc[0:0]
    # Beyond the ladder where it matters: at the hero's own width when the ladder trained it, else anywhere.
    beyond = hero_tpp > (float((same_width["tokens"] / same_width["params"]).max()) if len(same_width) else tpp_max)
    out["tpp_heading"] = (
        "The hero extrapolates in tokens per parameter, not only in compute."
        if beyond
        else "The hero stays inside the ladder's tokens per parameter."
    )
    # Evaluations and seeds.
    evals = _evals_per_run(table, data_dir)
    out["ladder_evals"] = (
        f"{count_words(min(evals))} evaluations per run"
        if evals and min(evals) == max(evals)
        else (
            f"{min(evals)} to {max(evals)} evaluations per run" if evals else "an unknown number of evaluations per run"
        )
    )
    keys = ["cell_id"] if "cell_id" in table else [c for c in ("budget", "params") if c in table]
    seeds = table.groupby(keys).size() if keys else pd.Series([1])
    out["seeds_desc"] = (
        f"{count_words(int(seeds.min()))} seed{'s' if seeds.min() > 1 else ''} per rung"
        if seeds.min() == seeds.max()
        else f"{int(seeds.min())} to {int(seeds.max())} seeds per rung"
    )
    noise = diag.get("seed_noise_nats")
    if noise is not None and check.get("actual_final_loss"):
        out["seed_sentence"] = (
            f"**Seed noise** was measured from {out['seeds_desc']}: a pooled within-cell standard deviation of "
            f"{float(noise):.3g} nats, {float(noise) / check['actual_final_loss']:.1%} of the hero's final loss."
        )
    else:
        out["seed_sentence"] = f"**Seed noise** was not measured ({out['seeds_desc']})."
    out["seed_noise_text"] = (
        "seed noise not measured" if noise is None else f"measured seed noise {float(noise):.3g} nats"
    )
    # What to change: one item per weakness the data show.
    advice = []
    if at_bound:
        advice.append(
            "more budgets (or a wider span, or small models trained far past their optimum) so that E is identified"
        )
    if beyond:
        advice.append("ladder rungs at the hero's width with long token horizons")
    if evals and min(evals) < 10:
        advice.append("more evaluations per rung")
    if seeds.min() < 2:
        advice.append("two or three seeds at each budget")
    out["next_time"] = ("What to change next time: " + "; ".join(advice) + ".") if advice else ""
    # Limitations that depend on the ladder.
    batch = table.groupby("budget")["batch_tokens"].nunique() if "batch_tokens" in table else None
    if batch is not None and (batch == 1).all() and table["batch_tokens"].nunique() > 1:
        out["batch_sentence"] = "Batch size is held fixed within a budget but differs between budgets."
    elif batch is not None and table["batch_tokens"].nunique() == 1:
        out["batch_sentence"] = "Batch size is the same in every rung."
    else:
        out["batch_sentence"] = "Batch size varies within budgets."
    out["max_rung_params"] = f"{float(table['params'].max()):.3g}"
    return out


def _read_prereg(path: Path) -> dict:
    from delphi import prereg_format as fmt

    return fmt.read(path)


def _interval(pair: Any) -> str:
    if not pair or pair[0] is None:
        return "n/a"
    return f"[{float(pair[0]):.4g}, {float(pair[1]):.4g}]"


def _backtest_table(backtest: dict) -> str:
    rows = [
        "| method | held-out budget | predicted best loss | observed best loss | relative error | 90% interval covered |",
        "|---|---|---|---|---|---|",
    ]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            rows.append(
                f"| {method} | {b['budget']:.3g} | {b['predicted_loss']:.4f} | {b['observed_best_loss']:.4f} "
                f"| {b['rel_error']:+.2%} | {b.get('covered_90')} |"
            )
    return "\n".join(rows)


def _ladder_table(table: pd.DataFrame) -> str:
    cols = ["run_id", "budget", "d_model", "n_layers", "params", "tokens", "loss"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.sort_values(["budget", "params"]).iterrows():
        cells = [
            str(r["run_id"]),
            f"{r['budget']:.3g}",
            str(int(r["d_model"])),
            str(int(r["n_layers"])),
            f"{int(r['params']):,}",
            f"{int(r['tokens']):,}",
            f"{r['loss']:.4f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _trajectory_table(check: dict) -> str:
    points = check.get("points") or []
    if not points:
        return "(no eval points)"
    seeded = any("seed" in p for p in points)  # a multi-seed seal: each seed's curve in turn
    rows = [
        "| " + ("seed | " if seeded else "") + "tokens | predicted | 90% band | actual | relative error |",
        "|---|" + ("---|" if seeded else "") + "---|---|---|---|",
    ]
    for p in points:
        rows.append(
            "| " + (f"{p.get('seed')} | " if seeded else "") + f"{p['tokens']:.3g} | {p['predicted']:.4f} "
            f"| [{p['lo90']:.4f}, {p['hi90']:.4f}] | {p['actual']:.4f} | {p['rel_error']:+.2%} |"
        )
    return "\n".join(rows)


def build_paper(
    paper_dir: str | Path = "paper",
    from_study: str | Path | None = None,
    data_dir: str | Path | None = None,
    *,
    svg: bool = True,
) -> dict:
    """Import a study's data if asked, redraw every figure, and render paper.md from template.md.
    The data are `data_dir` (a finished study's copy: a compact edition's study, e.g.
    paper/editions/v3/study, or a plain directory), else PAPER_DIR/data, else the newest edition's
    study. The text quotes the data's path as given."""
    from delphi.editions import resolve_data
    from delphi.study.report import stage_figures

    paper_dir = Path(paper_dir)
    if from_study is not None and data_dir is not None:
        raise DelphiError("paper build: give --from-study (import into PAPER_DIR/data) or --data, not both")
    template = paper_dir / "template.md"
    if not template.is_file():
        raise DelphiError(f"{template}: paper template not found")
    if (
        data_dir is None
        and from_study is None
        and not (paper_dir / "data").exists()
        and (current := current_edition(paper_dir))
    ):
        data_dir = edition_data(current)
    shown, figures_dir = Path(data_dir) if data_dir is not None else paper_dir / "data", paper_dir / "figures"
    imported = import_study(Path(from_study), shown) if from_study is not None else []
    data_dir = resolve_data(shown)
    if not (data_dir / "study.json").is_file():
        raise DelphiError(f"{shown}: no study data (no study.json); give --data STUDY_COPY or --from-study STUDY_DIR")
    study = _study_view(data_dir, figures_dir)
    old_recipe = old_recipe_data(shown, paper_dir)
    figures = stage_figures(study)["files"]
    figures += [
        f
        for f in law_alone_figure(data_dir, prereg_file(data_dir), old_recipe, figures_dir / LAW_ALONE_FIGURE)
        if f.endswith(".png")
    ]
    if not svg:
        for png in figures:
            Path(png).with_suffix(".svg").unlink(missing_ok=True)
    numbers = paper_numbers(data_dir, shown_as=str(shown), old_recipe=old_recipe)
    try:
        text = string.Template(template.read_text()).substitute(numbers)
    except KeyError as e:
        raise DelphiError(
            f"{template}: placeholder ${e.args[0]} has no value (known: {', '.join(sorted(numbers))})"
        ) from None
    atomic_write_text(paper_dir / "paper.md", text)
    return {
        "paper": str(paper_dir / "paper.md"),
        "data": str(shown),
        "figures": figures,
        "imported_files": len(imported),
    }


# ---- editions: paper/editions/vN -----------------------------------------------------------------

STUDY_DIRS = ("data", "study")  # where an edition keeps the study its text is rendered from (v1: data)


def current_edition(paper_root: str | Path = "paper") -> Path | None:
    """The newest edition: its data are the current paper's (PAPER_ROOT/paper.md), its text is not in it."""
    found = editions(paper_root)
    return found[-1] if found else None


def edition_data(edition: Path) -> Path:
    """The study an edition's text is rendered from (EDITION/data or EDITION/study)."""
    for name in STUDY_DIRS:
        if (edition / name / "study.json").is_file():
            return edition / name
    raise DelphiError(f"{edition}: no study data (no data/study.json or study/study.json)")


def edition_data_or_none(edition: Path) -> Path | None:
    """`edition_data`, or None where the edition holds no study."""
    try:
        return edition_data(edition)
    except DelphiError:
        return None


def built_editions(paper_root: str | Path = "paper") -> dict[str, tuple[Path, Path]]:
    """The editions `paper build` renders, by name: (paper dir, data dir). An earlier edition is
    rendered when it has a template.md; the current one renders into PAPER_ROOT. Editions written by
    hand (v2, v4: a README) are kept as text only."""
    paper_root = Path(paper_root)
    out = {e.name: (e, edition_data(e)) for e in editions(paper_root) if (e / "template.md").is_file()}
    if (current := current_edition(paper_root)) is not None and (paper_root / "template.md").is_file():
        out[current.name] = (paper_root, edition_data(current))
    return out


def build_edition(name: str, paper_root: str | Path = "paper") -> dict:
    """Render one edition (`--edition vN`) from its compact data."""
    known = built_editions(paper_root)
    if name not in known:
        raise DelphiError(
            f"--edition {name}: not an edition `delphi paper build` renders (known: {', '.join(known) or 'none'}; "
            "an edition without a template.md is kept as written)"
        )
    paper_dir, data = known[name]
    current = paper_dir == Path(paper_root)
    return build_paper(paper_dir, data_dir=data, svg=current) | {"edition": name, "current": current}


def snapshot(study_dir: str | Path, dest: str | Path, *, resumable: bool = False) -> dict:
    """Write a study's compact data (`delphi.study.compact_files`) into `dest` in the editions' form:
    plain small files, curves.csv.gz and files.csv.gz, no directory per run. `delphi paper unpack`
    gives the study directory back (to continue it elsewhere: unpack, then rerun the same study)."""
    import tempfile

    from delphi.editions import pack
    from delphi.study.snapshot import export_study

    with tempfile.TemporaryDirectory() as tmp:
        copied = export_study(study_dir, Path(tmp) / "study", resumable=resumable)
        packed = pack(Path(tmp) / "study", dest)
    runs = sorted({p.split("/")[2] for p in copied if p.startswith("ladder/runs/")})
    return {"files": len(copied), "ladder_runs": runs, "to": str(dest), "compact": packed}


def verify_editions(paper_root: str | Path = "paper", preregistrations: str | Path = "preregistrations") -> list[dict]:
    """Each sealed preregistration against the editions: its seal (`prereg verify`: as first
    committed), the editions whose compact data hold every file it hashed (fit, hero config,
    manifest, results table, probe summaries), and `prereg verify --run` on its hero as unpacked
    from the first such edition. A preregistration that cannot be verified (a run whose records
    disagree) is a problem of its row, not the end of the command."""
    from delphi import prereg_format as fmt
    from delphi.editions import check_provenance, edition_trees, hero_runs
    from delphi.prereg.check import read_outcome
    from delphi.prereg.verify import verify

    if not Path(paper_root).is_dir():
        raise DelphiError(f"--paper-root {paper_root}: not a directory; nothing to verify against")
    if not Path(preregistrations).is_dir():
        raise DelphiError(f"--preregistrations {preregistrations}: not a directory; nothing to verify")
    files = sorted(Path(preregistrations).glob("*.yaml"))
    if not files:
        raise DelphiError(
            f"--preregistrations {preregistrations}: holds no preregistration (*.yaml); nothing to verify"
        )
    trees = edition_trees(paper_root)
    out = []
    for path in files:
        doc = fmt.read(path)
        plain = _verified(path, verify)
        holding = {name: check_provenance(doc, tree) for name, tree in trees.items()}
        complete = [name for name, c in holding.items() if c["checked"] and not c["missing"]]
        # A seal whose run has not finished (no outcome yet) waits for its edition; it is not a failure.
        row = {
            "file": str(path),
            "seal_ok": plain["seal_ok"],
            "hashes": next(iter(holding.values()))["checked"] if holding else 0,
            "editions_holding_all": complete,
            "run": None,
            "run_ok": None,
            "pending": read_outcome(path) is None,
            "problems": plain["problems"],
            "warnings": plain.get("warnings", []),
            "first_commit": plain.get("first_commit"),
        }
        found = hero_runs(doc, {name: trees[name] for name in complete})
        if found is not None:
            name, run, runs = found
            checked = _verified(path, verify, runs)
            where = name if name.startswith(f"{NEXT_DIR}/") else f"{EDITIONS_DIR}/{name}"
            row["run"] = f"{where}/{run.relative_to(trees[name]).as_posix()}"
            row["run_ok"] = checked["ok"] and checked.get("created_before_start") is True
            row["problems"] = checked["problems"]
            row["warnings"] = checked.get("warnings", [])
        out.append(row)
    return out


def _verified(path: Path, verify, runs: list[Path] | None = None) -> dict:
    """`prereg verify` of one file (with its runs); a check it cannot make (CheckFailed: a run whose
    summary disagrees with its metrics log) is the row's problem."""
    from delphi.errors import CheckFailed

    try:
        return verify(path, run_dirs=runs)
    except CheckFailed as e:
        return {"seal_ok": None, "ok": False, "problems": [str(e)], "created_before_start": None}
