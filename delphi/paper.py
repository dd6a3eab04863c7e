"""`delphi paper build`: regenerate the paper's figures and numbers from its data files.

The paper (paper/paper.md) is rendered from paper/template.md. Every number in
the text is a `{placeholder}` filled from the compact study data kept in
paper/data/ (results table, fits, backtests, the hero's metrics, the
preregistration), so nothing in the prose is typed by hand and nothing needs
training to rebuild.

    delphi paper build --from-study runs/paper   # import a finished study's data, then build
    delphi paper build                           # rebuild from paper/data alone
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

import pandas as pd

from delphi.errors import DelphiError
from delphi.io import atomic_write_text

def import_study(study_dir: Path, data_dir: Path) -> list[str]:
    """Copy a finished study's compact data (no checkpoints, no logs) into `data_dir`."""
    if not (study_dir / "stages" / "report.json").is_file():
        raise DelphiError(f"--from-study: {study_dir} is not a finished study (no stages/report.json)")
    from delphi.study import compact_files

    copied = []
    for rel in compact_files(study_dir):
        if rel.parts[0] == "figures" or rel.name == "report.md":
            continue
        path, target = study_dir / rel, data_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied.append(str(rel))
    prereg = Path(json.loads((study_dir / "stages" / "prereg.json").read_text())["result"]["prereg"])
    if prereg.parent != study_dir:  # sealed outside the study dir (the project's own study)
        shutil.copy2(prereg, data_dir / "preregistration.yaml")
        copied.append(f"preregistration.yaml (from {prereg})")
    return copied


def _study_view(data_dir: Path, figures_dir: Path):
    """A `Study` whose paths point into the paper's data (and figures) directory."""
    from delphi.study import Study, StudySpec
    from delphi.config_schema import from_dict

    pinned = json.loads((data_dir / "study.json").read_text())
    spec = from_dict(StudySpec, pinned["study"], "paper/data/study.json")
    study = Study(data_dir, spec, data_dir / "ladder" / "ladder.yaml")
    study.figures = figures_dir
    return study


def paper_numbers(data_dir: Path) -> dict[str, Any]:
    """Every number the text quotes, computed from the data files."""
    stage = lambda name: json.loads((data_dir / "stages" / f"{name}.json").read_text())["result"]
    check, hero, plan = stage("check"), stage("hero"), stage("plan")
    fits = {m: json.loads(p.read_text()) for m in ("isoflop", "parametric", "vpnls", "frontier")
            if (p := data_dir / "fits" / f"{m}.json").is_file()}
    backtest = json.loads((data_dir / "fits" / "backtest.json").read_text())
    prereg_doc = _read_prereg(data_dir / "preregistration.yaml")
    final = prereg_doc["prediction"]["final"]
    table = pd.read_csv(data_dir / "results.csv")
    budgets = sorted(table["budget"].unique())
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
        "verdict": check.get("verdict"),
        "tolerance": f"{check['tolerance_rel']:.0%}",
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
    n["ladder_tpp_at_hero_width"] = (f"{(same_width['tokens'] / same_width['params']).max():.0f}"
                                     if len(same_width) else "n/a (no ladder run at the hero's width)")
    n["ladder_tpp_max"] = f"{(table['tokens'] / table['params']).max():.0f}"
    points = check.get("points") or []
    worst = max(points, key=lambda p: abs(p["rel_error"])) if points else None
    n["traj_worst"] = f"{worst['rel_error']:+.2%} at {worst['tokens']:.3g} tokens" if worst else "n/a"
    n["traj_outside_90"] = f"{check.get('n_outside_90', 0)} of {check.get('n_points', 0)}"
    # The hero's loss through its stable phase (WSD: before the decay starts), 40% -> 80% of tokens.
    at = lambda frac: min(points, key=lambda p: abs(p["tokens"] - frac * float(hero["tokens"]))) if points else None
    p40, p80 = at(0.4), at(0.8)
    n["stable_from"] = f"{p40['actual']:.4f} at {p40['tokens']:.3g} tokens" if p40 else "n/a"
    n["stable_to"] = f"{p80['actual']:.4f} at {p80['tokens']:.3g} tokens" if p80 else "n/a"
    n["ladder_max_tokens"] = f"{table['tokens'].max():.3g}"
    n["miss_side"] = ("high side: the laws were too optimistic" if (check.get("rel_error") or 0) > 0
                      else "low side: the laws were too pessimistic")
    n.update(_data_words(n, table, hero, check, vp, backtest, data_dir))
    n["stable_pred_to"] = f"{p80['predicted']:.4f}" if p80 else "n/a"
    n["backtest_table"] = _backtest_table(backtest)
    n["ladder_table"] = _ladder_table(table)
    n["trajectory_table"] = _trajectory_table(check)
    n["assumptions"] = "\n".join(f"- {a}" for a in prereg_doc.get("assumptions", []))
    return n


