"""A study seals its own prediction or refuses, before compute is spent (issue 53, causes 1, 14, 16
and 18's query suggestion)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import prereg_synthetic as ps
import pytest
import yaml
from test_prereg_seeds import seal
from test_study import _micro_study

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.study.spec import StudySpec
from delphi.study.state import Study

REPO = Path(__file__).resolve().parents[1]


def _with_prereg(study_file: Path, path: str) -> Path:
    raw = yaml.safe_load(study_file.read_text()) | {"preregistration": path}
    study_file.write_text(yaml.safe_dump(raw))
    return study_file


def test_a_study_refuses_a_seal_it_did_not_make_before_its_ladder_trains(tmp_path, capsys):
    """Cause 1: a study with a 50% tolerance found another study's seal at its `preregistration:`
    path, printed "sealed earlier, kept" and reported that seal's verdict as its own."""
    study_file = _with_prereg(_micro_study(tmp_path), "hero.prereg.yaml")
    foreign = seal(tmp_path / "hero.prereg.yaml", ps.train_config(32, 200, 8, "hero"), None)
    before = foreign.read_bytes()
    out = tmp_path / "out"
    assert main(["study", str(study_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not this study's seal" in err and "hero.prereg.yaml" in err
    assert not out.exists() and foreign.read_bytes() == before  # nothing trained, nothing written


def test_a_study_refuses_a_preregistration_path_it_cannot_write_before_its_ladder_trains(tmp_path, capsys):
    """Cause 1: a bad `preregistration:` path was refused only after the ladder had trained."""
    study_file = _micro_study(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "a_file").write_text("x")
    for bad in ("taken", "a_file/seal.yaml"):
        _with_prereg(study_file, bad)
        out = tmp_path / f"out_{bad.replace('/', '_')}"
        assert main(["study", str(study_file), "--out", str(out)]) == 2, bad
        assert "preregistration" in capsys.readouterr().err
        assert not out.exists()


def test_a_competing_law_that_cannot_be_fitted_is_sealed_as_such(tmp_path):
    """Cause 14: the seals stage died when the asymptotic law could not be fitted (one point per
    budget here), even with force; the primary's seal must go on with that law recorded."""
    from delphi.study.sealing import _competing

    ladder = ps.write_ladder(tmp_path / "ladder")
    spec = StudySpec(
        name="x", ladder=str(REPO / "studies" / "ladder_tiny.yaml"), fits=("vpnls",), primary_fit="vpnls", bootstrap=0
    )
    study = Study(tmp_path / "out", spec, REPO / "studies" / "ladder_tiny.yaml")
    study.fits_dir.mkdir(parents=True)
    shutil.copy(ladder / "results.csv", study.results)
    ps.write_fit(ladder, study.fit_path("vpnls"))
    competing = _competing(study, ps.hero_config(), {"loss": 1.0})
    assert "cannot be fitted" in competing["asymptotic"]["error"]
    assert not study.fit_path("asymptotic").exists()


def test_prereg_create_prints_json_when_a_gate_refuses(tmp_path, capsys):
    """Cause 16: `prereg create --json` refused by a gate (exit 1) printed nothing on stdout."""
    root = ps.write_ladder(tmp_path / "ladder")
    fit = ps.write_fit(root, tmp_path / "fit.json")
    hero = ps.write_hero(tmp_path / "hero.yaml", ps.hero_config())
    capsys.readouterr()
    assert (
        main(
            [
                "prereg",
                "create",
                "--fit",
                str(fit),
                "--hero",
                str(hero),
                "--ladder",
                str(root),
                "--out",
                str(tmp_path / "h.yaml"),
                "--bootstrap",
                "20",
                "--json",
            ]
        )
        == 1
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["sealed"] is False and out["failed_gates"]
    assert not (tmp_path / "h.yaml").exists()


def test_the_query_a_fit_suggests_drops_exactly_the_budget_it_names(tmp_path):
    """Cause 18: two budgets that print alike to 6 digits; the suggested --query kept the short one."""
    from delphi.fits import FITTERS
    from delphi.fits.data import TableOptions, load_results

    rows = []
    for budget, widths in ((1.0000001e19, (1e8,)), (1.0000002e19, (5e7, 1e8, 2e8)), (1e20, (2e8, 4e8, 8e8))):
        for n in widths:
            rows.append(
                {
                    "params": n,
                    "tokens": budget / (6 * n),
                    "flops": budget,
                    "budget": budget,
                    "loss": 2.0 + 0.1 * np.log(n / (budget / 6) ** 0.5) ** 2 - 0.05 * np.log10(budget),
                }
            )
    (tmp_path / "t.csv").write_text(pd.DataFrame(rows).to_csv(index=False))
    with pytest.raises(DelphiError, match=r"--query '(budget != [^']+)'") as refused:
        FITTERS["isoflop"](load_results(tmp_path / "t.csv"), n_bootstrap=0)
    query = str(refused.value).split("--query '")[1].split("'")[0]
    kept = load_results(tmp_path / "t.csv", TableOptions(query=query))
    assert sorted(kept["budget"].unique()) == [1.0000002e19, 1e20]
