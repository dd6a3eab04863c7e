"""Preregistration: create, seal/verify, tampering, live check, outcomes, index, bad inputs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import prereg_synthetic as ps
import pytest
import yaml

from delphi import prereg_format as fmt
from delphi.cli import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    ladder = ps.write_ladder(root / "ladder")
    fit = ps.write_fit(ladder, root / "fit.json")
    hero_cfg = ps.hero_config()
    hero = ps.write_hero(root / "hero.yaml", hero_cfg)
    out = root / "preregistrations" / "hero1.yaml"
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
                str(out),
                "--bootstrap",
                "40",
                "--rationale",
                "test",
                "--tolerance",
                "0.03",
                "--force",
            ]
        )
        == 0
    )
    return {"root": root, "ladder": ladder, "fit": fit, "hero": hero, "hero_cfg": hero_cfg, "prereg": out}


def _run(args, capsys):
    code = main([*args, "--json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else None)


def _hero_run(
    run_dir: Path, cfg, *, upto: float = 1.0, shift: float = 0.0, status: str | None = None, seed: int = 5
) -> None:
    """Write the hero's run dir as the trainer would after `upto` of its steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic(run_dir / "config.yaml", yaml.safe_dump(ps.train_config_to_dict(cfg)))
    steps, tokens, loss = ps.true_curve(cfg, np.random.default_rng(seed))
    keep = steps <= upto * cfg.steps
    rows = ps.metrics_rows(cfg, steps[keep], tokens[keep], loss[keep] + shift)
    _atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    done = status or ("completed" if upto >= 1 else "running")
    _atomic(
        run_dir / "status.json", json.dumps({"status": done, "reason": "", "step": int(steps[keep][-1]), "updated": ""})
    )
    if done == "completed":
        _atomic(
            run_dir / "summary.json", json.dumps({"status": done, "val_loss": float(loss[-1] + shift), "val_bpb": 1.0})
        )


