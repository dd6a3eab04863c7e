"""`delphi ladder recipe-check --prior DIR`: an earlier check's runs are LR-sweep points of a
retuned recipe (delphi.ladder.recipe_check_plan: load_priors, plan_check; delphi.ladder.
recipe_check_analysis: analyse). The prior runs are fabricated from the configs their check planned
plus a summary in the format `completed_val_loss` reads: the planner and the analyser are under
test, not the trainer."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.errors import DelphiError
from delphi.ladder.manifest import RUNS_DIR
from delphi.ladder.recipe_check import PLAN_FILE
from delphi.ladder.recipe_check_analysis import analyse
from delphi.ladder.recipe_check_plan import (
    BATCH_PRIOR_MATCH,
    RUN_IDENTITY_KEYS,
    load_priors,
    plan_check,
    reuse_identity,
    write_check,
)
from delphi.ladder.recipe_check_report import RUNS_CSV, save_report
from delphi.ladder.spec import ladder_spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
V8 = ROOT / "studies" / "ladder_paper_v8.yaml"
CURVATURE = 0.02  # nats per octave^2 of LR off the optimum (the synthetic losses' parabola)
LOSS_OPT = 1.5


# The recipe these tests were designed on (the first check's constants), pinned so that a retune of
# the live spec (its batch halvings at lr_max move which points can reuse a prior) cannot move them.
FIRST_CHECK_RECIPE = {
    "lr": 2.68e-3,
    "horizon_exponent": 0.3,
    "width_exponent": 0.0,
    "lr_max": 0.01,
    "target_steps": 4096,
}
FIRST_CHECK_HORIZONS = [3.2e5, 1.9e6, 1.1e7, 6.0e7]  # and its points (the live spec has gained two since)
FIRST_LADDER = {"budgets": [3.0e11, 7.2e11, 1.7e12, 4.2e12, 1.0e13]}  # and its ladder (the live one grew two below)


def _first_ladder(data: dict) -> dict:
    data["isoflop"].pop("center_at", None)
    return data | FIRST_LADDER


def _spec_file(tmp_path: Path, name: str, lr_factor: float = 1.0, **check_changes) -> tuple:
    data = _first_ladder(yaml.safe_load(V8.read_text()))
    for key, value in FIRST_CHECK_RECIPE.items():
        data["recipe"][key] = {"value": value, "source": "test: the first recipe check's constants"}
    data["recipe"]["lr"]["value"] *= lr_factor
    data["recipe"]["check"].update({"horizons": FIRST_CHECK_HORIZONS, **check_changes})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return ladder_spec_from_dict(data), path


def _loss(x_new: float, batch_multiplier: float = 1.0) -> float:
    """The synthetic loss of a run at x_new times the NEW recipe's LR (its optimum) and batch."""
    return LOSS_OPT + CURVATURE * math.log2(x_new) ** 2 + 0.01 * math.log2(batch_multiplier) ** 2


def _finish(check_dir: Path, run_id: str, loss: float) -> None:
    """A run dir as the trainer leaves it: its config, a completed status and summary."""
    run_dir = check_dir / RUNS_DIR / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(check_dir / "configs" / f"{run_id}.yaml", run_dir / "config.yaml")
    (run_dir / "status.json").write_text(json.dumps({"status": "completed"}))
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "val_loss": loss}))


@pytest.fixture(scope="module")
def prior_check(tmp_path_factory) -> Path:
    """The first check (recipe LR eta0), every run finished; its optimum is at 2x its recipe's LR."""
    tmp = tmp_path_factory.mktemp("prior")
    spec, _ = _spec_file(tmp, "old")
    out = tmp / "check_old"
    write_check(spec, out)
    for r in json.loads((out / PLAN_FILE).read_text())["check_runs"]:
        _finish(out, r["run_id"], _loss(r["lr_multiplier"] / 2, r["batch_multiplier"]))
    return out


