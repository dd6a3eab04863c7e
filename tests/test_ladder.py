"""Ladder planning, validation, hero, and the runner/collector on a micro ladder."""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.errors import DelphiError
from delphi.ladder.collect import relaxed_bounds
from delphi.ladder.family import flops_family
from delphi.ladder.hero import HERO_MAX_OFF_OPTIMUM, depths_near_optimum, hero_preflight, hero_ranges, plan_hero
from delphi.ladder.manifest import manifest_row, read_manifest
from delphi.ladder.plan import (
    batch_for_tokens,
    cell_id_of,
    expected_optimum,
    layers_for_width,
    make_rung,
    plan_ladder,
    shape_for_width,
    transfer,
)
from delphi.ladder.plan_report import evals_of, plan_health_warnings
from delphi.ladder.spec import ladder_spec_from_dict, load_ladder_spec
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "studies" / "ladder_tiny.yaml"
CPU = ROOT / "studies" / "ladder_cpu.yaml"
DEFAULT = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
PAPER = ROOT / "studies" / "ladder_paper.yaml"
PAPER_V4 = ROOT / "studies" / "ladder_paper_v4.yaml"
PAPER_V8 = ROOT / "studies" / "ladder_paper_v8.yaml"


def _raw(path: Path = TINY) -> dict:
    return yaml.safe_load(path.read_text())


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("path", [TINY, CPU])
def test_shipped_specs_plan_on_budget(path):
    spec = load_ladder_spec(path)
    rungs = plan_ladder(spec)
    assert spec.budgets[-1] / spec.budgets[0] >= 30 and len(spec.budgets) >= 4
    for budget in spec.budgets:
        curve = [r for r in rungs if r.budget == budget and r.seed == spec.seeds_for(budget)[0]]
        assert len(curve) == spec.isoflop.sizes
        n = [r.params for r in curve]
        assert max(n) / min(n) >= spec.isoflop.min_span  # spread over >= 8x in N
        assert len({r.batch_size for r in curve}) == 1  # one batch per budget: no confound along the curve
        for r in curve:
            assert abs(r.flops / budget - 1) <= 0.01  # every rung within 1% of its budget
            assert r.steps >= spec.batch.min_steps * 0.99
            assert r.flops == pytest.approx(r.tokens * flops_per_token(r.model, spec.seq_len))
            assert r.model.mup.base_d_model == spec.base.d_model and r.model.mup.enabled
            assert (r.model.moe is not None) == (spec.shape.moe is not None)


def test_plan_cli_writes_loadable_configs_and_manifest(tmp_path, capsys):
    out = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(TINY), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = read_manifest(out)
    assert len(rows) == len(result["rungs"]) == 20 and result["max_flops_error"] <= 0.01
    for row in rows:
        cfg = load_train_config(out / row["config"])  # a runnable TrainConfig
        assert cfg.name == row["run_id"] and cfg.steps == int(row["steps"])
        assert cfg.tokens == int(row["tokens"]) and cfg.data.batch_size == int(row["batch_size"])
        assert count_params(cfg.model).nonembedding == int(row["params"])
        assert abs(float(row["flops"]) / float(row["budget"]) - 1) <= 0.01
        assert cfg.optim.lr == pytest.approx(float(row["lr"]))
        # log/eval/checkpoint periods share a divisor with steps so the trainer can fuse steps
        assert math.gcd(cfg.steps, cfg.log_every, cfg.eval_every, cfg.checkpoint_every) >= 2
    assert (out / "ladder.yaml").is_file()
    # Re-planning the same spec into the same directory is a no-op; a different ladder is refused.
    assert cli_main(["ladder", "plan", str(TINY), "--out", str(out)]) == 0
    assert cli_main(["ladder", "plan", str(CPU), "--out", str(out)]) == 2