def _atomic(path: Path, text: str) -> None:
    """Replace a run file in one step, as the trainer does: a watcher never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def test_file_has_design_fields_and_a_valid_seal(setup):
    doc = fmt.read(setup["prereg"])
    for key in (
        "schema_version",
        "id",
        "created",
        "author",
        "toolkit",
        "provenance",
        "hero",
        "prediction",
        "decision",
        "rationale",
        "assumptions",
        "seal",
    ):
        assert key in doc
    assert set(doc["toolkit"]) >= {"version", "git_commit", "git_dirty"}
    assert (
        doc["provenance"]["fit_sha256"] and doc["provenance"]["results_sha256"] and doc["provenance"]["manifest_sha256"]
    )
    final = doc["prediction"]["final"]
    assert final["loss_90"][0] <= final["loss_50"][0] <= final["loss"] <= final["loss_50"][1] <= final["loss_90"][1]
    assert final["bpb"] == pytest.approx(final["loss"] / np.log(2))
    points = doc["prediction"]["trajectory"]["points"]
    assert len(points) == 21 and points[-1]["loss"] == pytest.approx(final["loss"])  # anchored to the scaling law
    assert "agreement" in doc["prediction"]["trajectory"]
    assert fmt.seal_status(doc)["ok"]
    # The synthetic ladder has one run per budget and one seed: its gates fail and --force sealed it anyway.
    gates = {g["name"]: g for g in doc["gates"]}
    assert {"isoflop_vertices", "seeds", "lobo_spread", "interval_width", "fit_status"} <= set(gates)
    assert not gates["seeds"]["passed"] and gates["interval_width"]["passed"] and doc["forced"] is True
    report = json.loads(setup["prereg"].with_name("hero1.gates.json").read_text())
    assert report["sealed"] is True and report["seal"] == doc["seal"]["digest"]


def test_final_interval_is_predictive_for_one_run(setup):
    """The sealed final interval is the fit's bootstrap interval widened in quadrature by z x one run's
    noise (the law's residual scatter and the seed noise), as the backtests' intervals are."""
    from delphi.fits import load_fit
    from delphi.fits.intervals import Z_90 as Z90
    from delphi.prereg.predict import load_tables, predict_hero, predictive, run_noise_nats

    final = fmt.read(setup["prereg"])["prediction"]["final"]
    fit = load_fit(setup["fit"])
    noise, parts = run_noise_nats(fit, load_tables(setup["ladder"] / "results.csv")[0])
    assert (
        noise is not None
        and noise > 0
        and final["residual_scatter_nats"] == pytest.approx(parts["residual_scatter_nats"])
    )
    bootstrap = predict_hero(fit, setup["hero_cfg"])[0]
    lo, hi = bootstrap["loss_interval_90"]
    loss = bootstrap["loss"]
    assert final["loss_90"][0] == pytest.approx(loss - np.hypot(loss - lo, Z90 * noise))
    assert final["loss_90"][1] == pytest.approx(loss + np.hypot(hi - loss, Z90 * noise))
    assert final["loss_90"][1] - final["loss_90"][0] > hi - lo  # wider than the law's own interval
    assert predictive(bootstrap, None) == bootstrap  # no noise known: unchanged


def test_truth_lies_inside_the_preregistered_band(setup):
    """The hero's curve from the law that made the ladder falls inside the 90% band."""
    cfg = setup["hero_cfg"]
    prereg = fmt.load_prereg(setup["prereg"])
    steps, tokens, loss = ps.true_curve(cfg, np.random.default_rng(0), noise=0.0)
    inside = [lo <= l <= hi for t, l in zip(tokens, loss) for (_, lo, hi) in [prereg.predicted_loss_at(t)]]
    assert np.mean(inside) >= 0.8
    assert np.isnan(prereg.predicted_loss_at(1.0).median)  # before the trajectory: NaN, not an error
    assert f"{prereg.predicted_loss_at(tokens[-1]):.3f}" == f"{prereg.predicted_loss_at(tokens[-1]).median:.3f}"


def test_create_refuses_to_overwrite(setup, capsys):
    before = setup["prereg"].read_bytes()
    code, _ = _run(
        ["prereg", "create", "--fit", str(setup["fit"]), "--hero", str(setup["hero"]), "--out", str(setup["prereg"])],
        capsys,
    )
    assert code == 2 and setup["prereg"].read_bytes() == before


def test_changing_one_digit_breaks_the_seal(setup, tmp_path, capsys):
    text = setup["prereg"].read_text()
    line = next(l for l in text.splitlines() if l.strip().startswith("loss: "))
    value = line.split("loss: ")[1]
    digit = next(i for i in range(len(value) - 1, -1, -1) if value[i].isdigit())
    bumped = value[:digit] + str((int(value[digit]) + 1) % 10) + value[digit + 1 :]
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(text.replace(line, line.replace(value, bumped), 1))
    assert _run(["prereg", "verify", str(setup["prereg"])], capsys)[0] == 0
    code, result = _run(["prereg", "verify", str(tampered)], capsys)
    assert code == 1 and not result["seal_ok"]
    assert (
        _run(["prereg", "check", str(tampered), "--run", str(tmp_path)], capsys)[0] == 1
    )  # check refuses a broken seal: exit 1, as verify (README)


def test_created_after_the_run_started_is_flagged(setup, tmp_path, capsys):
    early = tmp_path / "early"
    _hero_run(early, setup["hero_cfg"], upto=0.3)  # logged before the file below was created
    time.sleep(0.05)
    late = tmp_path / "late.yaml"
    # Without a results table no gate but the fit's own can be evaluated: refused, then forced.
    assert main(["prereg", "create", "--fit", str(setup["fit"]), "--hero", str(setup["hero"]), "--out", str(late)]) == 1
    assert not late.exists() and late.with_name("late.gates.json").is_file()
    assert (
        main(
            [
                "prereg",
                "create",
                "--fit",
                str(setup["fit"]),
                "--hero",
                str(setup["hero"]),
                "--out",
                str(late),
                "--force",
            ]
        )
        == 0
    )
    code, result = _run(["prereg", "verify", str(late), "--run", str(early)], capsys)
    assert code == 1 and result["created_before_start"] is False
    fresh = tmp_path / "fresh"
    _hero_run(fresh, setup["hero_cfg"], upto=0.3)  # started after the file
    code, result = _run(["prereg", "verify", str(late), "--run", str(fresh)], capsys)
    assert code == 0 and result["created_before_start"] is True


def test_not_started_and_truncated_runs(setup, tmp_path, capsys):
    empty = tmp_path / "pending"
    empty.mkdir()
    (empty / "status.json").write_text(json.dumps({"status": "pending", "reason": "", "step": 0, "updated": ""}))
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(empty)], capsys)
    assert code == 0 and result["verdict"] == "not-started"
    partial = tmp_path / "partial"
    _hero_run(partial, setup["hero_cfg"], upto=0.5)
    with open(partial / "metrics.jsonl", "a") as f:
        f.write('{"step": 99999, "tokens": 1')  # the trainer is mid-write
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(partial)], capsys)
    assert code == 0 and result["verdict"] == "on-track" and result["n_points"] == 10