def test_a_retune_moves_only_the_projection_lr():
    """The premise: at every point the retuned recipe's run equals the old one but for optim.lr
    (where no lr_max cap halves the batch: twice the LR would at the live spec's 1.5e8-token point)."""
    data = _first_ladder(yaml.safe_load(V8.read_text()))
    data["recipe"]["check"]["horizons"] = FIRST_CHECK_HORIZONS
    old = ladder_spec_from_dict(data)
    for key, value in (("lr", 2 * data["recipe"]["lr"]["value"]), ("horizon_exponent", 0.2), ("width_exponent", 0.1)):
        changed = json.loads(json.dumps(data))
        changed["recipe"][key]["value"] = value
        new = ladder_spec_from_dict(changed)
        old_rungs = {r.run_id: r for r in plan_check(old)[0]}
        new_rungs = {r.run_id: r for r in plan_check(new)[0]}
        x1 = [run_id for run_id in old_rungs if "_x1_" in run_id]
        assert x1 and set(x1) <= set(new_rungs)
        for run_id in x1:
            a, b = old_rungs[run_id].train, new_rungs[run_id].train
            assert reuse_identity(a) == reuse_identity(b), (key, run_id)
            assert a.optim.adam_lr == b.optim.adam_lr and a.optim.eps == b.optim.eps and a.optim.beta2 == b.optim.beta2
        assert any(old_rungs[i].train.optim.lr != new_rungs[i].train.optim.lr for i in x1)


def test_identity_leaves_out_the_trainers_maths_free_keys():
    from delphi.train.trainer import MATHS_FREE_KEYS

    assert set(MATHS_FREE_KEYS) <= set(RUN_IDENTITY_KEYS)


def test_retuned_by_2x_trains_the_recipes_seeds_and_the_new_4x_only(prior_check, tmp_path):
    spec, _ = _spec_file(tmp_path, "new", lr_factor=2.0)
    out = tmp_path / "check_new"
    rungs, runs, summary = write_check(spec, out, [str(prior_check)])
    points = {r.point for r in runs if r.kind != "batch"}
    assert len(points) == 7
    own = [r for r in runs if not r.source]
    for point in points:
        trained = sorted((r.lr_multiplier, r.seed) for r in own if r.point == point and r.kind != "batch")
        # the recipe's value at both seeds (the gate's), and 4x: the old grid covers 0.25 .. 2
        assert trained == [(1.0, 0), (1.0, 1), (4.0, 0)], point
        reused = sorted(r.lr_multiplier for r in runs if r.point == point and r.source and r.kind != "batch")
        # the old 0.25 .. 4 at half the new LR; the old recipe's two seeds both land at 0.5
        assert reused == [0.125, 0.25, 0.5, 0.5, 1.0, 2.0], point
    # the prior's batch runs sit at half the new recipe's LR (> BATCH_PRIOR_MATCH away): trained again
    assert 2.0 > BATCH_PRIOR_MATCH and sum(r.kind == "batch" for r in own) == 4
    assert not any(r.kind == "batch" for r in runs if r.source)
    assert len(rungs) == 7 * 3 + 4
    assert summary["reused_runs"] == 42 and summary["priors"][0]["dir"] == str(prior_check)
    assert summary["priors"][0]["not_ended"] == 0 and summary["reused_flops"] > summary["check_flops"] * 0.5
    # nothing is copied: the new directory holds only its own runs' configs
    assert len(list((out / "configs").iterdir())) == len(rungs)
    # a rerun with the same prior plans the same (idempotent)
    manifest, plan = (out / "manifest.csv").read_text(), (out / PLAN_FILE).read_text()
    write_check(spec, out, [str(prior_check)])
    assert (out / "manifest.csv").read_text() == manifest and (out / PLAN_FILE).read_text() == plan

    # the analysis: the union of own and prior runs; the recipe now sits at the optimum
    own_loss = {}
    for r in own:
        loss = _loss(r.lr_multiplier, r.batch_multiplier)
        if r.point == "d64@7e+05" and r.lr_multiplier == 1.0 and r.kind != "batch":
            loss += 0.001 * r.seed  # seed noise: the recipe's loss is this check's own seed mean
        own_loss[r.run_id] = loss
        _finish(out, r.run_id, loss)
    report = analyse(spec, out)
    assert report["complete"] and report["priors"] == summary["priors"]
    for p in report["points"]:
        if p["swept"] != "lr":
            continue
        assert sorted(p["x"]) == [0.125, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0, 2.0, 4.0]
        assert p["prior_runs"] == 6 and p["runs"] == 9 and p["interior"]
        if p["point"] == "d64@7e+05":
            assert p["loss_at_recipe"] == pytest.approx(LOSS_OPT + 0.0005, abs=1e-12)  # own seeds only
            assert p["seed_sd"] == pytest.approx(0.001 / math.sqrt(2))
        else:
            assert p["m_opt"] == pytest.approx(1.0, rel=1e-6) and abs(p["lost_frac"]) < 1e-9
    assert abs(report["drift"]["a"]) < 1e-3
    assert report["recipe_suggested"]["lr"] == pytest.approx(spec.recipe.lr.value, rel=1e-3)
    save_report(report, out)
    rows = (out / RUNS_CSV).read_text().splitlines()
    assert rows[0].endswith(",source") and len(rows) == 1 + len(runs)
    assert sum(row.endswith("," + str(prior_check)) for row in rows) == 42