def test_transfer_recipe():
    spec = load_ladder_spec(TINY)
    base = spec.base
    hp = transfer(spec, base.d_model, base.batch_tokens, base.tokens)
    assert hp.lr == pytest.approx(base.lr) and hp.beta2 == pytest.approx(0.95)
    hp = transfer(spec, 32, 4 * base.batch_tokens, base.tokens / 10)
    assert hp.lr == pytest.approx(base.lr * 2.0 * 10**0.3)  # sqrt(4) batch x (T0/T)^0.3 horizon
    assert hp.beta2 == pytest.approx(max(0.95**4, 0.9))
    hp = transfer(spec, 32, base.batch_tokens // 4, base.tokens)
    assert hp.beta2 == pytest.approx(0.95**0.25)
    # Batch: largest power of two keeping >= min_steps steps, clipped to the allowed range.
    per_seq = spec.batch.min_steps * spec.seq_len
    assert batch_for_tokens(spec, per_seq * 20) == 16
    assert batch_for_tokens(spec, per_seq * 1000) == spec.batch.max_seqs
    assert batch_for_tokens(spec, per_seq * (spec.batch.min_seqs - 1)) is None
    # Shape family: narrow widths get one head and min_layers; marin depth rule.
    m = shape_for_width(spec, 12)
    assert (m.n_heads, m.n_layers, m.d_head) == (1, 2, 12)
    raw = _raw()
    raw["shape"]["depth"] = {"rule": "marin", "ratio": 1, "min_layers": 1, "max_layers": 64}
    marin = ladder_spec_from_dict(raw)
    assert layers_for_width(marin, 512) == round(512 / (64 + 4 * 9 - 9))
    assert layers_for_width(marin, 2048) == round(2048 / (64 + 4 * 11 - 9))


def test_batch_rule_per_rung():
    raw = _raw()
    raw["batch"]["rule"] = "rung"
    rungs = plan_ladder(ladder_spec_from_dict(raw))
    spec = ladder_spec_from_dict(raw)
    for r in rungs:  # each rung's batch from its own tokens: min_steps <= steps < 2 min_steps unless clipped
        assert r.batch_size == batch_for_tokens(spec, r.budget / r.flops_per_token)
        assert r.steps >= spec.batch.min_steps * 0.99
        assert r.steps < 2 * spec.batch.min_steps * 1.01 or r.batch_size in (spec.batch.min_seqs, spec.batch.max_seqs)


def test_tokens_per_param_mode():
    raw = _raw()
    raw["mode"] = "tokens_per_param"
    raw["tokens_per_param"] = {"ratio": 100.0, "max_ratio_error": 0.5}
    spec = ladder_spec_from_dict(raw)
    rungs = plan_ladder(spec)
    assert len(rungs) == len(spec.budgets)
    for r in rungs:
        assert 50 <= r.tokens / r.params <= 150 and abs(r.flops / r.budget - 1) <= 0.01
    assert [r.params for r in rungs] == sorted(r.params for r in rungs)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.update(budgets=[1e12, 1e12]), "budgets[1]"),
        (lambda d: d.update(budgets=[3e11, 1e11]), "budgets[1]"),
        (lambda d: d.update(budgets=[-1e12, 1e13]), "budgets[0]"),
        (lambda d: d.update(budgets=[1e8, 1e12]), "budgets[0]"),  # too small for the smallest shape
        (lambda d: d["shape"].update(widths=[16, 256]), "shape.widths"),  # cannot make 5 sizes
        (
            lambda d: d["isoflop"].update(sizes=3, span=10.0, min_span=10.0) or d["shape"].update(widths=[8, 64, 512]),
            "shape.widths",
        ),
        (lambda d: d["shape"].update(widthz=[8]), "shape.widthz"),
        (lambda d: d["transfer"]["beta2"].update(rule="sqrt"), "transfer.beta2.rule"),
        (lambda d: d["base"].update(lr=-1.0), "base.lr"),
        (lambda d: d["shape"].update(head_dim=15), "shape.head_dim"),
        (lambda d: d["shape"].update(n_heads=2, widths=[16, 18, 24, 32, 48, 64]), "shape.widths[1]"),  # 18 / 2 = 9: odd
        (lambda d: d.update(isoflop=None), "isoflop"),
        (lambda d: d["shape"].update(moe={"experts": 4, "top_k": 8}), "shape.moe.top_k"),
    ],
)
def test_bad_specs_name_the_field_and_write_nothing(tmp_path, capsys, edit, field):
    raw = copy.deepcopy(_raw())
    edit(raw)
    path = _write(tmp_path, raw)
    out = tmp_path / "ladder"
    with pytest.raises(DelphiError) as err:
        plan_ladder(load_ladder_spec(path))
    assert f"{field}:" in str(err.value)
    assert cli_main(["ladder", "plan", str(path), "--out", str(out)]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists()


def test_hero_from_fit(tmp_path, capsys):
    fit = {
        "kind": "parametric",
        "method": "vpnls",
        "params": {"E": 0.8, "A": 40.0, "B": 300.0, "alpha": 0.34, "beta": 0.3},
    }
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    out = tmp_path / "hero.yaml"
    args = [
        "ladder",
        "hero",
        "--fit",
        str(tmp_path / "fit.json"),
        "--compute",
        "3e14",
        "--spec",
        str(TINY),
        "--out",
        str(out),
        "--json",
    ]
    assert cli_main(args) == 0
    result = json.loads(capsys.readouterr().out)
    cfg = load_train_config(out)
    n = count_params(cfg.model).nonembedding
    assert n == result["params"] and 0.7 < n / result["predicted_params"] < 1.4
    flops = cfg.tokens * flops_per_token(cfg.model, cfg.data.seq_len)
    assert abs(flops / 3e14 - 1) <= 0.01 and cfg.model.mup.base_d_model == 64
    assert cfg.steps >= 300
    assert (
        cli_main(
            [
                "ladder",
                "hero",
                "--fit",
                str(tmp_path / "nope.json"),
                "--compute",
                "3e14",
                "--spec",
                str(TINY),
                "--out",
                str(tmp_path / "h2.yaml"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "h2.yaml").exists()


def _micro_spec(tmp_path: Path) -> Path:
    """Two rungs of a few seconds each on a small private store."""
    from delphi.data.store import prepare_store

    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(40):
        (src / f"m{i:02d}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(300)))
    prepare_store(str(src), tmp_path / "store")
    raw = _raw()
    raw.update(name="micro", mode="tokens_per_param", budgets=[1e9, 2e9], seq_len=32)
    raw["tokens_per_param"] = {"ratio": 2.0, "max_ratio_error": 0.9}
    raw["shape"]["widths"] = [8, 16]
    raw["batch"].update(min_steps=16, min_seqs=2, max_seqs=8)
    raw["run"].update(
        store=str(tmp_path / "store"), eval_tokens=512, evals_per_run=1, logs_per_run=2, checkpoints_per_run=2
    )
    return _write(tmp_path, raw)


def test_sigterm_stops_the_ladder_driver_and_its_rungs_together(tmp_path):
    """SIGTERM to `delphi ladder run` stops it as Ctrl-C does: the driver exits 130 only after its
    rung has stopped and said so (resumable), not leaving a worker training on alone."""
    import signal
    import time

    raw = yaml.safe_load(_micro_spec(tmp_path).read_text())
    raw["run"]["max_epochs"] = 1e6  # the rungs below are made long on a small store
    spec = _write(tmp_path, raw, "long.yaml")
    ladder = tmp_path / "ladder"
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}
    assert (
        subprocess.run(
            [sys.executable, "-m", "delphi.cli", "ladder", "plan", str(spec), "--out", str(ladder)],
            env=env,
            capture_output=True,
            timeout=120,
        ).returncode
        == 0
    )
    for row in read_manifest(ladder):  # long enough to be stopped mid-run
        config = ladder / row["config"]
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "steps": 100_000}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "delphi.cli", "ladder", "run", str(ladder), "--workers", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(ladder.glob("runs/*/status.json")):
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 130
    (status_path,) = ladder.glob("runs/*/status.json")
    status = json.loads(status_path.read_text())
    assert status["status"] == "failed" and "SIGTERM" in status["reason"] and "--resume" in status["reason"]


def test_runner_and_collect_micro_ladder(tmp_path):
    spec = _micro_spec(tmp_path)
    ladder = tmp_path / "ladder"
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}  # skip the per-run matmul peak measurement
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "delphi.cli", *a], env=env, capture_output=True, text=True, timeout=120
    )  # noqa: E731
    assert run("ladder", "plan", str(spec), "--out", str(ladder)).returncode == 0
    rows = read_manifest(ladder)
    assert len(rows) == 2

    # A rung whose lock is held elsewhere is never started twice: its worker exits EX_TEMPFAIL at once.
    (ladder / "locks").mkdir()
    lock_path = ladder / "locks" / f"{rows[0]['run_id']}.lock"
    with open(lock_path, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        worker = subprocess.run(
            [
                sys.executable,
                "-m",
                "delphi.ladder.runner",
                str(ladder / rows[0]["config"]),
                str(ladder / "runs" / rows[0]["run_id"]),
                str(lock_path),
                "",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 75 and not (ladder / "runs" / rows[0]["run_id"]).exists()

    first = run("ladder", "run", str(ladder), "--workers", "2", "--json")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["completed"] == 2 and not summary["failed"]
    assert "rungs done" in first.stderr and "ETA" in first.stderr

    # Lose one rung (as if killed before it started): a rerun trains only that one.
    kept = ladder / "runs" / rows[0]["run_id"] / "summary.json"
    kept_mtime = kept.stat().st_mtime_ns
    import shutil

    shutil.rmtree(ladder / "runs" / rows[1]["run_id"])
    second = run("ladder", "run", str(ladder), "--workers", "2", "--json")
    assert second.returncode == 0, second.stderr
    assert kept.stat().st_mtime_ns == kept_mtime
    assert rows[1]["run_id"] in second.stderr and f"{rows[0]['run_id']}: completed" not in second.stderr

    results = tmp_path / "results.csv"
    assert run("ladder", "collect", str(ladder), "--out", str(results)).returncode == 0
    table = pd.read_csv(results)
    assert list(table.columns[:8]) == [
        "params",
        "tokens",
        "flops",
        "loss",
        "budget",
        "run_id",
        "experts",
        "granularity",
    ]
    assert sorted(table["run_id"]) == sorted(r["run_id"] for r in rows)  # each rung exactly once
    assert (table["status"] == "completed").all() and table["loss"].between(0.1, 6.0).all()
    for _, r in table.iterrows():
        assert abs(r["flops"] / r["budget"] - 1) <= 0.01
        assert r["bpb"] == pytest.approx(r["loss"] / math.log(2))
        # Health from the real run's metrics.jsonl: one eval (the final one) on 512 tokens, dense (no drops).
        assert r["n_evals"] == 1 and r["eval_tokens"] == 512 and r["drop_frac_mean"] == 0.0
        assert not r["health_ok"] and "min_layers" in r["health_issues"] and "max_drop_frac" not in r["health_issues"]
        assert r["n_seeds"] == 1 and r["cell_id"] == cell_id_of(r["run_id"]) and r["role"] == "isoflop"
    assert (tmp_path / "results.csv.family.json").is_file()


def test_run_refuses_a_store_too_small_and_collect_filters_incomplete(tmp_path, capsys):
    """`ladder plan` reads no store; `ladder run` checks it before any rung trains (exit 2, nothing trained)."""
    spec_path = _micro_spec(tmp_path)
    raw = yaml.safe_load(spec_path.read_text())
    raw["run"]["eval_tokens"] = 10_000_000  # more validation tokens than the store holds
    bad = _write(tmp_path, raw, "bad.yaml")
    assert cli_main(["ladder", "plan", str(bad), "--out", str(tmp_path / "bad")]) == 0
    capsys.readouterr()
    planned = sorted(p.relative_to(tmp_path / "bad") for p in (tmp_path / "bad").rglob("*"))
    assert cli_main(["ladder", "run", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "bad/ladder.yaml: run.store (C2e9_d" in err and "eval_tokens: 10000000 tokens need" in err
    assert sorted(p.relative_to(tmp_path / "bad") for p in (tmp_path / "bad").rglob("*")) == planned

    ladder = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(spec_path), "--out", str(ladder)]) == 0
    rows = read_manifest(ladder)
    # One rung finished (its run dir as the trainer writes it), one interrupted.
    done, cut = (ladder / "runs" / r["run_id"] for r in rows)
    done.mkdir(parents=True)
    cut.mkdir(parents=True)
    (done / "status.json").write_text(json.dumps({"status": "completed"}))
    (done / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "val_loss": 2.0,
                "val_bpb": 2.0 / math.log(2),
                "tokens": int(rows[0]["tokens"]),
                "flops": float(rows[0]["flops"]),
            }
        )
    )
    (cut / "status.json").write_text(json.dumps({"status": "failed", "reason": "stopped by signal SIGTERM"}))
    from delphi.ladder.collect import collect_ladder

    table = collect_ladder(ladder)
    assert list(table["run_id"]) == [rows[0]["run_id"]] and table["loss"].iloc[0] == 2.0
    everything = collect_ladder(ladder, include_all=True)
    assert len(everything) == 2 and everything["loss"].isna().sum() == 1
    assert set(everything["status"]) == {"completed", "failed"}


# ---- issue 10: seeds, rung health, FLOPs family, hero ranges, absurd plans -------------------------


@pytest.mark.parametrize("path, hero_multiple", [(DEFAULT, 3), (PAPER, 30), (PAPER_V4, 30)])
def test_issue10_specs_plan_healthy_rungs_and_a_hero_inside_their_ranges(path, hero_multiple):
    spec = load_ladder_spec(path)
    rungs = plan_ladder(spec)
    assert plan_health_warnings(spec, rungs) == []  # layers, width, evals, eval tokens met at plan time
    assert min(r.model.d_model for r in rungs) >= spec.health.min_d_model and min(r.model.n_layers for r in rungs) >= 3
    assert all(evals_of(r.train) >= 10 for r in rungs)
    moe = spec.shape.moe
    assert moe.capacity_factor >= moe.experts / moe.top_k  # dropless training: no routed token dropped
    assert len(spec.run.seeds) >= 2
    for budget in spec.budgets:
        seeds = spec.seeds_for(budget)
        curve = [r for r in rungs if r.budget == budget]
        cells = {cell_id_of(r.run_id) for r in curve}
        assert len(cells) == spec.isoflop.sizes and len(curve) == len(cells) * len(seeds)
        n = sorted({r.params for r in curve})
        assert n[-1] / n[0] >= spec.isoflop.min_span
        assert spec.recipe is not None or len({r.batch_size for r in curve}) == 1  # one batch per budget
        assert all(abs(r.flops / budget - 1) <= spec.tolerance for r in curve)
    top = max(spec.budgets)
    hero = plan_hero(spec, expected_optimum(spec, hero_multiple * top), hero_multiple * top)
    ranges = hero_ranges(spec, hero)
    assert ranges["inside"], ranges
    if spec.recipe is None:
        top_rung = next(r for r in rungs if r.budget == top)
        assert hero.batch_size == top_rung.batch_size and hero.hp.beta2 == top_rung.hp.beta2  # no switch at the hero
    else:  # one rule for every run: the fixed-step batch puts rungs and hero in the same steps
        target = spec.recipe.target_steps.value
        floor = spec.recipe.min_seqs
        assert all(
            r.train.steps <= target and (r.train.steps > target / 2 or r.batch_size == floor) for r in [*rungs, hero]
        ), sorted(r.train.steps for r in rungs)
    if path in (PAPER, PAPER_V4):
        assert len(spec.budgets) >= 4 and min(spec.budgets) >= 1e12 and len(spec.seeds_for(top)) >= 3
        assert (
            spec.run.store == "environment" and spec.run.max_epochs <= 1.0 and spec.run.final_eval_tokens >= 1_000_000
        )
        assert relaxed_bounds(spec.health) == ""  # the paper keeps issue 10's default bounds
    else:  # the default says which bounds it relaxes (its header says why)
        assert relaxed_bounds(spec.health) == "min_d_model 12 < 24;min_eval_tokens 32768 < 1e+06"


def test_seeds_expand_to_one_run_per_rung_and_seed(tmp_path):
    raw = _raw()
    raw["run"].update(seeds=[3, 5], top_seeds=[3, 5, 7])
    spec = ladder_spec_from_dict(raw)
    rungs = plan_ladder(spec)
    sizes, top = spec.isoflop.sizes, max(spec.budgets)
    assert len(rungs) == sizes * 2 * (len(spec.budgets) - 1) + sizes * 3
    assert len({r.run_id for r in rungs}) == len(rungs)
    for r in rungs:
        assert r.run_id.endswith(f"_s{r.seed}") and r.train.seed == r.seed == r.train.data.seed
        assert r.seed in ((3, 5, 7) if r.budget == top else (3, 5))
    by_cell: dict[str, list] = {}
    for r in rungs:
        by_cell.setdefault(cell_id_of(r.run_id), []).append(r)
    for runs in by_cell.values():  # the seeds of a cell differ only in their seed
        assert len({(r.model, r.steps, r.batch_size, r.hp) for r in runs}) == 1


@pytest.mark.parametrize(
    "run, key",
    [
        ({"seeds": []}, "run.seeds"),
        ({"seeds": [1, 1]}, "run.seeds"),
        ({"seeds": [0, 1], "top_seeds": [2, 2]}, "run.top_seeds"),
    ],
)
def test_empty_or_duplicated_seeds_exit_2_naming_the_key(tmp_path, capsys, run, key):
    raw = _raw()
    raw["run"].update(run)
    path = _write(tmp_path, raw)
    with pytest.raises(DelphiError, match=key):
        load_ladder_spec(path)
    out = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(path), "--out", str(out)]) == 2
    assert key in capsys.readouterr().err and not out.exists()