def _count_words(k: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}.get(k, str(k))


def _evals_per_run(table: pd.DataFrame, data_dir: Path) -> list[int]:
    """Eval points each ladder run logged: the results table's n_evals, else its metrics.jsonl."""
    if "n_evals" in table and table["n_evals"].notna().all():
        return [int(v) for v in table["n_evals"]]
    from delphi.train.rundir import METRICS_FILE, read_metrics

    counts = []
    for metrics in sorted((data_dir / "ladder").glob(f"runs/*/{METRICS_FILE}")):
        counts.append(sum(1 for r in read_metrics(metrics.parent) if r.get("val_loss") is not None))
    return counts


def _data_words(n: dict, table: pd.DataFrame, hero: dict, check: dict, vp: dict, backtest: dict, data_dir: Path) -> dict[str, Any]:
    """Every verdict, adjective and count of the prose that depends on the data (issue 10: the
    template types none of them)."""
    out: dict[str, Any] = {}
    experts, top_k = int(hero.get("experts") or 0), int(hero.get("top_k") or 0)
    moe = experts > 1
    out["model_short"] = "MoE" if moe else "dense"
    out["model_desc"] = (f"Mixture-of-Experts language models ({experts} experts, top-{top_k}" if moe else "dense language models (") +         ", byte-level)"
    out["ffn_desc"] = (f"MoE feed-forward with {experts} experts, top-{top_k}, aux-loss-free bias balancing" if moe
                       else "dense feed-forward")
    flops_error = (table["flops"] / table["budget"] - 1).abs().max()
    out["budget_match"] = f"{flops_error:.2%}"
    failed = check.get("verdict") != "passed"
    out["outcome_heading"] = "Why the prediction missed the tolerance" if failed else "Why the prediction held"
    rel = check.get("rel_error")
    tol = check.get("tolerance_rel")
    out["tolerance_side"] = ("n/a" if rel is None or tol is None else ("outside" if abs(rel) > tol else "inside"))
    # The asymptote.
    diag = vp.get("diagnostics") or {}
    at_bound = "E" in (diag.get("at_bound") or [])
    e_value = n["vpnls_E"]
    span, n_budgets = n["budget_span"], _count_words(n["n_budgets"]).capitalize()
    if at_bound:
        out["E_sentence"] = (f"**The asymptote is not identified.** The VPNLS fit put E on its lower bound (E = {e_value}; "
                             f"90% bootstrap interval {n['vpnls_E_90']}). A law with E = 0 keeps falling as a pure power law, so "
                             f"extrapolating {n['extrapolation']}x in compute under-predicts the loss if the true E is positive. "
                             f"{n_budgets} budgets spanning {span}x did not pin E.")
    else:
        out["E_sentence"] = (f"**The asymptote.** The VPNLS fit placed E = {e_value} inside its bounds "
                             f"(90% bootstrap interval {n['vpnls_E_90']}).")
    # Tokens per parameter.
    hero_tpp = float(hero["tokens"]) / float(hero["params"])
    tpp_max = float((table["tokens"] / table["params"]).max())
    same_width = table[table["d_model"] == hero.get("d_model")] if "d_model" in table else table.iloc[0:0]
    # Beyond the ladder where it matters: at the hero's own width when the ladder trained it, else anywhere.
    beyond = hero_tpp > (float((same_width["tokens"] / same_width["params"]).max()) if len(same_width) else tpp_max)
    out["tpp_heading"] = ("The hero extrapolates in tokens per parameter, not only in compute." if beyond else
                          "The hero stays inside the ladder's tokens per parameter.")
    # Evaluations and seeds.
    evals = _evals_per_run(table, data_dir)
    out["ladder_evals"] = (f"{_count_words(min(evals))} evaluations per run" if evals and min(evals) == max(evals)
                           else (f"{min(evals)} to {max(evals)} evaluations per run" if evals else "an unknown number of evaluations per run"))
    keys = ["cell_id"] if "cell_id" in table else [c for c in ("budget", "params") if c in table]
    seeds = table.groupby(keys).size() if keys else pd.Series([1])
    out["seeds_desc"] = (f"{_count_words(int(seeds.min()))} seed{'s' if seeds.min() > 1 else ''} per rung" if seeds.min() == seeds.max()
                         else f"{int(seeds.min())} to {int(seeds.max())} seeds per rung")
    noise = diag.get("seed_noise_nats")
    if noise is not None and check.get("actual_final_loss"):
        out["seed_sentence"] = (f"**Seed noise** was measured from {out['seeds_desc']}: a pooled within-cell standard deviation of "
                                f"{float(noise):.3g} nats, {float(noise) / check['actual_final_loss']:.1%} of the hero's final loss.")
    else:
        out["seed_sentence"] = f"**Seed noise** was not measured ({out['seeds_desc']})."
    out["seed_noise_text"] = "seed noise not measured" if noise is None else f"measured seed noise {float(noise):.3g} nats"
    # What to change: one item per weakness the data show.
    advice = []
    if at_bound:
        advice.append("more budgets (or a wider span, or small models trained far past their optimum) so that E is identified")
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
    from delphi.prereg import format as fmt

    return fmt.read(path)