def test_deviating_then_failed(setup, tmp_path, capsys):
    off = tmp_path / "off"
    _hero_run(off, setup["hero_cfg"], upto=0.5, shift=0.15)
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(off)], capsys)
    assert code == 1 and result["verdict"] == "deviating" and result["rel_error"] > 0.05
    _hero_run(off, setup["hero_cfg"], upto=1.0, shift=0.15)
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(off)], capsys)
    assert code == 1 and result["verdict"] == "failed" and result["covered_90"] is False


def test_diverged_run_fails(setup, tmp_path, capsys):
    run = tmp_path / "div"
    _hero_run(run, setup["hero_cfg"], upto=0.4, status="diverged")
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(run)], capsys)
    assert code == 1 and result["verdict"] == "failed" and "diverged" in result["why"]


def test_a_run_stopped_to_be_resumed_gets_no_verdict_and_no_outcome_file(setup, tmp_path, capsys):
    """A hero stopped by a signal at the end of a working session (status "failed" for the ladder's
    bookkeeping, reason "...; continue with --resume") is checked as a run in progress; only a run
    that ended gets a verdict and an outcome file (paper/editions/v7: its hero spanned two sessions)."""
    from delphi.train.rundir import RESUME_HINT

    run = tmp_path / "stopped"
    _hero_run(run, setup["hero_cfg"], upto=0.7)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(
        json.dumps(status | {"status": "failed", "reason": f"stopped by signal SIGTERM; {RESUME_HINT}"})
    )
    fmt.outcome_path(setup["prereg"]).unlink(missing_ok=True)  # an earlier test's completed run wrote one
    code, result = _run(["prereg", "check", str(setup["prereg"]), "--run", str(run)], capsys)
    assert code == 0 and result["verdict"] == "on-track" and result["status"] == "stopped", result
    assert "to be resumed" in result["why"] and "outcome_file" not in result
    assert not fmt.outcome_path(setup["prereg"]).exists()


def test_watch_ends_on_a_run_stopped_to_be_resumed(setup, tmp_path, capsys):
    """A stopped run never moves until resumed: --watch says so and ends, instead of polling forever."""
    from delphi.train.rundir import RESUME_HINT

    run = tmp_path / "stopped"
    _hero_run(run, setup["hero_cfg"], upto=0.7)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(
        json.dumps(status | {"status": "failed", "reason": f"stopped by signal SIGTERM; {RESUME_HINT}"})
    )
    fmt.outcome_path(setup["prereg"]).unlink(missing_ok=True)
    started = time.monotonic()
    code, result = _run(
        ["prereg", "check", str(setup["prereg"]), "--run", str(run), "--watch", "--interval", "0.05"], capsys
    )
    assert code == 0 and result["verdict"] == "on-track" and time.monotonic() - started < 20
    assert result["watch"].startswith(f"stopped watching: {run} is stopped, to be resumed (stopped by signal SIGTERM")
    assert not fmt.outcome_path(setup["prereg"]).exists()


def test_watch_follows_a_live_run_to_passed_with_outcome_and_index(setup, tmp_path, capsys):
    import shutil

    prereg = tmp_path / "regs" / "watched.yaml"
    prereg.parent.mkdir()
    shutil.copy(setup["prereg"], prereg)
    run = tmp_path / "hero"
    _hero_run(run, setup["hero_cfg"], upto=0.1)

    def train():
        for frac in (0.3, 0.6, 0.9, 1.0):
            time.sleep(0.15)
            _hero_run(run, setup["hero_cfg"], upto=frac)

    thread = threading.Thread(target=train)
    thread.start()
    code, result = _run(
        [
            "prereg",
            "check",
            str(prereg),
            "--run",
            str(run),
            "--watch",
            "--interval",
            "0.05",
            "--timeout",
            "30",
            "--plot",
            str(tmp_path / "pred.png"),
        ],
        capsys,
    )
    thread.join()
    assert code == 0 and result["verdict"] == "passed" and abs(result["rel_error"]) <= 0.03
    assert result["forced"] is True and "SEALED WITH --force" in result["why"]
    assert (tmp_path / "pred.png").stat().st_size > 0 and (tmp_path / "pred.svg").stat().st_size > 0
    outcome = json.loads(fmt.outcome_path(prereg).read_text())
    assert outcome["verdict"] == "passed" and outcome["seal"] == fmt.read(prereg)["seal"]["digest"]
    assert fmt.seal_status(fmt.read(prereg))["ok"]  # the outcome lives beside the file, not in it
    code, result = _run(["prereg", "index", str(prereg.parent)], capsys)
    readme = (prereg.parent / "README.md").read_text()
    assert code == 0 and result["n"] == 1 and "| passed (forced) |" in readme and "watched" in readme
    assert "FORCED: failed" in readme


