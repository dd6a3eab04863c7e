"""`delphi paper build`: render the paper's text and figures from a finished study's data.

A paper (PAPER_DIR/paper.md) is rendered from PAPER_DIR/template.md. Every number in the text is a
`$placeholder` filled from a finished study's compact data (`delphi.paper.numbers`), so nothing in
the prose is typed by hand and nothing needs training to rebuild. paper/paper.md is the current
edition, rendered from the newest edition's data (`delphi.editions`).

    delphi paper build                      # the current edition (paper/paper.md) from the newest edition's data
    delphi paper build --edition v3         # the third edition, into paper/editions/v3/paper.md
    delphi paper build --all                # every edition with a template.md
    delphi paper build --paper-dir paper/editions/v3 --data paper/editions/v3/study   # the same, spelled out
    delphi paper build --from-study runs/paper      # import a finished study into PAPER_DIR/data, then build
"""

from __future__ import annotations

import string
from pathlib import Path

import pandas as pd

from delphi.editions import built_editions, current_edition, edition_data, resolve_data
from delphi.errors import DelphiError
from delphi.io import atomic_write_text
from delphi.paper.after_edition import after_edition_numbers, checkout_of
from delphi.paper.law_alone import LAW_ALONE_FIGURE, law_alone_figure, old_recipe_data
from delphi.paper.numbers import paper_numbers
from delphi.paper.study_data import prereg_file, study_view
from delphi.paper.study_import import import_study
from delphi.study.report import stage_figures


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
    study = study_view(data_dir, figures_dir)
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
    numbers |= after_edition_numbers(*checkout_of(shown, paper_dir), pd.read_csv(data_dir / "results.csv"))
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