def test_absurd_budget_and_too_many_epochs_exit_2(tmp_path, capsys):
    raw = _raw()
    raw["budgets"] = [1.0e30]  # issue 12 row 17: was rc 0 and "5.6e15 epochs"
    path = _write(tmp_path, raw)
    assert cli_main(["ladder", "plan", str(path), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "batch.max_steps" in err and "1e+30" in err and not (tmp_path / "a").exists()
    micro = yaml.safe_load(_micro_spec(tmp_path).read_text())
    micro["run"]["max_epochs"] = 1e-3  # the micro store is small: its rungs read more than that
    path = _write(tmp_path, micro, "epochs.yaml")
    assert cli_main(["ladder", "plan", str(path), "--out", str(tmp_path / "b")]) == 0  # plan reads no store
    capsys.readouterr()
    assert cli_main(["ladder", "run", str(tmp_path / "b")]) == 2  # run does, before anything trains
    assert "run.max_epochs: rung C2e9_d" in capsys.readouterr().err and not (tmp_path / "b" / "runs").exists()


def test_plan_warns_about_health_bounds_it_can_see(tmp_path, capsys):
    path = _micro_spec(tmp_path)  # d8/d16, 2 layers, 1 eval of 512 tokens: below every default bound
    assert cli_main(["ladder", "plan", str(path), "--out", str(tmp_path / "ladder"), "--json"]) == 0
    captured = capsys.readouterr()
    warnings = json.loads(captured.out)["health_warnings"]
    for key in ("min_layers", "min_d_model", "min_evals", "min_eval_tokens"):
        assert f"health.{key}=" in captured.err and any(key in w for w in warnings)


def _fake_run(ladder: Path, row: dict, loss: float, drops: list[float], n_evals: int) -> None:
    """A finished run dir as the trainer writes it (status, summary, config, metrics.jsonl)."""
    run_dir = ladder / "runs" / row["run_id"]
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text((ladder / row["config"]).read_text())
    steps = int(row["steps"])
    records = []
    for i, drop in enumerate(drops):
        step = (i + 1) * steps // len(drops)
        record = {"step": step, "train_loss": 3.0, "drop_frac": drop}
        if i >= len(drops) - n_evals:
            record["val_loss"] = loss
        records.append(record)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records) + '{"step": 9'
    )  # torn last line
    (run_dir / "status.json").write_text(json.dumps({"status": "completed"}))
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "val_loss": loss,
                "val_bpb": loss / math.log(2),
                "steps": steps,
                "tokens": int(row["tokens"]),
                "flops": float(row["flops"]),
            }
        )
    )


