"""A forecast sealed from what a lab knows: `delphi prereg create` with the hero given as N and D (or a
compute budget the fit sizes), the results table read with `delphi fit`'s column mapping, and gates
that judge what an external table holds.

Data: the public isoFLOP table tests/data/isoflops.csv (provenance in tests/data/README.md), one
source at a time: Llama 3's exp_loss sweep (a forecast at 10x its top budget that every judged gate
passes) and Marin's dclm sweep (one whose laws disagree at 10x: refused). Bad input is exit 2, one
line, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_backtest_calibrated import _run  # (code, stdout, stderr) of one `delphi` command

from delphi import prereg_format as fmt
from delphi.cli import main
from delphi.fits import load_fit
from delphi.prereg import gates as gt
from delphi.prereg.index import gates_cell

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
LLAMA = "experiment == 'llama_3__exp_loss' and not outlier"
DCLM = "source == 'marin_202603' and dataset == 'dclm' and not outlier"
NOT_APPLICABLE = {"rung_health", "seeds", "hero_depth"}


def _refused(code: int, err: str, *names: str) -> None:
    """Exit 2 with one error line naming each of `names`."""
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("delphi: error:")]
    assert len(lines) == 1 and all(n in lines[0] for n in names), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("llama")
    fit = root / "fit.json"
    assert (
        main(
            ["fit", "vpnls", str(ISOFLOPS), "--query", LLAMA, "--bootstrap", "40", "--workers", "1", "--out", str(fit)]
        )
        == 0
    )
    top = load_fit(fit).fitted_compute[1]
    n, d = (load_fit(fit).predict(compute=10 * top)[k] for k in ("params", "tokens"))
    return {"root": root, "fit": fit, "top": top, "params": n, "tokens": d}


def test_a_good_forecast_from_a_public_sweep_seals_without_force(llama, capsys) -> None:
    """The tutorial's path: a 10x hero given by N and D on a public sweep, every gate the table can
    hold judged and passed, the ladder-only gates not applicable, no --force."""
    out = llama["root"] / "preregistrations" / "hero-10x.yaml"
    code, stdout, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            llama["fit"],
            "--results",
            ISOFLOPS,
            "--query",
            LLAMA,
            "--hero-params",
            f"{llama['params']:.6g}",
            "--hero-tokens",
            f"{llama['tokens']:.6g}",
            "--out",
            out,
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    doc = fmt.read(out)
    assert fmt.seal_status(doc)["ok"] and doc["forced"] is False
    gates = {g["name"]: gt.Gate.from_json(g) for g in doc["gates"]}
    assert {n for n, g in gates.items() if not g.applicable} == NOT_APPLICABLE
    assert all(g.passed for g in gates.values() if g.applicable)
    for name in NOT_APPLICABLE:
        assert not gates[name].passed and gates[name].detail.startswith("not applicable: ")
        assert f"N/A {name}: not applicable" in err
    assert "| rung_health | N/A |" in gt.gate_table(doc["gates"])
    assert gates_cell(doc) == f"all {len(gates) - 3} passed (3 not applicable)"  # the index's gates column
    report = json.loads(out.with_name("hero-10x.gates.json").read_text())
    assert report["passed"] and report["failed"] == [] and set(report["not_applicable"]) == NOT_APPLICABLE
    # The hero as used: N, D, C, sealed and printed.
    hero = doc["hero"]
    assert hero["config"] is None and hero["params"] == pytest.approx(float(f"{llama['params']:.6g}"))
    assert hero["flops"] == pytest.approx(6 * hero["params"] * hero["tokens"]) and "6ND" in hero["flops_how"]
    assert f"hero: N = {hero['params']:.4g}, D = {hero['tokens']:.4g}" in err
    # A table like the calibration's sources: the calibrated centre decides, the law's own beside it.
    final = doc["prediction"]["final"]
    assert final["point"]["decides"] == "calibrated" and final["loss"] == pytest.approx(final["calibrated"]["loss"])
    assert (
        final["law"]["loss"] > final["loss"]
    )  # VPNLS is pessimistic on every public source: the calibration lowers it
    assert json.loads(stdout)["hero"]["tokens"] == hero["tokens"]
    assert doc["provenance"]["results_reading"]["query"] == LLAMA
    assert _run(["prereg", "verify", out], capsys)[0] == 0


def test_a_hero_sized_by_the_fit_at_a_compute_budget(llama, capsys) -> None:
    out = llama["root"] / "compute.yaml"
    code, stdout, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            llama["fit"],
            "--results",
            ISOFLOPS,
            "--query",
            LLAMA,
            "--hero-compute",
            str(10 * llama["top"]),
            "--out",
            out,
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    hero = fmt.read(out)["hero"]
    assert hero["params"] == pytest.approx(llama["params"]) and hero["tokens"] == pytest.approx(llama["tokens"])
    assert hero["flops"] == pytest.approx(10 * llama["top"]) and "allocation" in hero["given"]


def test_the_column_mapping_of_fit_reads_a_lab_table(llama, tmp_path, capsys) -> None:
    """The same rows under a lab's own column names, mapped by fit's flags, seal the same forecast."""
    raw = pd.read_csv(ISOFLOPS)
    rows = raw[(raw["experiment"] == "llama_3__exp_loss") & ~raw["outlier"]]
    lab = rows.rename(columns={"params": "n_params", "tokens": "train_tokens", "loss": "eval_loss", "budget": "C"})
    table = tmp_path / "lab.csv"
    lab[["n_params", "train_tokens", "eval_loss", "C"]].to_csv(table, index=False)
    mapping = [
        "--params-col",
        "n_params",
        "--tokens-col",
        "train_tokens",
        "--loss-col",
        "eval_loss",
        "--budget-col",
        "C",
    ]
    fit = tmp_path / "fit.json"
    assert _run(["fit", "vpnls", table, *mapping, "--bootstrap", "40", "--workers", "1", "--out", fit], capsys)[0] == 0
    hero = ["--hero-params", f"{llama['params']:.6g}", "--hero-tokens", f"{llama['tokens']:.6g}"]
    code, _, err = _run(
        ["prereg", "create", "--fit", fit, "--results", table, *mapping, *hero, "--out", tmp_path / "lab.yaml"], capsys
    )
    assert code == 0, err
    ours = fmt.read(llama["root"] / "preregistrations" / "hero-10x.yaml")["prediction"]["final"]
    assert fmt.read(tmp_path / "lab.yaml")["prediction"]["final"]["law"]["loss"] == pytest.approx(
        ours["law"]["loss"], rel=1e-9
    )
    # Without the mapping the table has no params column: exit 2 naming it and the flag, nothing written.
    code, _, err = _run(
        ["prereg", "create", "--fit", fit, "--results", table, *hero, "--out", tmp_path / "no.yaml"], capsys
    )
    _refused(code, err, "lab.csv", "'params'", "--params-col")
    assert not (tmp_path / "no.yaml").exists() and not (tmp_path / "no.gates.json").exists()
    # A mapping to a column that is not there: exit 2 naming the column, nothing written.
    code, _, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            fit,
            "--results",
            table,
            *mapping[:-1],
            "budget_flops",
            *hero,
            "--out",
            tmp_path / "no.yaml",
        ],
        capsys,
    )
    _refused(code, err, "'budget_flops'", "not found")
    assert not (tmp_path / "no.yaml").exists() and not (tmp_path / "no.gates.json").exists()


def test_a_weak_forecast_from_a_public_sweep_is_refused(tmp_path, capsys) -> None:
    """Marin's dclm sweep at 10x: VPNLS and the isoFLOP law, each at its calibrated centre, are 3.5% apart
    (their own points 6.9%): gate method_agreement refuses (exit 1); the not-applicable gates are no failure."""
    fit = tmp_path / "fit.json"
    assert (
        main(["fit", "vpnls", str(ISOFLOPS), "--query", DCLM, "--bootstrap", "40", "--workers", "1", "--out", str(fit)])
        == 0
    )
    out = tmp_path / "weak.yaml"
    code, _, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            fit,
            "--results",
            ISOFLOPS,
            "--query",
            DCLM,
            "--hero-compute",
            str(10 * load_fit(fit).fitted_compute[1]),
            "--out",
            out,
        ],
        capsys,
    )
    assert code == 1 and not out.exists(), err
    report = json.loads(out.with_name("weak.gates.json").read_text())
    assert "method_agreement" in report["failed"] and not set(report["failed"]) & NOT_APPLICABLE
    assert set(report["not_applicable"]) == NOT_APPLICABLE


@pytest.mark.parametrize(
    "hero, names",
    [
        (["--hero-tokens", "1e11"], ("--hero-params", "missing")),
        (["--hero-params", "1e10"], ("--hero-tokens", "missing")),
        (["--hero-params", "0", "--hero-tokens", "1e11"], ("--hero-params", "positive")),
        (["--hero-params=-5e9", "--hero-tokens", "1e11"], ("--hero-params", "positive")),
        (["--hero-params", "1e10", "--hero-tokens", "nan"], ("--hero-tokens", "positive")),
        (["--hero-params", "ten", "--hero-tokens", "1e11"], ("--hero-params", "'ten'")),
        (["--hero-params", "1e10", "--hero-tokens", "1e11", "--hero-flops", "-1"], ("--hero-flops", "positive")),
        (["--hero-compute", "1e22", "--hero-params", "1e10"], ("--hero-params", "--hero-compute")),
        (["--hero-compute", "0"], ("--hero-compute", "positive")),
        ([], ("--hero HERO.yaml", "--hero-params N --hero-tokens D")),
    ],
)
def test_a_hero_with_n_or_d_missing_or_not_positive_is_refused(llama, tmp_path, capsys, hero, names) -> None:
    out = tmp_path / "bad.yaml"
    code, _, err = _run(
        ["prereg", "create", "--fit", llama["fit"], "--results", ISOFLOPS, "--query", LLAMA, *hero, "--out", out],
        capsys,
    )
    _refused(code, err, *names)
    assert list(tmp_path.iterdir()) == []


def test_other_bad_input_is_refused_before_anything_is_written(llama, tmp_path, capsys) -> None:
    hero = ["--hero-params", "1e10", "--hero-tokens", "1e11"]
    code, _, err = _run(
        ["prereg", "create", "--fit", llama["fit"], "--query", LLAMA, *hero, "--out", tmp_path / "x.yaml"], capsys
    )
    _refused(code, err, "--query", "--results")
    config = tmp_path / "hero.yaml"
    config.write_text("model: {d_model: 64, n_layers: 2, n_heads: 4}\n")
    code, _, err = _run(
        ["prereg", "create", "--fit", llama["fit"], "--hero", config, *hero, "--out", tmp_path / "x.yaml"], capsys
    )
    _refused(code, err, "--hero", "one way")
    frontier = tmp_path / "frontier.json"
    assert main(["fit", "frontier", str(ISOFLOPS), "--query", LLAMA, "--out", str(frontier)]) == 0
    code, _, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            frontier,
            "--results",
            ISOFLOPS,
            "--query",
            LLAMA,
            "--hero-compute",
            "1e22",
            "--out",
            tmp_path / "x.yaml",
        ],
        capsys,
    )
    _refused(code, err, "--hero-compute", "no allocation")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier.json", "hero.yaml"]


def test_not_applicable_is_recorded_and_never_a_pass() -> None:
    judged = gt.Gate("backtest", True, 0.001, "t", "ok")
    na = gt.not_applicable("rung_health", "t", "an external table")
    failed = gt.Gate("seeds", False, 1, "t", "one seed")
    assert gt.all_passed([judged, na]) and not gt.all_passed([judged, na, failed])
    assert gt.failed_names([judged, na, failed]) == ["seeds"] and gt.not_applicable_names([judged, na]) == [
        "rung_health"
    ]
    assert na.to_json()["applicable"] is False and na.to_json()["passed"] is False
    assert "applicable" not in judged.to_json()  # a judged gate's JSON is what it always was
    assert gt.Gate.from_json(na.to_json()) == na and gt.Gate.from_json(judged.to_json()) == judged
    assert gt.gate_lines([na])[0].startswith("N/A rung_health: not applicable")


def test_a_delphi_ladder_keeps_judging_its_own_records(tmp_path, capsys) -> None:
    """On Delphi's own ladder (its dir given) nothing is 'not applicable': missing records fail as
    before, a hero given as N and D cannot pass the gates that need its config, and the law's own
    point decides (the public calibration does not transfer to Delphi's ladders)."""
    import prereg_synthetic as ps

    ladder = ps.write_ladder(tmp_path / "ladder")
    fit = ps.write_fit(ladder, tmp_path / "fit.json")
    hero = ps.write_hero(tmp_path / "hero.yaml", ps.hero_config())
    code, _, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            fit,
            "--hero",
            hero,
            "--ladder",
            ladder,
            "--out",
            tmp_path / "c.yaml",
            "--bootstrap",
            "0",
            "--force",
        ],
        capsys,
    )
    assert code == 0, err
    doc = fmt.read(tmp_path / "c.yaml")
    assert all(g.get("applicable", True) for g in doc["gates"])
    final = doc["prediction"]["final"]
    assert final["point"]["decides"] == "law" and "Delphi's own ladder" in final["point"]["why"] and "law" not in final
    # The config's shape is printed with its N: a default the config left out (d_ff) is visible.
    m = doc["hero"]["config"]["model"]
    assert f"hero: N = {doc['hero']['params']:.4g}" in err and f"d_ff {m['d_ff']}" in err
    n, d = doc["hero"]["params"], doc["hero"]["tokens"]
    code, _, err = _run(
        [
            "prereg",
            "create",
            "--fit",
            fit,
            "--hero-params",
            str(n),
            "--hero-tokens",
            str(d),
            "--ladder",
            ladder,
            "--out",
            tmp_path / "nd.yaml",
            "--bootstrap",
            "0",
            "--force",
        ],
        capsys,
    )
    assert code == 0, err
    nd = fmt.read(tmp_path / "nd.yaml")
    assert all(g.get("applicable", True) for g in nd["gates"])
    assert nd["prediction"]["final"]["loss"] == pytest.approx(
        final["loss"], rel=1e-9
    )  # the same law at the same N and D
    assert yaml.safe_load((tmp_path / "nd.yaml").read_text())["hero"]["config"] is None


def test_a_hero_given_as_n_and_d_cannot_pass_a_ladders_config_gates() -> None:
    """On a Delphi ladder's records the steps, batch and depth gates could have been judged from the
    hero's config: given as N and D they fail (not evaluated), and are never 'not applicable'."""
    from test_gates import ladder_table

    from delphi.prereg.hero import HeroSpec

    table = ladder_table()
    hero = HeroSpec(1e5, 2e6, 1.2e12, "--hero-params, --hero-tokens", "6ND")
    ranges = gt.gate_hero_ranges(hero.facts(), gt.ladder_ranges(table), 0.01)
    depth = gt.gate_hero_depth(table, None, 2.0)
    for gate in (ranges, depth):
        assert gate.applicable and not gate.passed and "given as N and D" in gate.detail
    # The same table read as external: tokens per parameter judged, steps and batch named as not judged.
    external = gt.gate_hero_ranges(hero.facts(), gt.ladder_ranges(table), 0.01, external=True)
    assert (
        external.applicable
        and "tokens_per_param" in external.detail
        and "not judged: steps, batch_tokens" in external.detail
    )
