"""`--query EXPR` (issue 41 §2): a closed grammar evaluated by delphi/query.py, never by Python.

pandas' `DataFrame.query` evaluated the expression: `@pd.io.common.os.system('touch x')` ran a
shell command. (a) The filters the docs and tests use select the same rows as before; (b) every
hostile expression is a DelphiError naming the expression and the offending token, and runs
nothing; (c) the CLI refuses one with exit 2 and writes nothing.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from delphi.errors import DelphiError
from delphi.fits import load_results
from delphi.fits.data import TableOptions
from delphi.query import MAX_NESTING, parse, query_mask, select_rows

ISOFLOPS = Path(__file__).resolve().parent / "data" / "isoflops.csv"
MARKER = "PWNED"
PACKAGE = Path(__file__).resolve().parents[1] / "delphi"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(ISOFLOPS)


@pytest.fixture
def no_code_runs(monkeypatch):
    """pandas' evaluators, os.system and subprocesses fail the test if a query reaches them (eval
    and exec are ruled out for the whole package by `test_no_module_evaluates_text`)."""

    def refuse(name):
        def call(*args, **kwargs):
            raise AssertionError(f"a query reached {name}")

        return call

    for owner, name in [
        (pd, "eval"),
        (pd.DataFrame, "query"),
        (pd.DataFrame, "eval"),
        (os, "system"),
        (os, "popen"),
        (subprocess, "Popen"),
    ]:
        monkeypatch.setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))


def test_no_module_evaluates_text():
    """No module of delphi calls eval, exec, compile or __import__, nor a `.query` / `.eval` method
    (pandas' evaluators of expression strings)."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id in ("eval", "exec", "compile", "__import__")) or (
                    isinstance(f, ast.Attribute) and f.attr in ("query", "eval")
                ):
                    calls.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert calls == []


# ----------------------------------------------------------------------------- (a) legitimate filters

LEGITIMATE = {  # expression -> the same selection written by hand
    "experiment == 'llama_3__exp_loss'": lambda t: t.experiment == "llama_3__exp_loss",  # docs/cli.md
    "source == 'llama_3' and not outlier": lambda t: (t.source == "llama_3") & ~t.outlier,  # the --help example
    "budget != 6e+18": lambda t: t.budget != 6e18,  # the isoflop error's advice (`{budget:.6g}`)
    "budget != 1e19": lambda t: t.budget != 1e19,
    "budget >= 1e19 and budget < 3e20": lambda t: (t.budget >= 1e19) & (t.budget < 3e20),
    "budget == 10000000000000000000": lambda t: t.budget == 1e19,
    "source in ['llama_3', \"ml_scalefit\"]": lambda t: t.source.isin(["llama_3", "ml_scalefit"]),
    "source not in ['llama_3']": lambda t: ~t.source.isin(["llama_3"]),
    "not (outlier or budget < 1e20)": lambda t: ~(t.outlier | (t.budget < 1e20)),
    "`loss` < 3": lambda t: t.loss < 3,
    "outlier == True": lambda t: t.outlier,
    "outlier != False and loss <= 2.5": lambda t: t.outlier & (t.loss <= 2.5),
    "params > 1e9 or tokens <= 5e9 and source == 'misfitting'": lambda t: (
        (t.params > 1e9) | ((t.tokens <= 5e9) & (t.source == "misfitting"))
    ),
    "(source == 'llama_3') and (reason == 'off_center' or reason == 'spline_outlier')": lambda t: (
        (t.source == "llama_3") & t.reason.isin(["off_center", "spline_outlier"])
    ),
    "not not outlier": lambda t: t.outlier,
    "loss < .5e1 and loss > 2.": lambda t: (t.loss < 5) & (t.loss > 2),
}


@pytest.mark.parametrize("expr", sorted(LEGITIMATE))
def test_a_legitimate_filter_selects_the_same_rows_as_before(expr, table, monkeypatch):
    before = table.query(expr)  # pandas, on a fixed string of ours: what --query gave until now
    expected = table[LEGITIMATE[expr](table)]
    assert len(expected) > 0 and len(expected) < len(table)
    pd.testing.assert_frame_equal(before, expected)
    monkeypatch.setattr(pd.DataFrame, "query", None)  # the new path never calls it
    monkeypatch.setattr(pd, "eval", None)
    pd.testing.assert_frame_equal(select_rows(table, expr), expected)


def test_a_mask_is_boolean_over_every_row_and_the_index_is_kept(table):
    shuffled = table.sample(frac=1.0, random_state=0).set_index(pd.Index([7] * len(table)))  # one repeated label
    mask = query_mask(shuffled, "source == 'llama_3'")
    assert mask.dtype == bool and len(mask) == len(shuffled)
    assert (select_rows(shuffled, "source == 'llama_3'").source == "llama_3").all()
    assert select_rows(table, "source == 'llama_3'").index.equals(table.index[table.source == "llama_3"])


def test_backticks_name_odd_columns_and_missing_booleans_count_as_false(no_code_runs):
    t = pd.DataFrame({"Model Size": [1e8, 1e9, 1e10], "flag": [True, None, False], "n": [1, 2, 3], 3: [5, 6, 7]})
    assert select_rows(t, "`Model Size` >= 1e9")["n"].tolist() == [2, 3]
    assert select_rows(t, "flag")["n"].tolist() == [1]
    assert select_rows(t, "not flag")["n"].tolist() == [2, 3]
    assert select_rows(t, "`3` == 6")["n"].tolist() == [2]  # a non-string label, spelled as text
    assert select_rows(t, "n in []").empty
    assert select_rows(t, "True")["n"].tolist() == [1, 2, 3]
    assert select_rows(t, "n == -1").empty