def test_health_flags_and_seed_cells_from_constructed_runs(tmp_path, capsys):
    from delphi.fits.table_files import read_family
    from delphi.ladder.collect import collect_ladder, format_health_table, rung_health_table

    raw = yaml.safe_load(_micro_spec(tmp_path).read_text())
    raw["run"].update(seeds=[0, 1], evals_per_run=4)
    raw["shape"]["moe"] = {"experts": 4, "top_k": 2}  # a routed block: its drops are measured
    raw["tokens_per_param"] = {"ratio": 5.0, "max_ratio_error": 0.9}
    raw["health"] = {"max_drop_frac": 0.02, "min_layers": 2, "min_d_model": 8, "min_evals": 3, "min_eval_tokens": 512}
    ladder = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(_write(tmp_path, raw, "seeds.yaml")), "--out", str(ladder)]) == 0
    rows = read_manifest(ladder)
    assert len(rows) == 4 and len({cell_id_of(r["run_id"]) for r in rows}) == 2
    losses = [2.0, 2.1, 1.5, 1.6]
    drops = [[0.01, 0.01, 0.01, 0.01], [0.05, 0.03, 0.01, 0.01], [0.0, 0.0, 0.0, 0.0], [0.02, 0.0, 0.0, 0.0]]
    evals = [4, 4, 2, 4]
    for row, loss, d, e in zip(rows, losses, drops, evals):
        _fake_run(ladder, row, loss, d, e)
    table = collect_ladder(ladder).set_index("run_id")
    r = [table.loc[row["run_id"]] for row in rows]
    assert [x["drop_frac_mean"] for x in r] == pytest.approx([0.01, 0.025, 0.0, 0.005])
    assert [x["n_evals"] for x in r] == [4, 4, 2, 4]
    assert [x["health_ok"] for x in r] == [True, False, False, True]
    assert (
        r[1]["health_issues"] == "max_drop_frac"
        and r[2]["health_issues"] == "min_evals"
        and r[0]["health_issues"] == ""
    )
    assert all(x["eval_tokens"] == 512 and x["n_layers"] == 2 for x in r)
    assert "_E4k2" in r[0]["cell_id"]
    for pair in ((0, 1), (2, 3)):
        a, b = (r[i] for i in pair)
        assert a["cell_id"] == b["cell_id"] and a["n_seeds"] == b["n_seeds"] == 2
        assert a["loss_mean"] == pytest.approx((losses[pair[0]] + losses[pair[1]]) / 2)
        assert a["loss_std"] == pytest.approx(abs(losses[pair[0]] - losses[pair[1]]) / math.sqrt(2))  # ddof=1
    health = rung_health_table(table.reset_index())
    assert list(health["health_ok"]) == [True, False, False, True] and "2 of 4" in format_health_table(health)

    # The CLI prints the health table and writes <results>.family.json from the ladder's pinned spec.
    results = tmp_path / "results.csv"
    assert cli_main(["ladder", "collect", str(ladder), "--out", str(results)]) == 0
    assert "rung health: 2 of 4" in capsys.readouterr().err
    family = read_family(str(results) + ".family.json")
    spec = load_ladder_spec(ladder / "ladder.yaml")
    assert family.convention == "nonembedding" and family.params == flops_family(spec).params
    written = pd.read_csv(results)
    assert {"cell_id", "loss_mean", "loss_std", "n_seeds", "drop_frac_mean", "health_ok", "health_issues"} <= set(
        written.columns
    )
    # One seed: loss_std is NaN, n_seeds 1.
    (ladder / "runs" / rows[1]["run_id"] / "status.json").write_text(json.dumps({"status": "failed"}))
    single = collect_ladder(ladder).set_index("run_id").loc[rows[0]["run_id"]]
    assert single["n_seeds"] == 1 and math.isnan(single["loss_std"])


