"""Ladder planning, validation, hero, and the runner/collector on a micro ladder."""

from __future__ import annotations

import copy
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
from delphi.ladder.plan import (
    batch_for_tokens,
    layers_for_width,
    plan_ladder,
    read_manifest,
    shape_for_width,
    transfer,
)
from delphi.ladder.spec import ladder_spec_from_dict, load_ladder_spec
from delphi.model.flops import count_params, flops_per_token
from delphi.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "studies" / "ladder_tiny.yaml"
CPU = ROOT / "studies" / "ladder_cpu.yaml"


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
        curve = [r for r in rungs if r.budget == budget]
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
        (lambda d: d["isoflop"].update(sizes=3, span=10.0, min_span=10.0) or d["shape"].update(widths=[8, 64, 512]), "shape.widths"),
        (lambda d: d["shape"].update(widthz=[8]), "shape.widthz"),
        (lambda d: d["transfer"]["beta2"].update(rule="sqrt"), "transfer.beta2.rule"),
        (lambda d: d["base"].update(lr=-1.0), "base.lr"),
        (lambda d: d["shape"].update(head_dim=15), "shape.head_dim"),
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
    fit = {"kind": "parametric", "method": "vpnls", "params": {"E": 0.8, "A": 40.0, "B": 300.0, "alpha": 0.34, "beta": 0.3}}
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    out = tmp_path / "hero.yaml"
    args = ["ladder", "hero", "--fit", str(tmp_path / "fit.json"), "--compute", "3e14", "--spec", str(TINY), "--out", str(out), "--json"]
    assert cli_main(args) == 0
    result = json.loads(capsys.readouterr().out)
    cfg = load_train_config(out)
    n = count_params(cfg.model).nonembedding
    assert n == result["params"] and 0.7 < n / result["predicted_params"] < 1.4
    flops = cfg.tokens * flops_per_token(cfg.model, cfg.data.seq_len)
    assert abs(flops / 3e14 - 1) <= 0.01 and cfg.model.mup.base_d_model == 64
    assert cfg.steps >= 300
    assert cli_main(["ladder", "hero", "--fit", str(tmp_path / "nope.json"), "--compute", "3e14", "--spec", str(TINY), "--out", str(tmp_path / "h2.yaml")]) == 2
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
    raw["run"].update(store=str(tmp_path / "store"), eval_tokens=512, evals_per_run=1, logs_per_run=2, checkpoints_per_run=2)
    return _write(tmp_path, raw)


def test_runner_and_collect_micro_ladder(tmp_path):
    spec = _micro_spec(tmp_path)
    ladder = tmp_path / "ladder"
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}  # skip the per-run matmul peak measurement
    run = lambda *a: subprocess.run([sys.executable, "-m", "delphi.cli", *a], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    assert run("ladder", "plan", str(spec), "--out", str(ladder)).returncode == 0
    rows = read_manifest(ladder)
    assert len(rows) == 2

    # A rung whose lock is held elsewhere is never started twice: its worker exits EX_TEMPFAIL at once.
    (ladder / "locks").mkdir()
    lock_path = ladder / "locks" / f"{rows[0]['run_id']}.lock"
    with open(lock_path, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        worker = subprocess.run(
            [sys.executable, "-m", "delphi.ladder.runner", str(ladder / rows[0]["config"]),
             str(ladder / "runs" / rows[0]["run_id"]), str(lock_path), ""],
            env=env, capture_output=True, text=True, timeout=60,
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
    assert list(table.columns[:8]) == ["params", "tokens", "flops", "loss", "budget", "run_id", "experts", "granularity"]
    assert sorted(table["run_id"]) == sorted(r["run_id"] for r in rows)  # each rung exactly once
    assert (table["status"] == "completed").all() and table["loss"].between(0.1, 6.0).all()
    for _, r in table.iterrows():
        assert abs(r["flops"] / r["budget"] - 1) <= 0.01
        assert r["bpb"] == pytest.approx(r["loss"] / math.log(2))


def test_plan_refuses_a_store_too_small_and_collect_filters_incomplete(tmp_path, capsys):
    spec_path = _micro_spec(tmp_path)
    raw = yaml.safe_load(spec_path.read_text())
    raw["run"]["eval_tokens"] = 10_000_000  # more validation tokens than the store holds
    bad = _write(tmp_path, raw, "bad.yaml")
    assert cli_main(["ladder", "plan", str(bad), "--out", str(tmp_path / "bad")]) == 2
    assert "eval_tokens" in capsys.readouterr().err and not (tmp_path / "bad").exists()

    ladder = tmp_path / "ladder"
    assert cli_main(["ladder", "plan", str(spec_path), "--out", str(ladder)]) == 0
    rows = read_manifest(ladder)
    # One rung finished (its run dir as the trainer writes it), one interrupted.
    done, cut = (ladder / "runs" / r["run_id"] for r in rows)
    done.mkdir(parents=True)
    cut.mkdir(parents=True)
    (done / "status.json").write_text(json.dumps({"status": "completed"}))
    (done / "summary.json").write_text(json.dumps({"status": "completed", "val_loss": 2.0, "val_bpb": 2.0 / math.log(2),
                                                   "tokens": int(rows[0]["tokens"]), "flops": float(rows[0]["flops"])}))
    (cut / "status.json").write_text(json.dumps({"status": "failed", "reason": "stopped by signal SIGTERM"}))
    from delphi.ladder.collect import collect_ladder

    table = collect_ladder(ladder)
    assert list(table["run_id"]) == [rows[0]["run_id"]] and table["loss"].iloc[0] == 2.0
    everything = collect_ladder(ladder, include_all=True)
    assert len(everything) == 2 and everything["loss"].isna().sum() == 1
    assert set(everything["status"]) == {"completed", "failed"}
