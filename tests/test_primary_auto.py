"""`primary_fit: auto` (issue 30, method choice by evidence): the fit stage chooses the primary law
once with `choose_method`, records it in stages/fit.json, and every later stage reads that record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.config_schema import from_dict
from delphi.errors import DelphiError
from delphi.io import atomic_write_json
from delphi.study.spec import PRIMARY_LAWS, StudySpec, load_study
from delphi.study.state import Study, load_table, primary_backtest

REPO = Path(__file__).resolve().parents[1]
# A finished default study's ladder (30 rungs, 3 budgets): its results table and pinned ladder spec.
ARCHIVED = REPO / "benchmarks" / "default_study" / "2026-12-02-v4-readme-run-xeon"


def _auto_study(tmp_path: Path, fits: list[str]) -> Study:
    """A study dir holding the archived ladder's results, as if its collect stage had run."""
    pinned = json.loads((ARCHIVED / "study.json").read_text())
    (tmp_path / "ladder.yaml").write_text(yaml.safe_dump(pinned["ladder"]))
    for name in ("results.csv", "results.csv.family.json"):
        shutil.copy(ARCHIVED / name, tmp_path / name)
    raw = {
        "name": "auto",
        "fits": fits,
        "primary_fit": "auto",
        "bootstrap": 0,
        "conventions": ["nonembedding"],
        "hero": {"compute_multiple": 3.0, "rehearsal_multiple": 2.0},
    }
    spec = from_dict(StudySpec, raw, "auto.yaml").validate("auto.yaml")
    return Study(tmp_path, spec, tmp_path / "ladder.yaml")


def test_primary_laws_are_the_calibrations_hero_sizing_laws():
    from delphi.fits.method_choice import PRIMARY_CAPABLE

    assert PRIMARY_LAWS == PRIMARY_CAPABLE


def test_auto_resolves_to_choose_methods_answer_once_and_a_resumed_study_reads_it(tmp_path, monkeypatch):
    from delphi.fits import calibration_file, method_choice
    from delphi.study import fitting
    from delphi.study.fitting import primary_choice_sentence
    from delphi.study.report import primary_choice_section
    from delphi.study.stages import stage_fit

    # vpnls (the default's law) is not among fits: the choice is restricted to isoflop and parametric.
    study = _auto_study(tmp_path, ["isoflop", "parametric", "frontier"])
    with pytest.raises(DelphiError, match="primary_fit: auto is resolved by the fit stage"):
        study.primary_fit  # noqa: B018 -- nothing reads an unresolved law
    result = stage_fit(study)
    expected = method_choice.choose_method(
        method_choice.table_features(load_table(study, "nonembedding")),
        calibration_file.load_calibration(),
        ["isoflop", "parametric"],
    )
    assert result["primary_fit"] == expected["method"] and expected["method"] in ("isoflop", "parametric")
    assert result["primary_choice"]["table"] == expected["table"] and result["primary_choice"]["candidates"] == [
        "isoflop",
        "parametric",
    ]
    assert result["primary_choice"]["calibration"]["sha256"] == calibration_file.load_calibration()["sha256"]
    assert json.loads(study.conventions.read_text())["primary_fit"] == expected["method"]
    assert study.fit_path(expected["method"]).is_file()
    atomic_write_json(
        study.marker("fit"), {"stage": "fit", "seconds": 0.0, "result": result}
    )  # as run_study records it

    # A resumed study (a new Study on the same dir) reads the recorded law and never chooses again.
    monkeypatch.setattr(fitting, "choose_primary", lambda *a, **k: pytest.fail("a resumed study chose again"))
    resumed = Study(tmp_path, study.spec, tmp_path / "ladder.yaml")
    assert resumed.primary_fit == expected["method"]
    atomic_write_json(resumed.fits_dir / "backtest.json", {m: {"law": m} for m in ("isoflop", "parametric", "vpnls")})
    assert primary_backtest(resumed) == {"law": expected["method"]}
    # The report and the preregistration's rationale state the choice and the table behind it.
    section = "\n".join(primary_choice_section(resumed))
    assert f"**{expected['method']}**" in section and "| isoflop |" in section and "| parametric |" in section
    sentence = primary_choice_sentence(resumed)
    assert f"primary law {expected['method']} was chosen by evidence" in sentence and "coverage" in sentence


def test_an_explicit_primary_fit_is_the_specs_and_reads_no_stage(tmp_path):
    spec, *_ = load_study(None)  # the built-in default study: unchanged
    assert spec.primary_fit in PRIMARY_LAWS
    study = Study(tmp_path, spec, tmp_path / "ladder.yaml")
    assert study.primary_fit == spec.primary_fit and not study.marker("fit").exists()
    from delphi.study.fitting import primary_choice_sentence, primary_for
    from delphi.study.report import primary_choice_section

    assert primary_for(study, None) == (spec.primary_fit, None)
    assert primary_choice_sentence(study) == "" and primary_choice_section(study) == []


@pytest.mark.parametrize(
    "bad",
    [{"primary_fit": "bogus"}, {"primary_fit": "frontier"}, {"primary_fit": "auto", "fits": ["frontier", "envelope"]}],
)
def test_a_bad_primary_fit_exits_2_naming_the_key(tmp_path, capsys, bad):
    raw = {"name": "x", "ladder": str(REPO / "studies" / "ladder_tiny.yaml")} | bad
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    assert cli_main(["study", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "primary_fit" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_auto_validates_with_a_hero_sizing_law_among_fits(tmp_path):
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "x",
                "ladder": str(REPO / "studies" / "ladder_tiny.yaml"),
                "fits": ["isoflop", "frontier"],
                "primary_fit": "auto",
            }
        )
    )
    assert load_study(tmp_path / "s.yaml")[0].primary_fit == "auto"
