"""The paper of a study of the law alone (issue 29, the eighth edition): each run beyond the ladder
against its own seal, with the order of seals and first steps, and the old recipe's law alone
against the new one's at 3x, 10x and 30x.

No training: the fixture is the fifth edition's committed study (its pinned probes are v4's
probe3x and probe10x, its hero is hero30x), re-pinned as a study of the law alone with probes of its
own at 3x and 10x, whose seals are v4's own sealed files (preregistrations/paper-v4-probe-*.yaml)
and the fifth edition's hero seal: three real seals, each against the run it predicted.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from delphi import prereg_format as fmt
from delphi.editions import edition_tree, resolve_data

REPO = Path(__file__).resolve().parents[1]
OLD_STUDY = REPO / "paper" / "editions" / "v5" / "study"
SEALS = {"probe3x": "paper-v4-probe-3x", "probe10x": "paper-v4-probe-10x"}
HERO_SEAL = "paper-v5-hero-30x"
TOP_BUDGET = 1e13  # the fifth edition's top ladder budget (paper/editions/v5/study/results.csv)


def _seal_path(study: Path, run: str) -> Path:
    return study / "preregistration.yaml" if run == "hero" else study / "probes" / f"{run}.prereg.yaml"


def _run_dir(study: Path, run: str) -> Path:
    return study / "hero" if run == "hero" else study / "probes" / run


@pytest.fixture(scope="module")
def law_alone_template(tmp_path_factory) -> Path:
    study = tmp_path_factory.mktemp("v8") / "study"
    shutil.copytree(resolve_data(OLD_STUDY), study)
    pinned = json.loads((study / "study.json").read_text())
    pinned["study"]["hero"] |= {"probe_correction": False, "probe_multiples": [3, 10]}
    pinned["study"]["gates"]["probes"] = []  # the probes are the study's own, not evidence from before it
    (study / "study.json").write_text(json.dumps(pinned))
    v4 = edition_tree(REPO / "paper" / "editions" / "v4")
    for run, seal in SEALS.items():
        shutil.copy(REPO / "preregistrations" / f"{seal}.yaml", _seal_path(study, run))
        # The fifth edition pinned the probes without their curves; v4's own copy holds them (the first step's time).
        shutil.copy(v4 / run / "metrics.jsonl", _run_dir(study, run) / "metrics.jsonl")
    shutil.copy(REPO / "preregistrations" / f"{HERO_SEAL}.yaml", _seal_path(study, "hero"))
    return study


@pytest.fixture
def law_alone_study(law_alone_template, tmp_path) -> Path:
    study = tmp_path / "study"
    shutil.copytree(law_alone_template, study, symlinks=True)
    return study


def _reseal(seal: Path, created_s: float) -> None:
    """The same prediction sealed again as if made at `created_s` (epoch seconds)."""
    doc = fmt.read(seal)
    doc["created"] = datetime.fromtimestamp(created_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    seal.unlink()
    fmt.write_new(seal, fmt.seal(doc))


def _first_step(study: Path, run: str) -> float:
    from delphi.train.runlog import read_run_dir

    return read_run_dir(_run_dir(study, run)).first_step_time


def _rows(study: Path) -> list[dict]:
    from delphi.paper.beyond import sealed_runs

    return sealed_runs(
        [(run, _seal_path(study, run), _run_dir(study, run)) for run in ("probe3x", "probe10x", "hero")], TOP_BUDGET
    )


def _table_row(text: str, first_cell: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_run_is_checked_against_its_own_seal_and_nothing_is_written(law_alone_study):
    from delphi.paper.numbers import paper_numbers

    before = sorted(p.relative_to(law_alone_study) for p in law_alone_study.rglob("*"))
    numbers = paper_numbers(law_alone_study, old_recipe=OLD_STUDY)
    section = numbers["law_alone_section"]
    assert (
        sorted(p.relative_to(law_alone_study) for p in law_alone_study.rglob("*")) == before
    )  # no outcome file written
    assert "### Each prediction against its own seal" in section
    for run, seal in [*SEALS.items(), ("hero", HERO_SEAL)]:
        # The check the paper runs gives what `prereg check` recorded when each run finished.
        recorded = json.loads((REPO / "preregistrations" / f"{seal}.outcome.json").read_text())
        doc = fmt.read(REPO / "preregistrations" / f"{seal}.yaml")
        cells = _table_row(section, run)
        assert cells[3] == f"{doc['prediction']['final']['loss']:.4f}"
        lo, hi = doc["prediction"]["final"]["loss_90"]
        assert cells[4] == f"[{lo:.4f}, {hi:.4f}]"
        assert cells[5:8] == [
            f"{recorded['actual_final_loss']:.4f}",
            f"{recorded['rel_error']:+.2%}",
            {True: "yes", False: "**no**"}[recorded["covered_90"]],
        ]
        assert cells[8].startswith(f"**{recorded['verdict']}**")
        assert cells[9].startswith(doc["created"][:19]) and ("(forced)" in cells[9]) == bool(doc.get("forced"))
        assert cells[11] == "yes"  # each seal made before its own run's first step
    # v4's probes trained a day before the fifth edition sealed its hero: the paper says so.
    assert "**before the seal of hero**" in section
    assert numbers["probes_sentence"].endswith("predictions like the hero's, not evidence for a correction.")
    assert (
        "The study's own probes at 3x and 10x the top budget were sealed with the ladder's law alone"
        in numbers["probes_sentence"]
    )


def test_the_old_recipe_is_the_seventh_editions_law_alone_at_3x_10x_and_30x(law_alone_study):
    """The old side is the computation behind the seventh edition's table of runs beyond the
    ladder (its primary column), not numbers typed into the paper."""
    from delphi.paper.beyond import recipe_comparison, recipe_comparison_table
    from delphi.paper.law_alone import law_alone_at_runs

    old = law_alone_at_runs(resolve_data(OLD_STUDY))
    assert [(r["run"], round(r["multiple"])) for r in old] == [("probe3x", 3), ("probe10x", 10), ("hero", 30)]
    seventh = (REPO / "paper" / "editions" / "v7" / "paper.md").read_text()
    for row, v7_name in zip(old, ("probe3x", "probe10x", "hero30x")):
        assert _table_row(seventh, v7_name)[5] == f"{row['predicted']:.4f} ({row['rel_error']:+.2%})"
    table = recipe_comparison_table(recipe_comparison(old, _rows(law_alone_study)))
    assert [_table_row(table, m)[1] for m in ("3x", "10x", "30x")] == ["probe3x", "probe10x", "hero"]
    hero = _table_row(table, "30x")
    assert hero[2:5] == [f"{old[2]['predicted']:.4f}", f"{old[2]['actual']:.4f}", f"{old[2]['rel_error']:+.2%}"]


def test_untrained_runs_are_sealed_not_yet_trained(law_alone_study):
    from delphi.paper.numbers import paper_numbers

    shutil.rmtree(_run_dir(law_alone_study, "probe10x"))
    shutil.rmtree(_run_dir(law_alone_study, "hero"))
    section = paper_numbers(law_alone_study, old_recipe=OLD_STUDY)["law_alone_section"]
    for run in ("probe10x", "hero"):
        cells = _table_row(section, run)
        assert cells[5:9] == ["n/a", "n/a", "n/a", "sealed, not yet trained"]
        assert cells[10:] == ["n/a", "yes (no step yet)"]
    assert "Not yet trained: probe10x, hero." in section
    comparison = section.split("### The old recipe's law alone against the new recipe's")[1]
    for multiple, run in (("10x", "probe10x"), ("30x", "hero")):
        new = _table_row(comparison, multiple)[5:]
        sealed = fmt.read(_seal_path(law_alone_study, run))["prediction"]["final"]["loss"]
        assert new == [run, f"{sealed:.4f}", "not yet trained", "n/a", "n/a"]
    assert "Not yet scored: probe10x, hero." in comparison


def test_every_seal_before_any_step_is_stated(law_alone_study):
    """Issue 29: all three sealed before any of them trains. The fixture's seals made again an hour
    before the first step of any run say so; one made after its run's first step is an invalid check."""
    from delphi.paper.beyond import seal_order_sentence, sealed_runs_table

    runs = ("probe3x", "probe10x", "hero")
    earliest = min(_first_step(law_alone_study, run) for run in runs)
    for k, run in enumerate(runs):
        _reseal(_seal_path(law_alone_study, run), earliest - 3600 + k)
    sentence = seal_order_sentence(_rows(law_alone_study))
    assert sentence.startswith("Three predictions were sealed, each the ladder's law alone, from ")
    assert sentence.endswith("after every seal.") and "probe3x, probe10x with --force" in sentence

    _reseal(_seal_path(law_alone_study, "probe10x"), _first_step(law_alone_study, "probe10x") + 60)
    rows = _rows(law_alone_study)
    sentence = seal_order_sentence(rows)
    assert "**before the seal of probe10x**" in sentence
    assert "The check cannot show that probe10x started after its own seal." in sentence
    cells = _table_row(sealed_runs_table(rows), "probe10x")
    assert cells[8] == "**invalid: the run predates the preregistration**" and cells[11] == "**no**"
    assert cells[5:8] == ["n/a", "n/a", "n/a"]  # an invalid check scores nothing


