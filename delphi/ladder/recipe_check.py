"""The recipe check's files and limits, the plan's record of each run, and gate `recipe`: reading a
`delphi ladder recipe-check` report and judging it (docs/design.md; the check's method in
docs/notebook.md). Planning is in delphi.ladder.recipe_check_plan, the analysis in
delphi.ladder.recipe_check_analysis, the report's text and table in delphi.ladder.recipe_check_report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError
from delphi.io import read_json
from delphi.ladder.recipe import RecipeCheckSpec
from delphi.ladder.spec import LadderSpec

REPORT_FILE = "recipe_check.json"
PLAN_FILE = "recipe_check_plan.json"
# The check may cost at most a fifth of the study it checks (ladder + runs beyond it).
MAX_COMPUTE_RATIO = 0.2
# Gate `recipe`: no point may lose more than this share of its loss to the recipe's LR or batch, and
# the trend in width or horizon carried to the hero may not either.
MAX_LOST_FRAC = 0.005
# A prior's LR ratio this close (relative) to a grid multiplier is that multiplier: the recipe's LR is
# a product of factors, so the same LR computed two ways differs in the last bits.
SAME_LR_REL = 1e-9
# The hero may train this share more tokens than the longest horizon (or be this share wider than the
# widest point) and still count as reached: the plan rounds steps to its step quantum (spec.tolerance).
REACH_SLACK_REL = 0.01


@dataclass(frozen=True)
class CheckRun:
    run_id: str
    kind: str  # "width", "horizon" or "batch"
    point: str  # "d{d}@{tokens:.3g}"
    d_model: int
    tokens: float
    lr_multiplier: float  # a prior's: its LR / the recipe's at this point
    batch_multiplier: float
    seed: int
    source: str = ""  # "" = trained in this check; else the --prior directory it lives in (as given)


def check_spec(spec: LadderSpec) -> RecipeCheckSpec:
    """The spec's `recipe.check`; DelphiError naming the key when the spec has none."""
    if spec.recipe is None:
        raise DelphiError("recipe: the ladder spec has no recipe section; a recipe check checks a recipe")
    if spec.recipe.check is None:
        raise DelphiError("recipe.check: missing; give widths, width_tokens, horizons, horizon_width and hero_computes")
    return spec.recipe.check


# ---- gate `recipe` -------------------------------------------------------------------------------


def gate_problems(
    report: dict[str, Any], hero: dict[str, float] | None = None, limit: float = MAX_LOST_FRAC
) -> tuple[list[str], list[str], float | None]:
    """(problems, parts, worst) of a recipe-check report: a point losing more than `limit`, a carried
    trend above it, a point without a result, or a hero (hero_facts) wider or longer than the check reached."""
    problems, parts = [], []
    points = report.get("points") or []
    if not points:
        return ["the recipe check has no points"], [], None
    for p in points:
        where = f"{p['kind']} {p['point']}"
        if p.get("lost_frac") is None:
            problems.append(
                f"{where}: no loss at the recipe's value or no optimum ({p.get('completed', 0)}/{p.get('runs', 0)} runs)"
            )
            continue
        parts.append(f"{where} {p['lost_frac']:+.2%}")
        if p["lost_frac"] > limit:
            problems.append(
                f"{where}: the recipe loses {p['lost_frac']:.2%} against the sweep's optimum "
                f"({p.get('lost_basis') or 'observed'}; > {limit:.2%})"
            )
    carried = (report.get("trend") or {}).get("carried_lost_frac")
    if carried is not None and carried > limit:
        problems.append(f"the trend with width or horizon carries {carried:.2%} to the hero (> {limit:.2%})")
    reach = report.get("reach") or {}
    if hero and reach:
        if "d_model" in hero and hero["d_model"] > reach["widest"]:
            problems.append(
                f"hero d_model {hero['d_model']:.0f} wider than the check's widest point d{reach['widest']}"
            )
        if "tokens" in hero and hero["tokens"] > reach["longest"] * (1 + REACH_SLACK_REL):
            problems.append(
                f"hero trains {hero['tokens']:.3g} tokens, past the check's longest horizon {reach['longest']:.3g}"
            )
    lost = [p["lost_frac"] for p in points if p.get("lost_frac") is not None]
    worst = max([*lost, *([carried] if carried is not None else [])], default=None)
    return problems, parts, worst


def read_report(path: "Path | None") -> dict[str, Any] | None:
    """A recipe-check report (gate recipe's evidence); None for no path."""
    if path is None:
        return None
    report = read_json(path, what="recipe-check JSON")
    if not isinstance(report, dict) or not isinstance(report.get("points"), list):
        raise DelphiError(f"{path}: not a `delphi ladder recipe-check` report (expected a 'points' list)")
    return report


def study_report_path(study_path: "str | Path | None", value: str | None) -> Path | None:
    """gates.recipe_check of a study file, resolved against it; DelphiError when it is missing."""
    if value is None:
        return None
    if study_path is None:
        raise DelphiError("gates.recipe_check: needs a study file to resolve the report against")
    path = (Path(study_path).parent / value).resolve()
    if not path.is_file():
        raise DelphiError(
            f"{study_path}: gates.recipe_check: {path} not found (write it with `delphi ladder recipe-check`)"
        )
    return path
