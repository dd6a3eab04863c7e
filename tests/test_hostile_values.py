"""Every value checked before it is used (issue 53, causes 7, 8 and 13): a value a fit uses that is
not a finite number, a magnitude a fit cannot compute with, a seed JAX cannot take."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.fits.data import load_results

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "tests" / "data" / "isoflops.csv"
QUERY = "experiment == 'llama_3__raw_loss'"


def _table(tmp_path: Path, column: str, value) -> tuple[Path, int]:
    """The public llama-3 sweep with one value of `column` replaced; its file and the row's index."""
    raw = pd.read_csv(TABLE)
    raw = raw[raw["experiment"] == "llama_3__raw_loss"].reset_index(drop=True).astype({column: object})
    raw.loc[5, column] = value
    path = tmp_path / "t.csv"
    raw.to_csv(path, index=False)
    return path, 5


@pytest.mark.parametrize(
    "column, value",
    [("params", "abc"), ("budget", "1e19x"), ("tokens", float("inf")), ("params", ""), ("budget", None)],
)
def test_a_value_a_fit_uses_that_is_not_a_number_is_an_error_naming_file_column_and_row(
    tmp_path, capsys, column, value
):
    """Cause 7: a text params or budget, inf, an empty cell were dropped without a word ("132 points")."""
    path, row = _table(tmp_path, column, value)
    with pytest.raises(DelphiError, match=rf"{path.name}.*row {row} \({column} = "):
        load_results(path)
    assert main(["fit", "isoflop", str(path), "--out", str(tmp_path / "fit.json")]) == 2
    assert not (tmp_path / "fit.json").exists()
    err = capsys.readouterr().err
    assert f"row {row} ({column}" in err and "--drop-invalid" in err
    assert main(["fit", "isoflop", str(path), "--drop-invalid", "--out", str(tmp_path / "fit.json"), "--json"]) == 0
    captured = capsys.readouterr()
    assert "dropped 1 row(s)" in captured.err and f"row {row} ({column}" in captured.err
    assert json.loads(captured.out)["n_points"] == len(pd.read_csv(path)) - 1


def test_a_json_null_is_an_error_too(tmp_path):
    rows = pd.read_csv(TABLE).query(QUERY).to_dict("records")
    rows[2]["params"] = None
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DelphiError, match=r"row 2 \(params = "):
        load_results(path)


@pytest.mark.parametrize("column, value", [("params", 1e308), ("loss", 1e300), ("tokens", 1e-200)])
def test_a_magnitude_a_fit_cannot_compute_with_is_refused(tmp_path, capsys, column, value):
    """Cause 8: params = 1e308 was a traceback; losses near 1e300 fitted with status ok and null parameters."""
    raw = pd.read_csv(TABLE).query(QUERY).reset_index(drop=True)
    if column == "loss":
        raw["loss"] = raw["loss"] * value
    else:
        raw.loc[3, column] = value
    path = tmp_path / "t.csv"
    raw.to_csv(path, index=False)
    for method in ("isoflop", "vpnls"):
        assert main(["fit", method, str(path), "--out", str(tmp_path / "fit.json")]) == 2
        err = capsys.readouterr().err
        assert f"{column} = " in err and "beyond what a fit can compute with" in err and "Traceback" not in err
    assert not (tmp_path / "fit.json").exists()


def test_seeds_beyond_a_jax_key_are_refused_before_anything_is_written(tmp_path, capsys):
    """Cause 13: seeds of 2**63 or more were an OverflowError traceback (after the run dir existed),
    and a study with such a hero seed sealed a preregistration that could never be checked."""
    config = yaml.safe_load((REPO / "delphi" / "defaults" / "tiny.yaml").read_text()) | {"seed": 2**63}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 2
    assert "seed" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert main(["train", "--seeds", f"0,{2**64}", "--out", str(tmp_path / "runs")]) == 2
    assert "--seeds" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    study = {"name": "x", "ladder": str(REPO / "studies" / "ladder_tiny.yaml"), "hero": {"seeds": [0, 2**63]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    assert main(["study", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "study")]) == 2
    assert "hero.seeds" in capsys.readouterr().err and not (tmp_path / "study").exists()