def test_a_retune_off_the_octaves_reuses_the_nearest_priors(prior_check, tmp_path):
    """Retuned by 1.5x, the old grid lands at 1/6 .. 8/3 of the new LR: each of 0.25, 0.5 and 2 keeps a
    prior within PRIOR_MATCH (4/3 away), 4 does not (8/3 is 1.5 away): only it and the seeds train."""
    spec, _ = _spec_file(tmp_path, "new", lr_factor=1.5)
    out = tmp_path / "check_new"
    _, runs, _ = write_check(spec, out, [str(prior_check)])
    for point in {r.point for r in runs if r.kind != "batch"}:
        trained = sorted(
            (r.lr_multiplier, r.seed) for r in runs if r.point == point and not r.source and r.kind != "batch"
        )
        assert trained == [(1.0, 0), (1.0, 1), (4.0, 0)], point
        reused = sorted(r.lr_multiplier for r in runs if r.point == point and r.source)
        assert reused == pytest.approx([1 / 6, 1 / 3, 2 / 3, 2 / 3, 4 / 3, 8 / 3], rel=1e-9)
    # the optimum stays at 2x the old recipe's LR = 4/3 of the new: the fit through the union (off the
    # grid) finds it, and the loss the new recipe leaves there
    for r in runs:
        if not r.source:
            _finish(out, r.run_id, _loss(r.lr_multiplier * 1.5 / 2, r.batch_multiplier))
    report = analyse(spec, out)
    for p in (p for p in report["points"] if p["swept"] == "lr"):
        assert p["m_opt"] == pytest.approx(4 / 3, rel=1e-6) and p["interior"]
        assert p["lost_frac"] == pytest.approx(CURVATURE * math.log2(0.75) ** 2 / LOSS_OPT, rel=1e-6)