def _interval(pair: Any) -> str:
    if not pair or pair[0] is None:
        return "n/a"
    return f"[{float(pair[0]):.4g}, {float(pair[1]):.4g}]"


def _backtest_table(backtest: dict) -> str:
    rows = ["| method | held-out budget | predicted best loss | observed best loss | relative error | 90% interval covered |",
            "|---|---|---|---|---|---|"]
    for method, result in backtest.items():
        for b in result.get("budgets", []):
            rows.append(f"| {method} | {b['budget']:.3g} | {b['predicted_loss']:.4f} | {b['observed_best_loss']:.4f} "
                        f"| {b['rel_error']:+.2%} | {b.get('covered_90')} |")
    return "\n".join(rows)


def _ladder_table(table: pd.DataFrame) -> str:
    cols = ["run_id", "budget", "d_model", "n_layers", "params", "tokens", "loss"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.sort_values(["budget", "params"]).iterrows():
        cells = [str(r["run_id"]), f"{r['budget']:.3g}", str(int(r["d_model"])), str(int(r["n_layers"])),
                 f"{int(r['params']):,}", f"{int(r['tokens']):,}", f"{r['loss']:.4f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _trajectory_table(check: dict) -> str:
    points = check.get("points") or []
    if not points:
        return "(no eval points)"
    rows = ["| tokens | predicted | 90% band | actual | relative error |", "|---|---|---|---|---|"]
    for p in points:
        rows.append(f"| {p['tokens']:.3g} | {p['predicted']:.4f} | [{p['lo90']:.4f}, {p['hi90']:.4f}] | {p['actual']:.4f} | {p['rel_error']:+.2%} |")
    return "\n".join(rows)


def build_paper(paper_dir: str | Path = "paper", from_study: str | Path | None = None) -> dict:
    """Import a study's data if asked, redraw every figure, and render paper.md from template.md."""
    from delphi.study import stage_figures

    paper_dir = Path(paper_dir)
    data_dir, figures_dir = paper_dir / "data", paper_dir / "figures"
    template = paper_dir / "template.md"
    if not template.is_file():
        raise DelphiError(f"{template}: paper template not found")
    imported = import_study(Path(from_study), data_dir) if from_study is not None else []
    if not (data_dir / "study.json").is_file():
        raise DelphiError(f"{data_dir}: no study data; run `delphi paper build --from-study STUDY_DIR` once")
    study = _study_view(data_dir, figures_dir)
    figures = stage_figures(study)["files"]
    numbers = paper_numbers(data_dir)
    try:
        text = string.Template(template.read_text()).substitute(numbers)
    except KeyError as e:
        raise DelphiError(f"{template}: placeholder ${e.args[0]} has no value (known: {', '.join(sorted(numbers))})") from None
    atomic_write_text(paper_dir / "paper.md", text)
    return {"paper": str(paper_dir / "paper.md"), "figures": figures, "imported_files": len(imported)}