@pytest.mark.parametrize("path", [DEFAULT, PAPER, TINY])
def test_flops_family_is_exact_at_the_planned_shapes(path):
    spec = load_ladder_spec(path)
    family = flops_family(spec)
    assert family.convention == "nonembedding" and all(b > a for a, b in zip(family.params, family.params[1:]))
    for r in plan_ladder(spec):
        assert family(r.params) == pytest.approx(flops_per_token(r.model, spec.seq_len), rel=1e-12)
    widest = shape_for_width(spec, 64 * max(spec.shape.widths))  # default reach: 64x the widest rung
    assert family.params[-1] == count_params(widest).nonembedding
    for convention, n_of in (
        ("active", lambda m: count_params(m).active),
        ("fpt6", lambda m: flops_per_token(m, spec.seq_len) / 6),
    ):
        other = flops_family(spec, convention, max_width=2 * max(spec.shape.widths))
        for w in spec.shape.widths:
            m = shape_for_width(spec, w)
            assert other(n_of(m)) == pytest.approx(flops_per_token(m, spec.seq_len), rel=1e-12)
    with pytest.raises(DelphiError, match="convention"):
        flops_family(spec, "total")


def test_family_cli_writes_what_fit_reads(tmp_path, capsys):
    from delphi.fits.table_files import read_family

    out = tmp_path / "family.json"
    assert cli_main(["ladder", "family", str(DEFAULT), "--out", str(out), "--convention", "fpt6", "--json"]) == 0
    family = read_family(out)
    assert family.convention == "fpt6" and str(DEFAULT) in family.source
    assert json.loads(capsys.readouterr().out)["shapes"] == len(family.params)