def test_a_seal_edited_after_sealing_is_reported_not_scored(law_alone_study):
    from delphi.paper.beyond import seal_order_sentence, sealed_runs_table

    seal = _seal_path(law_alone_study, "probe3x")
    seal.write_text(seal.read_text().replace("author: delphi developers", "author: someone else", 1))
    rows = _rows(law_alone_study)
    cells = _table_row(sealed_runs_table(rows), "probe3x")
    assert "(**seal broken**)" in cells[9] and cells[8] == "**not checked**" and cells[5] == "n/a"
    assert "**The seal of probe3x does not match its content**" in seal_order_sentence(rows)


def test_a_study_whose_probes_corrected_the_hero_has_no_such_section():
    from delphi.paper.law_alone import law_alone_runs

    seventh = resolve_data(REPO / "paper" / "editions" / "v7" / "study")
    assert law_alone_runs(seventh, REPO / "preregistrations" / "paper-v7-hero-90x.yaml", TOP_BUDGET) == []


def test_the_old_recipe_is_found_beside_the_editions(tmp_path):
    from delphi.compact import CURVES_FILE, FILES_FILE
    from delphi.paper.law_alone import old_recipe_data

    # An eighth edition's compact data: the seventh edition's study (the old recipe's five runs beyond
    # its ladder) is found beside it, as the text quotes it.
    editions = tmp_path / "paper" / "editions"
    (editions / "v8" / "study").mkdir(parents=True)
    for name in (CURVES_FILE, FILES_FILE):
        (editions / "v8" / name).write_bytes(b"")
    (editions / "v7").symlink_to(REPO / "paper" / "editions" / "v7")
    assert old_recipe_data(editions / "v8" / "study", tmp_path / "elsewhere") == editions / "v7" / "study"
    # A study directory outside the editions: PAPER_DIR/editions.
    assert (
        old_recipe_data(tmp_path / "runs" / "paper_v8", REPO / "paper") == REPO / "paper" / "editions" / "v7" / "study"
    )
    assert old_recipe_data(tmp_path / "runs" / "paper_v8", tmp_path / "elsewhere") is None