def test_bad_inputs_exit_2(setup, tmp_path, capsys, monkeypatch):
    base = ["prereg", "create", "--hero", str(setup["hero"])]
    curve_fit = tmp_path / "curves.json"
    assert (
        main(["prereg", "curves", str(setup["ladder"]), "--out", str(curve_fit), "--bootstrap", "5", "--no-backtest"])
        == 0
    )
    # a fit of the wrong kind (a curve-law fit is not a final-loss law)
    assert _run([*base, "--fit", str(curve_fit), "--out", str(tmp_path / "a.yaml")], capsys)[0] == 2
    # a hero of another model family than the ladder the fit describes
    moe = yaml.safe_load(setup["hero"].read_text())
    moe["model"]["moe"] = {"experts": 8, "top_k": 2, "d_expert": 64}
    (tmp_path / "moe.yaml").write_text(yaml.safe_dump(moe))
    code, _ = _run(
        [
            "prereg",
            "create",
            "--fit",
            str(setup["fit"]),
            "--hero",
            str(tmp_path / "moe.yaml"),
            "--ladder",
            str(setup["ladder"]),
            "--out",
            str(tmp_path / "b.yaml"),
        ],
        capsys,
    )
    assert code == 2 and "moe" in capsys.readouterr().err + "moe"
    assert not (tmp_path / "a.yaml").exists() and not (tmp_path / "b.yaml").exists()
    # a ladder dir without a manifest (issue 12, row 15)
    (tmp_path / "empty").mkdir()
    code, _ = _run(
        [*base, "--fit", str(setup["fit"]), "--ladder", str(tmp_path / "empty"), "--out", str(tmp_path / "c.yaml")],
        capsys,
    )
    assert code == 2 and not (tmp_path / "c.yaml").exists()
    # a missing run dir, and W&B while offline
    assert _run(["prereg", "check", str(setup["prereg"]), "--run", str(tmp_path / "nope")], capsys)[0] == 2
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert _run(["prereg", "check", str(setup["prereg"]), "--wandb", "ent/proj/run1"], capsys)[0] == 2
    assert _run(["prereg", "check", str(setup["prereg"]), "--wandb", "not-a-path"], capsys)[0] == 2


def test_check_projects_the_final_on_a_probes_shape(tmp_path, capsys):
    """`prereg check --shape RUN`: the fifth edition's hero on its 10x probe's curve was heading
    +8% to +10% above its seal from 30% of training on (it missed by +8.69%); an early warning,
    beside the verdict, not in it."""
    repo = Path(__file__).resolve().parents[1]
    prereg = tmp_path / "paper-v5-hero-30x.yaml"  # a copy: a completed check rewrites NAME.outcome.json beside it
    prereg.write_bytes((repo / "preregistrations" / "paper-v5-hero-30x.yaml").read_bytes())
    code = main(
        [
            "prereg",
            "check",
            str(prereg),
            "--run",
            str(repo / "paper" / "editions" / "v5" / "study" / "hero"),
            "--shape",
            str(repo / "paper" / "editions" / "v4" / "probe10x"),
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and result["verdict"] == "failed"  # the verdict is the seal's, unchanged
    middle = [p for p in result["projection"]["points"] if 0.25 < p["fraction"] < 0.75]
    assert len(middle) == 5 and all(0.08 < p["vs_predicted"] < 0.11 for p in middle)
    assert all(abs(p["projected_final"] / 1.0142 - 1) < 0.015 for p in middle)
    bad = main(
        [
            "prereg",
            "check",
            str(prereg),
            "--run",
            str(repo / "paper" / "editions" / "v5" / "study" / "hero"),
            "--shape",
            str(repo / "paper" / "editions" / "v4"),
            "--json",
        ]
    )
    assert bad == 2 and "config.yaml" in capsys.readouterr().err