def test_hero_ranges_report_which_range_the_hero_leaves():
    spec = load_ladder_spec(PAPER_V4)  # one batch per budget (no recipe): the hero's batch is the top budget's
    top = max(spec.budgets)
    rungs = plan_ladder(spec)
    results = pd.DataFrame([{**manifest_row(r), "status": "completed"} for r in rungs])
    n_star = expected_optimum(spec, 4 * top)
    hero = plan_hero(spec, n_star, 4 * top, results=results)
    ranges = hero_ranges(spec, hero, results)
    assert ranges["inside"] and ranges["outside"] == []
    for key in ("tokens_per_param", "steps", "batch_tokens", "beta2"):
        lo, hi = ranges[key]["ladder"]
        assert lo <= ranges[key]["hero"] <= hi and ranges[key]["inside"]
    assert ranges["batch_tokens"]["ladder"] == [hero.batch_size * spec.seq_len] * 2  # the top budget's batch
    # A ladder whose rungs all trained few steps: the same hero now leaves the steps range.
    short = results[results["steps"] <= 0.5 * ranges["steps"]["hero"]]
    assert "steps" in hero_ranges(spec, hero, short)["outside"]
    # 100x the top budget at the same N: far more steps than any rung, at the top budget's batch.
    far = hero_ranges(spec, plan_hero(spec, n_star, 100 * top, results=results), results)
    assert "steps" in far["outside"] and far["batch_tokens"]["inside"] and far["beta2"]["inside"]
    assert far["steps"]["hero"] > far["steps"]["ladder"][1]
    # 1e4x: past batch.max_steps, a planning error rather than a hero.
    with pytest.raises(DelphiError, match="batch.max_steps"):
        plan_hero(spec, n_star, 1e4 * top, results=results)
    # A hero config (TrainConfig) is compared the same way as a planned rung.
    assert hero_ranges(spec, hero.train, results) == ranges


def test_recipe_hero_ranges_hold_the_steps_and_leave_the_batch_to_the_recipe():
    spec = load_ladder_spec(DEFAULT)  # a recipe spec: the fixed-step batch grows with the horizon
    top = max(spec.budgets)
    results = pd.DataFrame([{**manifest_row(r), "status": "completed"} for r in plan_ladder(spec)])
    ranges = hero_ranges(spec, plan_hero(spec, expected_optimum(spec, 3 * top), 3 * top, results=results), results)
    assert ranges["inside"], ranges
    assert ranges["batch_tokens"]["scope"] == "recipe caps" and ranges["steps"]["scope"] == "ladder"
    # what the top budget trained is reported beside the caps; the recipe's batch grows with the
    # run's tokens, so the hero's is at least the top budget's largest
    top_batches = [r.batch_size * spec.seq_len for r in plan_ladder(spec) if r.budget == top]
    assert ranges["batch_tokens"]["trained"] == [min(top_batches), max(top_batches)]
    assert ranges["batch_tokens"]["hero"] >= ranges["batch_tokens"]["trained"][1]


def test_fixed_head_count_holds_at_every_width(tmp_path):
    raw = copy.deepcopy(_raw())
    raw["shape"]["n_heads"] = 2
    raw["shape"]["widths"] = [w for w in raw["shape"]["widths"] if w % 4 == 0]
    rungs = plan_ladder(load_ladder_spec(_write(tmp_path, raw)))
    assert {r.model.n_heads for r in rungs} == {2}
    assert len({r.model.d_model for r in rungs}) > 1


