"""Figures and report for any table (issue 50, item 4; issue 53, cause 17): `--query` and column
mapping on the plots of a table, `plot frontier --run` on any log, `plot lrsweep` refusing a table it
cannot draw, and `delphi report` for a pipeline assembled by hand."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import prereg_synthetic as ps
import pytest

from delphi.cli import main

DATA = Path(__file__).resolve().parent / "data"
LLAMA = "experiment == 'llama_3__exp_loss' and not outlier"


def _written(out: Path) -> bool:
    return out.stat().st_size > 1000 and out.with_suffix(".svg").stat().st_size > 1000


def _json(args: list[str], capsys) -> tuple[int, dict | None, str]:
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


def test_table_plots_take_query_and_column_mapping(tmp_path, capsys):
    """A public table holding several sweeps: every figure of a table selects one with --query, and a
    table named otherwise is mapped as `delphi fit` maps it."""
    sweep = str(DATA / "isoflops.csv")
    assert main(["fit", "isoflop", sweep, "--query", LLAMA, "--out", str(tmp_path / "iso.json")]) == 0
    assert main(["fit", "vpnls", sweep, "--query", LLAMA, "--out", str(tmp_path / "vpnls.json")]) == 0
    for args, name in (
        (["isoflop", sweep, "--fit", str(tmp_path / "iso.json")], "isoflop.png"),
        (["frontier", sweep, "--fit", str(tmp_path / "vpnls.json")], "frontier.png"),
        (["residuals", sweep, "--fit", str(tmp_path / "vpnls.json")], "residuals.png"),
        (["allocation", str(tmp_path / "iso.json"), "--results", sweep], "allocation.png"),
    ):
        assert main(["plot", *args, "--query", LLAMA, "--out", str(tmp_path / name)]) == 0, args
        assert _written(tmp_path / name), name
    code, _, err = _json(
        ["plot", "isoflop", sweep, "--query", "experiment = 'x'", "--out", str(tmp_path / "q.png")], capsys
    )
    assert code == 2 and "use '=='" in err and not (tmp_path / "q.png").exists()
    # A table with other column names: mapped by flag; a mapping to a column that is not there is exit 2.
    epoch = str(DATA / "chinchilla_epoch.csv")
    mapped = ["--params-col", "Model Size", "--flops-col", "Training FLOP"]
    assert main(["plot", "frontier", epoch, *mapped, "--out", str(tmp_path / "epoch.png")]) == 0
    assert _written(tmp_path / "epoch.png")
    code, _, err = _json(["plot", "isoflop", epoch, "--params-col", "N", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "column 'N' (for params) not found" in err


def test_lrsweep_maps_selects_and_refuses_what_it_cannot_draw(tmp_path, capsys):
    lrs = 2.0 ** np.arange(-10, -4)
    rows = [
        {"d": w, "eta": lr, "final": 2 + 0.1 * (np.log2(lr) + 7) ** 2 / w**0.2, "arm": "a" if w < 256 else "b"}
        for w in (64, 128, 256)
        for lr in lrs
    ]
    table = tmp_path / "sweep.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    mapped = ["--width-col", "d", "--lr-col", "eta", "--loss-col", "final"]
    assert (
        main(["plot", "lrsweep", str(table), *mapped, "--query", "arm == 'a'", "--out", str(tmp_path / "lr.png")]) == 0
    )
    assert _written(tmp_path / "lr.png")
    code, _, err = _json(["plot", "lrsweep", str(table), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "no column 'width' for width (map it with --width-col)" in err
    nan = tmp_path / "nan.csv"
    pd.DataFrame(rows).assign(final=lambda f: f["final"].where(f.index != 3, np.nan)).to_csv(nan, index=False)
    code, _, err = _json(["plot", "lrsweep", str(nan), *mapped, "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "nan.csv: row 3: final = nan, expected a finite number > 0" in err
    header = tmp_path / "header.csv"
    header.write_text("width,lr,loss\n")
    code, _, err = _json(["plot", "lrsweep", str(header), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "no rows (a header only)" in err
    code, _, err = _json(
        ["plot", "lrsweep", str(table), *mapped, "--query", "arm == 'c'", "--out", str(tmp_path / "x.png")], capsys
    )
    assert code == 2 and "no rows after --query" in err
    assert not (tmp_path / "x.png").exists()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """A pipeline assembled by hand: a results table, a fit, a seal made from them, and the hero's
    log from another trainer (JSONL under its own names), complete."""
    from test_live_log import trainer_rows

    root = tmp_path_factory.mktemp("pipeline")
    ladder = ps.write_ladder(root / "ladder")
    table = pd.read_csv(ladder / "results.csv").rename(columns={"params": "N", "tokens": "D", "loss": "L"})
    table.to_csv(root / "results.csv", index=False)
    fit = ps.write_fit(ladder, root / "fit.json")
    hero_cfg = ps.hero_config()
    hero = ps.write_hero(root / "hero.yaml", hero_cfg)
    prereg = root / "regs" / "hero.yaml"
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
                str(ladder),
                "--out",
                str(prereg),
                "--bootstrap",
                "20",
                "--tolerance",
                "0.03",
                "--force",
            ]
        )
        == 0
    )
    time.sleep(0.01)
    log = root / "hero_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in trainer_rows(hero_cfg)))
    half = root / "hero_half.jsonl"
    half.write_text("".join(json.dumps(r) + "\n" for r in trainer_rows(hero_cfg, upto=0.5)))
    return {
        "root": root,
        "results": root / "results.csv",
        "fit": fit,
        "prereg": prereg,
        "log": log,
        "half": half,
        "hero_cfg": hero_cfg,
    }


def test_frontier_takes_the_final_loss_from_any_log(pipeline, tmp_path, capsys):
    base = [
        "plot",
        "frontier",
        str(pipeline["results"]),
        "--params-col",
        "N",
        "--tokens-col",
        "D",
        "--loss-col",
        "L",
        "--fit",
        str(pipeline["fit"]),
        "--prereg",
        str(pipeline["prereg"]),
    ]
    code, result, _ = _json([*base, "--run", str(pipeline["log"]), "--out", str(tmp_path / "f.png")], capsys)
    assert code == 0 and result["actual"] == pytest.approx(
        json.loads(pipeline["log"].read_text().splitlines()[-1])["eval/loss"]
    )
    code, result, err = _json([*base, "--run", str(pipeline["half"]), "--out", str(tmp_path / "g.png")], capsys)
    assert code == 0 and result["actual"] is None and "no actual point drawn: the log has not reached" in err
    code, _, err = _json(base[:-2] + ["--run", str(pipeline["log"]), "--out", str(tmp_path / "h.png")], capsys)
    assert code == 2 and "give --prereg" in err


def test_report_for_a_pipeline_assembled_by_hand(pipeline, tmp_path, capsys):
    out = tmp_path / "report"
    table = ["--results", str(pipeline["results"]), "--params-col", "N", "--tokens-col", "D", "--loss-col", "L"]
    code, result, err = _json(
        [
            "report",
            *table,
            "--fit",
            str(pipeline["fit"]),
            "--prereg",
            str(pipeline["prereg"]),
            "--run",
            str(pipeline["log"]),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert result["check"]["verdict"] == "passed"
    assert {Path(f).name for f in result["figures"]} == {
        "isoflop.png",
        "frontier.png",
        "residuals.png",
        "prediction.png",
    }
    # one run per budget: no isoFLOP parabola, so no allocation; said, not dropped
    assert [w.split(" (")[0] for w in result["not_drawn"]] == ["allocation"]
    text = (out / "report.md").read_text()
    for part in (
        "## Preregistered prediction against the outcome",
        "| passed |",
        "the first to reach",
        "## Gates (evaluated before the hero trained)",
        "| seeds | FAIL |",
        "sealed with --force",
        "The fit given here is that fit.",
        "## Fit",
        "parametric fit (vpnls)",
        "![prediction](figures/prediction.png)",
        "## Results table",
        "read as step = iter, tokens = tokens_seen, loss = eval/loss, time = time",
        "Not drawn: allocation (approach2: budget",
    ):
        assert part in text, part
    assert all(_written(Path(f)) for f in result["figures"])
    # Run again: it replaces its own files; a report.md it did not write is kept unless --force.
    assert main(["report", *table, "--fit", str(pipeline["fit"]), "--out", str(out)]) == 0
    assert "## Preregistered prediction" not in (out / "report.md").read_text()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes\n")
    code, _, err = _json(["report", "--fit", str(pipeline["fit"]), "--out", str(mine)], capsys)
    assert code == 2 and (mine / "report.md").read_text() == "my notes\n"


def test_report_midway_and_bad_input(pipeline, tmp_path, capsys):
    code, result, _ = _json(
        ["report", "--prereg", str(pipeline["prereg"]), "--run", str(pipeline["half"]), "--out", str(tmp_path / "mid")],
        capsys,
    )
    assert code == 0 and result["check"]["verdict"] == "on-track"
    text = (tmp_path / "mid" / "report.md").read_text()
    assert "What the seal judges: each eval against the sealed trajectory's 90% band" in text
    for args, message in (
        (["--out", str(tmp_path / "a")], "give at least one of"),
        (
            ["--fit", str(pipeline["fit"]), "--run", str(pipeline["log"]), "--out", str(tmp_path / "b")],
            "give --prereg too",
        ),
        (
            [
                "--prereg",
                str(pipeline["prereg"]),
                "--run",
                str(pipeline["half"]),
                "--finished",
                "--out",
                str(tmp_path / "c"),
            ],
            "declared finished",
        ),
        (
            [
                "--prereg",
                str(pipeline["prereg"]),
                "--run",
                str(pipeline["log"]),
                "--log-loss-col",
                "val",
                "--out",
                str(tmp_path / "d"),
            ],
            "column 'val' (mapped to the eval loss) not found",
        ),
    ):
        code, _, err = _json(["report", *args], capsys)
        assert code == 2 and message in err, (args, err)
        assert not (Path(args[-1]) / "report.md").exists()