def test_load_results_filters_with_the_grammar_and_records_the_query(no_code_runs):
    expr = "experiment == 'llama_3__exp_loss'"
    table = load_results(ISOFLOPS, TableOptions(query=expr))
    assert len(table) == (pd.read_csv(ISOFLOPS).experiment == "llama_3__exp_loss").sum()
    assert table.attrs["query"] == expr


# ----------------------------------------------------------------------------- (b) hostile strings

HOSTILE = [
    "@pd.io.common.os.system('touch {marker}')",
    "@os.system('touch {marker}')",
    "@__builtins__",
    "__import__('os').system('touch {marker}')",
    "__import__('os')",
    "__class__",
    "source.__class__.__mro__",
    "loss.__class__",
    "a.b",
    "source.str.len() > 0",
    "pd.io.common.os.system('touch {marker}')",
    "os.system('touch {marker}')",
    "len(source)",
    "open('{marker}', 'w')",
    "lambda: 1",
    "(lambda: __import__('os').system('touch {marker}'))()",
    "source[0]",
    "source == 'llama_3'[0]",
    "loss + 1 > 2",
    "loss * 2 > 5",
    "-loss < 0",
    "loss ** 2 > 5",
    "source == 'a\\\\b'",
    "source == '\\x41'",
    "\\",
    "loss > 1; import os",
    "import os",
    "f'{{source}}' == 'x'",
    "rf'x' == source",
    "b'x' == source",
    'source == f\'{{__import__("os").system("touch {marker}")}}\'',
    "source == 'unterminated",
    "`unterminated == 1",
    "loss & outlier",
    "loss | outlier",
    "~outlier",
    "source = 'x'",
    "source == 'x' if True else False",
    "[x for x in source]",
    "{{'a': 1}}",
    "loss in (1, 2)",
    "loss in [loss]",
    "loss in [1, __import__('os')]",
    "source is None",
    "x := 1",
    "0x10 == loss",
    "1_000 == loss",
    "loss == 1e",
    "",
    "   ",
    "(",
    "loss ==",
    "loss == 1 and",
    "loss < 1 < 2",
    "nonexistent_column == 1",
    "loss",  # not a boolean column
    "'string'",
    "3",
    "source < 1",  # a text column against a number
    "(" * (MAX_NESTING + 1) + "outlier" + ")" * (MAX_NESTING + 1),
    "not " * 10_000 + "outlier",
    "(" * 10_000,
    "9" * 5_000 + " == loss",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_a_hostile_query_is_an_error_and_runs_nothing(template, table, tmp_path, monkeypatch, no_code_runs):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / MARKER
    expr = template.format(marker=marker)
    with pytest.raises(DelphiError) as e:
        select_rows(table, expr)
    message = str(e.value)
    assert "query" in message and "\n" not in message and len(message) < 2_000
    assert not marker.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "expr, token, position",
    [
        ("@pd.io.common.os.system('touch x')", "'@'", 1),
        ("__import__('os')", "'__import__'", 1),
        ("a.b", "'.'", 2),
        ("loss > 1; import os", "';'", 9),
        ("len(source)", "'('", 4),
        ("source[0]", "'['", 7),
        ("lambda: 1", "'lambda'", 1),
        ("source == 'a\\b'", "'\\\\'", 13),
        ("f'x' == source", "'f'", 1),
        ("loss & outlier", "'&'", 6),
    ],
)
def test_the_error_names_the_expression_the_token_and_its_position(expr, token, position):
    with pytest.raises(DelphiError) as e:
        parse(expr)
    message = str(e.value)
    assert repr(expr) in message, message
    assert (
        f"{token} at character {position} of query" in message or f"got {token} at character {position}" in message
    ), message


def test_an_unknown_column_is_named_with_the_columns_the_table_has(table):
    with pytest.raises(DelphiError, match="unknown column 'sorce' at character 1") as e:
        select_rows(table, "sorce == 'llama_3'")
    for column in table.columns:
        assert repr(column) in str(e.value)


def test_syntax_is_checked_before_any_column(table):
    """A bad token anywhere is reported before a missing column: nothing is evaluated first."""
    with pytest.raises(DelphiError, match="'@' at character 16"):
        select_rows(table, "nonexistent == @x")


# ----------------------------------------------------------------------------- (c) the CLI

from test_hostile_inputs import _run  # noqa: E402  (the hostile-input tests' CLI runner)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "isoflop", ISOFLOPS, "--out", "fit.json"],
        ["fit", "backtest", ISOFLOPS, "--beyond", "--no-calibration", "--source-col", "source", "--out", "beyond.json"],
    ],
)
def test_the_cli_refuses_a_hostile_query_with_exit_2_and_writes_nothing(
    command, tmp_path, monkeypatch, capsys, no_code_runs
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    before = _tree(tmp_path)
    hostile = f"@pd.io.common.os.system('touch {tmp_path / MARKER}')"
    code, err = _run([*command, "--query", hostile], capsys)
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("delphi: error:") and "'@' at character 1" in lines[0], err
    assert _tree(tmp_path) == before
    assert not (tmp_path / MARKER).exists()


def test_the_cli_examples_of_the_docs_still_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    expr = "experiment == 'llama_3__exp_loss'"
    code, err = _run(["fit", "isoflop", ISOFLOPS, "--query", expr, "--out", "fit.json"], capsys)
    assert code == 0, err
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert json.dumps(fit).count(json.dumps(expr)) >= 1
    code, err = _run(["fit", "backtest", ISOFLOPS, "--query", expr, "--method", "isoflop", "--probes", "3"], capsys)
    assert code == 0, err