def test_hero_sized_off_its_optimum_to_stay_inside_the_ranges():
    """At 30x the paper ladder's top budget an N* of 0.8x the expected optimum falls between d128
    and d144, whose runs would train more steps than any rung; d160 (L5, within 2x of N*) trains
    fewer and is chosen. At 0.6x no shape within 2x fits: the nearest comes back, outside.
    The preflight also asks for a depth the ladder will train near its optimum (L3 here): no
    30x hero has one, so it reports none that fits; with d24/d32 anchors carrying the steps
    range, d96 L3 fits for N* at 0.5-0.6x the expected optimum (the fit found 0.56x)."""
    from delphi.ladder.spec import AnchorSpec

    spec = load_ladder_spec(PAPER)
    compute = 30 * max(spec.budgets)
    n_star = 0.8 * expected_optimum(spec, compute)
    hero = plan_hero(spec, n_star, compute)
    assert hero_ranges(spec, hero)["inside"] and 1.5 < hero.params / n_star <= HERO_MAX_OFF_OPTIMUM
    low = plan_hero(spec, 0.6 * expected_optimum(spec, compute), compute)
    assert hero_ranges(spec, low)["outside"] == ["steps"]
    preflight = hero_preflight(spec, compute)
    assert preflight["expected_depths"] == [3] and preflight["inside_factors"] is None
    assert "depth" in preflight["expected"]["outside"]
    # The second edition's 10x study (its L4 hero missed by -7%) would have stopped at plan time.
    assert hero_preflight(spec, 10 * max(spec.budgets))["expected"]["outside"] == ["depth"]
    anchored = dataclasses.replace(spec, anchors=AnchorSpec(widths=(24, 32), multiple=4.0))
    preflight = hero_preflight(anchored, compute)
    assert preflight["inside_factors"] == [0.5, 0.6]
    assert {r["run_id"] for r in preflight["factors"] if r["inside"]} == {"hero_C3e14_d96_L3_s0"}


def test_hero_keeps_a_depth_the_ladder_trained_near_its_optimum():
    """On the committed paper v2 ladder every cell within 2x of its budget's optimum is 3 layers deep.
    At 6e13 with N* = 6e5 (fpt6) the nearest shape is d112 L4 (6.5e5), inside the ranges but a depth
    seen only in the most under-trained rungs; with the results the planner takes d96 L3 (3.8e5),
    also inside, instead (gate hero_depth would refuse d112 L4)."""
    spec = load_ladder_spec(PAPER)
    results = pd.read_csv(Path(__file__).resolve().parents[1] / "paper" / "editions" / "v2" / "study" / "results.csv")
    assert depths_near_optimum(results) == {3}
    blind = plan_hero(spec, 6.0e5, 6e13, convention="fpt6")
    aware = plan_hero(spec, 6.0e5, 6e13, results=results, convention="fpt6")
    assert blind.model.n_layers == 4 and aware.model.n_layers == 3
    assert hero_ranges(spec, aware, results)["inside"]


def test_anchor_rungs_extend_the_steps_range_and_join_only_the_nd_laws(tmp_path):
    """The paper spec with anchors (d24, d32 at 4x the top budget): the plan adds them at the top
    budget's batch and seeds, under run ids starting with "A"; their steps widen the ladder's range
    so that a 30x L3 hero fits it (gate hero_ranges refused the same hero without them); in a
    results table they join VPNLS's points and not the isoFLOP law's, nor the backtest's."""
    from delphi.fits import backtest, fit_approach2, fit_vpnls, load_results
    from delphi.ladder.hero import ladder_ranges
    from delphi.ladder.plan import ANCHOR_PREFIX, rung_role
    from delphi.ladder.spec import AnchorSpec

    base = load_ladder_spec(PAPER)
    spec = dataclasses.replace(base, anchors=AnchorSpec(widths=(24, 32), multiple=4.0)).validate()
    rungs = plan_ladder(spec)
    anchors = [r for r in rungs if rung_role(r.run_id) == "anchor"]
    top = max(spec.budgets)
    top_batch = max(r.batch_size for r in rungs if r.budget == top)
    assert len(anchors) == 2 * len(spec.seeds_for(top)) and all(r.run_id.startswith(ANCHOR_PREFIX) for r in anchors)
    assert {r.batch_size for r in anchors} == {top_batch} and {r.budget for r in anchors} == {4 * top}
    assert len(rungs) == len(plan_ladder(base)) + len(anchors)
    steps_without, steps_with = ladder_ranges(base)["steps"], ladder_ranges(spec)["steps"]
    assert steps_with[1] == max(r.steps for r in anchors) > 3 * steps_without[1]
    assert ladder_ranges(spec)["batch_tokens"] == ladder_ranges(base)["batch_tokens"]  # top budget: isoFLOP rungs'
    hero = make_rung(spec, shape_for_width(spec, 96), 30 * top, 0, batch=top_batch)
    assert not hero_ranges(base, hero)["inside"] and hero_ranges(spec, hero)["inside"]
    with pytest.raises(DelphiError, match="anchors.multiple"):
        dataclasses.replace(base, anchors=AnchorSpec(widths=(24,), multiple=0.5)).validate()
    # anchors.seeds: the first n of the top budget's seeds.
    two = dataclasses.replace(spec, anchors=AnchorSpec(widths=(24, 32), multiple=4.0, seeds=2)).validate()
    two_anchors = [r for r in plan_ladder(two) if rung_role(r.run_id) == "anchor"]
    assert sorted({r.seed for r in two_anchors}) == list(spec.seeds_for(top)[:2]) and len(two_anchors) == 4
    with pytest.raises(DelphiError, match="anchors.seeds"):
        dataclasses.replace(base, anchors=AnchorSpec(widths=(24,), seeds=0)).validate()

    # A results table: the committed paper ladder plus two anchor rows (role "anchor").
    table = pd.read_csv(Path(__file__).resolve().parents[1] / "paper" / "editions" / "v2" / "study" / "results.csv")
    table["role"] = "isoflop"
    extra = table[(table["budget"] == table["budget"].max()) & (table["d_model"] == 24)].head(2).copy()
    extra["run_id"] = ["A4e13_d24_L3_E8k2_s0", "A4e13_d24_L3_E8k2_s1"]
    extra["cell_id"] = "A4e13_d24_L3_E8k2"
    extra[["tokens", "flops", "budget"]] *= 4
    extra["loss"] = [1.45, 1.46]
    extra["role"] = "anchor"
    path = tmp_path / "results.csv"
    pd.concat([table, extra], ignore_index=True).to_csv(path, index=False)
    with_anchor = load_results(path, params_convention="fpt6")
    plain = load_results(
        Path(__file__).resolve().parents[1] / "paper" / "editions" / "v2" / "study" / "results.csv",
        params_convention="fpt6",
    )
    assert len(with_anchor) == len(plain) and len(with_anchor.attrs["anchor_rows"]) == 2
    assert fit_vpnls(with_anchor).n_points == fit_vpnls(plain).n_points + 1  # one more cell: the anchor's
    assert fit_approach2(with_anchor).params == pytest.approx(fit_approach2(plain).params)
    held_out = backtest(with_anchor, lambda t: fit_vpnls(t))
    assert held_out["budgets"][0]["rel_error"] == pytest.approx(
        backtest(plain, lambda t: fit_vpnls(t))["budgets"][0]["rel_error"]
    )