def test_a_prior_of_another_shape_or_horizon_is_not_reused(prior_check, tmp_path):
    spec, _ = _spec_file(tmp_path, "new", lr_factor=2.0)
    # one prior run of another depth: its config differs outside optim.lr
    altered = tmp_path / "check_old"
    shutil.copytree(prior_check, altered)
    plan = json.loads((altered / PLAN_FILE).read_text())
    victim = next(r for r in plan["check_runs"] if r["point"] == "d64@7e+05" and r["lr_multiplier"] == 4.0)
    config_path = altered / RUNS_DIR / victim["run_id"] / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["model"]["n_layers"] += 1
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    _, runs = plan_check(spec, load_priors(spec, [str(altered)]))
    trained = sorted(r.lr_multiplier for r in runs if r.point == "d64@7e+05" and not r.source and r.kind == "width")
    assert trained == [1.0, 1.0, 2.0, 4.0]  # its 2x (the old 4x) is trained again
    assert victim["run_id"] not in {r.run_id for r in runs if r.source}

    # a prior check at another width horizon (its check points differ: allowed), whose width runs train
    # other tokens: only its horizon points are reused
    other, _ = _spec_file(tmp_path, "other", width_tokens=5.0e5)
    write_check(other, tmp_path / "check_other")
    _, runs = plan_check(spec, load_priors(spec, [str(tmp_path / "check_other")]))
    assert not any(r.source for r in runs if r.kind == "width")
    horizon_points = {r.point for r in runs if r.kind == "horizon"}
    assert all(sum(1 for r in runs if r.point == p and r.source) == 6 for p in horizon_points)
    assert sum(1 for r in runs if r.kind == "width" and not r.source) == 3 * 6


def test_a_prior_that_is_no_check_of_this_spec_is_exit_2(prior_check, tmp_path, capsys):
    _, path = _spec_file(tmp_path, "new", lr_factor=2.0)
    out = tmp_path / "out"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.csv").write_text("run_id\n")
    assert cli_main(["ladder", "recipe-check", str(path), "--out", str(out), "--prior", str(plain), "--plan-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"delphi: error: --prior {plain}: not a recipe-check directory")
    assert len(err.splitlines()) == 1 and not out.exists()
    # a check of another ladder spec (its evaluations differ): refused, naming the key
    data = yaml.safe_load(V8.read_text())
    data["run"]["eval_tokens"] = 65536
    another = ladder_spec_from_dict(data)
    write_check(another, tmp_path / "check_another")
    assert (
        cli_main(
            [
                "ladder",
                "recipe-check",
                str(path),
                "--out",
                str(out),
                "--prior",
                str(tmp_path / "check_another"),
                "--plan-only",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert f"--prior {tmp_path / 'check_another'}:" in err and "run.eval_tokens" in err and len(err.splitlines()) == 1
    assert not out.exists()
    # the CLI with a good prior: plans 25 runs and names what it reuses
    assert (
        cli_main(
            [
                "ladder",
                "recipe-check",
                str(path),
                "--out",
                str(out),
                "--prior",
                str(prior_check),
                "--plan-only",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] == 25 and result["reused_runs"] == 42


def test_a_ladder_that_grows_a_budget_keeps_its_checks(prior_check, tmp_path):
    """Budgets and isoFLOP placement choose rungs, not a check run's config: the eighth edition's
    ladder grew two budgets below it after its checks ran (docs/notebook.md §8.20), and kept them."""
    old = yaml.safe_load((prior_check / "ladder.yaml").read_text())
    live = yaml.safe_load(V8.read_text())
    check = {
        **old["recipe"]["check"],
        "horizons": [3.7e4, *old["recipe"]["check"]["horizons"]],
    }  # down to its new rungs
    grown = ladder_spec_from_dict(
        {
            **old,
            "budgets": live["budgets"],
            "recipe": {**old["recipe"], "check": check},
            "isoflop": {**old["isoflop"], "center_at": live["isoflop"]["center_at"]},
        }
    )
    _, runs, summary = write_check(grown, tmp_path / "as_prior", priors=[prior_check])
    assert summary["reused_runs"] > 0 and {r.source for r in runs if r.source} == {str(prior_check)}
    in_place = tmp_path / "in_place"
    shutil.copytree(prior_check, in_place)
    write_check(grown, in_place)  # extends where it stands; a change of eval tokens would be refused
    assert yaml.safe_load((in_place / "ladder.yaml").read_text())["budgets"] == live["budgets"]
    with pytest.raises(DelphiError, match="holds a recipe check of another ladder spec"):
        write_check(ladder_spec_from_dict({**old, "run": {**old["run"], "eval_tokens": 65536}}), in_place)