def test_the_paper_builds_once_the_seals_are_made_before_any_run_trains(law_alone_study, tmp_path):
    """Stage seals done, nothing beyond the ladder trained (issue 29 commits that stage): `paper
    build` renders, each run sealed, not yet trained, and the hero's verdict not yet checked."""
    from delphi.paper.build import build_paper
    from delphi.paper.study_data import UNCHECKED

    (law_alone_study / "stages" / "seals.json").write_text(json.dumps({"stage": "seals", "result": {}}))
    for stage in ("check", "train_hero", "probes", "figures", "report"):
        (law_alone_study / "stages" / f"{stage}.json").unlink(missing_ok=True)
    for run in ("probe3x", "probe10x", "hero"):
        shutil.rmtree(_run_dir(law_alone_study, run))
    paper = tmp_path / "paper"
    paper.mkdir()
    shutil.copy(REPO / "paper" / "template.md", paper / "template.md")
    (paper / "editions").mkdir()
    (paper / "editions" / "v7").symlink_to(REPO / "paper" / "editions" / "v7")  # the old recipe, beside the paper
    built = build_paper(paper, data_dir=law_alone_study, svg=False)
    assert (
        str(paper / "figures" / "law_alone_error.png") in built["figures"]
    )  # the edition's figure, with nothing scored yet
    text = (paper / "paper.md").read_text()
    assert f"**{UNCHECKED}**" in text
    for run in ("probe3x", "probe10x", "hero"):
        assert _table_row(text, run)[8] == "sealed, not yet trained"
    assert "None of them has taken a step." in text
    comparison = text.split("### The old recipe's law alone against the new recipe's")[1]
    assert [_table_row(comparison, m)[7] for m in ("3x", "10x", "30x")] == ["not yet trained"] * 3
    assert (
        "none of the new recipe's sealed predictions is scored yet. Not yet scored: probe3x, probe10x, hero."
        in comparison
    )