def test_anchor_rung_trains_as_its_own_stage_and_is_collected_as_an_anchor(tmp_path):
    """A real micro ladder with one anchor rung (d8 on 2x the top budget): `--budgets` selects it
    by its compute, the trainer runs it, and collect marks it role "anchor" (the others "isoflop")."""
    from delphi.fits import load_results
    from delphi.ladder.collect import collect_ladder

    raw = yaml.safe_load(_micro_spec(tmp_path).read_text())
    raw["anchors"] = {"widths": [8], "multiple": 2.0}
    ladder = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(_write(tmp_path, raw, "anchored.yaml")), "--out", str(ladder)]) == 0
    rows = read_manifest(ladder)
    anchor = [r for r in rows if r["run_id"].startswith("A")]
    assert len(rows) == 3 and len(anchor) == 1 and float(anchor[0]["budget"]) == 4e9
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}
    done = subprocess.run(
        [sys.executable, "-m", "delphi.cli", "ladder", "run", str(ladder), "--budgets", "4e9", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completed"] == 1
    table = collect_ladder(ladder, include_all=True).set_index("run_id")
    assert (
        table.loc[anchor[0]["run_id"], "role"] == "anchor" and table.loc[anchor[0]["run_id"], "status"] == "completed"
    )
    assert set(table.drop(index=anchor[0]["run_id"])["role"]) == {"isoflop"}
    with pytest.raises(DelphiError, match="only anchor rungs"):  # the isoFLOP rungs have not trained
        load_results(collect_ladder(ladder))


def test_a_budget_below_the_width_grid_gets_its_own_centre_and_leaves_the_other_rungs_alone():
    """isoflop.center_at: a budget where the centre formula falls below the width grid (the eighth
    edition's 5.2e10, docs/notebook.md §8.19) plans around its own N*; every other rung is unchanged."""
    raw = yaml.safe_load(PAPER_V8.read_text())  # its two lowest budgets carry center_at
    formula_only = {k: v for k, v in raw["isoflop"].items() if k != "center_at"}
    with pytest.raises(DelphiError, match=r"budget 5.2e\+10 \(budgets\[0\]\) the chosen sizes span only"):
        plan_ladder(ladder_spec_from_dict({**raw, "isoflop": formula_only}))
    rungs = plan_ladder(ladder_spec_from_dict(raw))
    low = sorted({r.model.d_model for r in rungs if r.budget == 5.2e10})
    assert len(low) == raw["isoflop"]["sizes"] and low[0] == 16 and 20 <= low[len(low) // 2] <= 32
    upper = {**raw, "budgets": [b for b in raw["budgets"] if b >= 3e11], "isoflop": formula_only}
    assert {r.run_id for r in rungs if r.budget >= 3e11} == {
        r.run_id for r in plan_ladder(ladder_spec_from_dict(upper))
    }
    below = {**raw, "isoflop": {**raw["isoflop"], "center_at": [[5.0e10, 2.7e4]]}}
    with pytest.raises(DelphiError, match=r"isoflop.center_at\[0\]: budget 5e\+10 is not one of budgets"):
        ladder_spec_from_dict(below)


@pytest.mark.parametrize("width", ["0", "-64"])
def test_family_cli_refuses_a_width_that_is_not_positive(tmp_path, capsys, width):
    out = tmp_path / "family.json"
    assert cli_main(["ladder", "family", str(DEFAULT), "--out", str(out), "--max-width", width]) == 2
    assert f"--max-width: {width}, expected a positive d_model" in capsys.readouterr().err
    assert not out.exists()


def test_the_ladder_driver_stops_on_a_hangup_as_on_ctrl_c():
    """SIGHUP (a dropped terminal) interrupts the driver like SIGTERM and Ctrl-C: its workers are
    stopped through Placer.stop, not orphaned; the handlers are restored after."""
    import signal
    import time

    from delphi.ladder.driver import sigterm_as_interrupt

    before = signal.getsignal(signal.SIGHUP)
    for signum in (signal.SIGHUP, signal.SIGTERM):
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(signum).name):
            with sigterm_as_interrupt():
                os.kill(os.getpid(), signum)
                time.sleep(5)  # the handler raises long before this ends
    assert signal.getsignal(signal.SIGHUP) is before
