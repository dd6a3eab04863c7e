"""Every number and data-dependent phrase the paper's text quotes, computed from a study's data
files: `paper_numbers` fills the template's placeholders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.editions import resolve_data
from delphi.fits.data import ANCHOR_ROLE, isoflop_rows
from delphi.fits.probes import correction_text
from delphi.paper.beyond import NOT_AVAILABLE, count_words, law_alone_section, laws_section, runs_summary
from delphi.paper.law_alone import law_alone_at_runs, law_alone_runs
from delphi.paper.seal_text import (
    beyond_ladder_numbers,
    cross_check_sentence,
    forced_sentence,
    lr_sentence,
    timeline,
)
from delphi.paper.study_data import (
    LAW_NAMES,
    UNCHECKED,
    check_stage,
    evals_per_run,
    prereg_file,
    primary_fit_name,
    sealed_carry,
    stage_result,
)
from delphi.paper.tables import (
    backtest_table,
    cell_table,
    coverage_table,
    gates_table,
    interval_text,
    ladder_table,
    trajectory_table,
)
from delphi.prereg_format import read


def paper_numbers(data_dir: Path, shown_as: str | None = None, old_recipe: Path | None = None) -> dict[str, Any]:
    """Every number the text quotes, computed from the data files; `shown_as` is the data's path
    as the text quotes it (default: `data_dir`). `old_recipe` (a study's data, as the text quotes
    it) is set beside a study of the law alone run by run (`law_alone_section`)."""
    check, hero, plan = check_stage(data_dir), stage_result(data_dir, "hero"), stage_result(data_dir, "plan")
    fits = {
        m: json.loads(p.read_text())
        for m in ("isoflop", "parametric", "vpnls", "frontier")
        if (p := data_dir / "fits" / f"{m}.json").is_file()
    }
    backtest = json.loads((data_dir / "fits" / "backtest.json").read_text())
    prereg_path = prereg_file(data_dir)
    prereg_doc = read(prereg_path)
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
        "pred_50": interval_text(final.get("loss_50")),
        "pred_90": interval_text(final.get("loss_90")),
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
        n[f"vpnls_{key}_90"] = interval_text((vp.get("intervals") or {}).get(key))
    derived = vp.get("derived", {})
    n["vpnls_a"] = f"{derived['a']:.3f}" if "a" in derived else "n/a"
    n["iso_a"] = f"{iso['params']['a']:.3f}" if "a" in iso.get("params", {}) else "n/a"
    n["iso_a_90"] = interval_text((iso.get("intervals") or {}).get("a"))
    n["iso_b"] = f"{iso['params']['b']:.3f}" if "b" in iso.get("params", {}) else "n/a"
    n["iso_loss_exponent"] = (
        f"{iso['params']['loss_exponent']:.4f}" if "loss_exponent" in iso.get("params", {}) else "n/a"
    )
    n["vpnls_E_at_bound"] = "yes" if "E" in (vp.get("diagnostics") or {}).get("at_bound", []) else "no"
    frontier = fits.get("frontier", {})
    sens = frontier.get("sensitivity") or {}
    if sens.get("predicted_loss"):
        n["frontier_pred"] = f"{sens['predicted_loss'][0]:.4f}"
        n["frontier_pred_range"] = interval_text(sens["predicted_loss_range_over_E_interval"][0])
        n["frontier_E_90"] = interval_text(sens.get("E_interval_profile_90"))
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
    n["curve_last_vs_final"] = curve_last_vs_final(check, float(hero["tokens"]))
    # The hero's loss through its stable phase (WSD: before the decay starts), 40% -> 80% of tokens.
    at = lambda frac: min(points, key=lambda p: abs(p["tokens"] - frac * float(hero["tokens"]))) if points else None
    p40, p80 = at(0.4), at(0.8)
    n["stable_from"] = f"{p40['actual']:.4f} at {p40['tokens']:.3g} tokens" if p40 else "n/a"
    n["stable_to"] = f"{p80['actual']:.4f} at {p80['tokens']:.3g} tokens" if p80 else "n/a"
    n["ladder_max_tokens"] = f"{table['tokens'].max():.3g}"
    sealed = "the corrected prediction" if sealed_carry(final) else "the primary law"
    n["miss_side"] = (
        f"high side: {sealed} was too optimistic"
        if (check.get("rel_error") or 0) > 0
        else f"low side: {sealed} was too pessimistic"
    )
    n.update(data_words(n, table, hero, check, vp, backtest, data_dir))
    n["stable_pred_to"] = f"{p80['predicted']:.4f}" if p80 else "n/a"
    n["backtest_table"] = backtest_table(backtest)
    n["ladder_table"] = ladder_table(table)
    n["trajectory_table"] = trajectory_table(check)
    n["assumptions"] = "\n".join(f"- {a}" for a in prereg_doc.get("assumptions", []))
    n.update(edition_numbers(data_dir, table, prereg_path, prereg_doc, hero, check, old_recipe))
    n["data_dir"] = shown_as if shown_as is not None else str(data_dir)
    return n


def curve_last_vs_final(check: dict, tokens: float) -> str:
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


def edition_numbers(
    data_dir: Path,
    table: pd.DataFrame,
    prereg_path: Path,
    prereg_doc: dict,
    hero: dict,
    check: dict,
    old_recipe: Path | None = None,
) -> dict[str, Any]:
    """The numbers of the text's study sections: the study's files, the anchor rungs, the gates, the
    rehearsal, rung health per cell, backtest coverage and the order of seal and hero."""
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
    out["gates_table"] = gates_table(gates)
    out["lobo"] = next((g["detail"] for g in gates if g["name"] == "lobo_spread"), "n/a")
    rehearsal = (
        stage_result(data_dir, "dress_rehearsal") if (data_dir / "stages" / "dress_rehearsal.json").is_file() else {}
    )
    if rehearsal.get("actual") is not None:
        out["rehearsal_multiple"] = f"{float(rehearsal['multiple']):.0f}"
        out["rehearsal_sentence"] = (
            f"Before sealing, the study predicted and trained one run at {float(rehearsal['compute']):.3g} FLOPs "
            f"({float(rehearsal['multiple']):.0f}x the top budget): predicted {float(rehearsal['predicted']):.4f}, actual "
            f"{float(rehearsal['actual']):.4f}, {float(rehearsal['rel_error']):+.2%}, "
            f"{'inside' if rehearsal.get('covered_90') else 'outside'} its 90% interval {interval_text(rehearsal.get('loss_interval_90'))}."
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
    out["cross_check_sentence"] = cross_check_sentence(
        data_dir, primary, prereg_doc, float(final["loss"]), check.get("actual_final_loss")
    )
    out["lr_sentence"] = lr_sentence(data_dir / "lr_calibration.json", gates)
    out.update(
        beyond_ladder_numbers(
            data_dir,
            primary,
            gates,
            float(iso["budget"].max()),
            float((pinned.get("gates") or {}).get("rehearsal_tolerance") or prereg_doc["decision"]["tolerance_rel"]),
            carry=sealed_carry(final),
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
    out["forced_sentence"] = forced_sentence(prereg_doc)
    out["health_table"] = cell_table(table)
    out["coverage_table"] = coverage_table(data_dir / "fits" / "backtest_all.json")
    out["timeline"] = timeline(prereg_doc, data_dir / "hero")
    out.update(correction_text(final, check.get("actual_final_loss"), primary_law=LAW_NAMES.get(primary, primary)))
    return out


def data_words(
    n: dict, table: pd.DataFrame, hero: dict, check: dict, vp: dict, backtest: dict, data_dir: Path
) -> dict[str, Any]:
    """Every verdict, adjective and count of the prose that depends on the data (the template
    types none of them)."""
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
    evals = evals_per_run(table, data_dir)
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