def _two_seed_row(run: str, multiple: float, predicted: float, seeds: list[float] | None) -> dict:
    """A sealed_run row of a two-seed seal with two competing laws sealed beside the primary."""
    actual = None if seeds is None else sum(seeds) / len(seeds)
    competing = {
        "isoflop": {"loss": predicted * 0.96, "loss_90": [predicted * 0.93, predicted * 0.99]},
        "frontier": {"error": "no prediction (E at its bound)"},
    }
    row = {
        "run": run,
        "status": "completed" if seeds else "running",
        "multiple": multiple,
        "flops": multiple * 1e13,
        "shape": "d96 L3",
        "predicted": predicted,
        "loss_50": [predicted * 0.99, predicted * 1.01],
        "loss_90": [predicted * 0.97, predicted * 1.03],
        "competing": competing,
        "actual": actual,
        "rel_error": None if actual is None else actual / predicted - 1,
        "verdict": None,
        "tolerance_rel": 0.01,
        "seeds": [] if seeds is None else list(enumerate(seeds)),
        "scores": {},
        "covered_50": None,
        "covered_90": None,
    }
    if actual is not None:
        from delphi.prereg.competing import score_competing

        row |= {
            "covered_50": abs(actual / predicted - 1) <= 0.01,
            "covered_90": abs(actual / predicted - 1) <= 0.03,
            "verdict": "passed" if abs(actual / predicted - 1) <= 0.01 else "failed",
            "scores": score_competing(competing, actual),
        }
    return row


def test_every_sealed_law_is_scored_on_the_seed_mean_and_on_each_seed():
    """Issue 40: each sealed law against the mean of the seeds and each seed, with its coverage; the
    ranking puts the law with the smallest mean |error| first, a law that could not predict keeps its
    reason, and a run still training is shown sealed, not scored."""
    from delphi.paper.beyond import laws_ranking, laws_run_table, laws_section, runs_summary

    rows = [_two_seed_row("probe3x", 3, 1.20, [1.19, 1.23]), _two_seed_row("hero", 30, 0.98, None)]
    scores = laws_ranking(rows, "vpnls")
    assert [e["law"] for e in scores] == ["vpnls (primary)", "isoflop", "frontier"]
    assert scores[0]["mean_abs_error"] == pytest.approx(1.21 / 1.20 - 1) and scores[0]["n_scored"] == 1
    assert scores[1]["mean_abs_error"] == pytest.approx(1.21 / (1.20 * 0.96) - 1)
    assert scores[2]["mean_abs_error"] is None  # no prediction: never scored
    table = laws_run_table(rows[0], "vpnls").splitlines()
    assert table[0].startswith(
        "| law | sealed | 50% interval | 90% interval | error (mean) | error (seed 0) | error (seed 1) |"
    )
    assert table[2] == (
        f"| vpnls (primary) | 1.2000 | [1.1880, 1.2120] | [1.1640, 1.2360] | {1.21 / 1.2 - 1:+.2%} "
        f"| {1.19 / 1.2 - 1:+.2%} | {1.23 / 1.2 - 1:+.2%} | yes | yes | n/a |"
    )
    assert table[-1] == "| frontier | no prediction (E at its bound) |" + " n/a |" * 8  # as many cells as the header
    assert table[-1].count("|") == table[0].count("|")
    section = laws_section(rows, "vpnls")
    assert "Closest over the one scored run: **vpnls (primary)**" in section
    assert "#### hero: 3e+14 FLOPs (30x), d96 L3, training" in section
    assert "0.9800 (not yet scored)" in section
    summary = runs_summary(rows)
    assert summary == (
        f"at 3x the law alone sealed 1.2000 and the mean of two seeds reached 1.2100 ({1.21 / 1.2 - 1:+.2%}, "
        "**passed**, inside its 90% interval); at 30x the law alone sealed 0.9800 (still training)."
    )
