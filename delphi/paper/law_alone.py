"""A study of the law alone in the paper: its sealed runs beyond the ladder, the old recipe's law
alone at its runs, and the figure that sets them side by side (`delphi.paper.beyond` makes the
rows and tables)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from delphi.editions import EDITIONS_DIR, edition_data_or_none, edition_root, resolve_data
from delphi.fits import load_fit
from delphi.fits.data import isoflop_rows
from delphi.paper.beyond import NOT_SEALED, OLD_RECIPE_EDITION, law_alone_rows, sealed_runs
from delphi.paper.study_data import pinned_spec, primary_fit_name, probe_dirs
from delphi.plot.figures import law_alone_error_figure
from delphi.plot.style import save_figure
from delphi.study.spec import StudySpec, own_probe_name


def is_law_alone_study(spec: StudySpec) -> bool:
    """A study that sealed its own probes with the ladder's law alone, like its hero ."""
    return not spec.hero.probe_correction and bool(spec.hero.probe_multiples)


def law_alone_at_runs(data_dir: Path) -> list[dict]:
    """A finished study's runs beyond the ladder (its pinned probes, then the hero) against its
    primary law alone: the primary column of its table of runs beyond the ladder."""
    fit = load_fit(data_dir / "fits" / f"{primary_fit_name(data_dir)}.json")
    runs = probe_dirs(data_dir) + ([data_dir / "hero"] if (data_dir / "hero" / "summary.json").is_file() else [])
    top_budget = float(isoflop_rows(pd.read_csv(data_dir / "results.csv"))["budget"].max())
    return law_alone_rows(fit, runs, top_budget)


def probe_seal(data_dir: Path, prereg_path: Path, multiple: float) -> Path:
    """Where the study sealed its own probe at `multiple` (`delphi.study.sealing.probe_prereg`): beside
    the hero's seal when the study names it (probe_preregistration), else in its probes/."""
    template = pinned_spec(data_dir).probe_preregistration
    if template is None:
        return data_dir / "probes" / f"{own_probe_name(multiple)}.prereg.yaml"
    return prereg_path.parent / template.format(multiple=f"{multiple:g}")


def law_alone_runs(data_dir: Path, prereg_path: Path, top_budget: float) -> list[dict]:
    """A study of the law alone's sealed runs (its own probes, nearest first, then the hero), each
    against its own seal (`sealed_runs`: every seed, every competing law); empty for a study whose
    probes were evidence for the hero's seal."""
    spec = pinned_spec(data_dir)
    if not is_law_alone_study(spec):
        return []
    seals = [
        (own_probe_name(m), probe_seal(data_dir, prereg_path, m), data_dir / "probes" / own_probe_name(m))
        for m in sorted(spec.hero.probe_multiples)
    ]
    return sealed_runs(seals + [("hero", prereg_path, data_dir / "hero")], top_budget)


LAW_ALONE_FIGURE = "law_alone_error.png"  # the figure of a study of the law alone (the README's front figure)


def law_alone_figure(data_dir: Path, prereg_path: Path, old_recipe: Path | None, path: Path) -> list[str]:
    """Draw the edition's figure (`delphi.plot.figures.law_alone_error_figure`) into `path` (.png
    and .svg) for a study of the law alone with the old recipe's data beside it; nothing otherwise."""
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
    roots = [root.parent] if (root := edition_root(shown)) is not None else []
    for editions_dir in [*roots, paper_dir / EDITIONS_DIR]:
        if (study := edition_data_or_none(editions_dir / OLD_RECIPE_EDITION)) is not None:
            return study
    return None
