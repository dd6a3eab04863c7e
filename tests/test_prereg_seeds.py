"""Multi-seed seals (issue 40): the sealed quantity is the mean final loss of the named seeds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import prereg_synthetic as ps
import pytest
import yaml

from delphi import prereg_format as fmt
from delphi.cli import main
from delphi.errors import DelphiError
from delphi.prereg.check import check
from delphi.prereg.competing import ensemble_entry, score_competing
from delphi.prereg.create import PreregParts, build_prereg, trajectory_from_final
from delphi.prereg.verify import verify
from delphi.train.config import train_config_to_dict

PREDICTED = 1.5


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(seconds))


def seal(path: Path, cfg, seeds, *, created: float | None = None, competing=None) -> Path:
    final = {
        "loss": PREDICTED,
        "loss_50": [PREDICTED * 0.99, PREDICTED * 1.01],
        "loss_90": [PREDICTED * 0.97, PREDICTED * 1.03],
    }
    doc = build_prereg(
        PreregParts(
            prereg_id=path.stem,
            hero_config=train_config_to_dict(cfg),
            hero_summary={"params": 1, "tokens": int(cfg.tokens), "flops": 1.0, "family": "dense"},
            final=final,
            trajectory=trajectory_from_final(final, cfg),
            provenance={},
            tolerance_rel=0.01,
            created=_stamp(created if created is not None else time.time() - 60),
            seeds=seeds,
            competing=competing,
        )
    )
    fmt.write_new(path, doc)
    return path


def seed_run(root: Path, cfg, seed: int, final_loss: float, rename: bool = True) -> Path:
    """A completed run of `cfg` at `seed` whose final val_loss is `final_loss`."""
    from dataclasses import replace

    run = root / f"hero_s{seed}"
    member = replace(cfg, seed=seed, data=replace(cfg.data, seed=seed), name=f"hero_s{seed}" if rename else cfg.name)
    ps.write_run(run, member, np.random.default_rng(seed))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"val_loss": final_loss}))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["val_loss"] = final_loss  # the run's own record of its final eval, which the summary repeats
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_an_edited_summary_is_refused_against_the_metrics_log(tmp_path, hero):
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED)]
    summary = json.loads((runs[1] / "summary.json").read_text())
    (runs[1] / "summary.json").write_text(json.dumps(summary | {"val_loss": PREDICTED * 0.9}))
    assert main(["prereg", "check", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]) == 1
    assert not fmt.outcome_path(prereg).exists()


@pytest.fixture
def hero():
    return ps.train_config(32, 200, 8, "hero")


def test_two_seed_seal_decides_on_the_mean_not_on_either_seed(tmp_path, hero):
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    # Each seed misses by 2%, their mean is exact: passed.
    runs = [seed_run(tmp_path / "a", hero, 0, PREDICTED * 1.02), seed_run(tmp_path / "a", hero, 1, PREDICTED * 0.98)]
    result, _, _ = check(prereg, run_dirs=runs, record=False)
    assert result["verdict"] == "passed"
    assert result["actual_final_loss"] == pytest.approx(PREDICTED)
    assert [s["seed"] for s in result["seeds"]] == [0, 1]
    # Seed 0 alone would pass (+0.8%), but the mean is +1.1%: failed.
    runs = [seed_run(tmp_path / "b", hero, 0, PREDICTED * 1.008), seed_run(tmp_path / "b", hero, 1, PREDICTED * 1.014)]
    result, _, _ = check(prereg, run_dirs=runs, record=False)
    assert result["verdict"] == "failed"
    assert result["rel_error"] == pytest.approx(0.011, abs=1e-9)


def test_a_seed_started_before_the_seal_makes_the_outcome_invalid(tmp_path, hero):
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED)]
    prereg = seal(tmp_path / "late.yaml", hero, [0, 1], created=time.time() + 3600)
    result, _, _ = check(prereg, run_dirs=runs)
    assert result["verdict"].startswith("invalid")
    assert not fmt.outcome_path(prereg).exists()
    assert main(["prereg", "verify", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]) == 1
    on_time = seal(tmp_path / "on_time.yaml", hero, [0, 1])
    assert verify(on_time, run_dirs=runs)["ok"] is True


def test_a_one_seed_seal_reads_exactly_as_before(tmp_path, hero):
    one = build_prereg(
        PreregParts(
            prereg_id="x",
            hero_config=train_config_to_dict(hero),
            hero_summary={},
            final={"loss": 1.0},
            trajectory={"points": []},
            provenance={},
            created="2026-01-01T00:00:00.000000Z",
            toolkit={"name": "delphi"},
            author="a",
        )
    )
    listed = build_prereg(
        PreregParts(
            prereg_id="x",
            hero_config=train_config_to_dict(hero),
            hero_summary={},
            final={"loss": 1.0},
            trajectory={"points": []},
            provenance={},
            created="2026-01-01T00:00:00.000000Z",
            toolkit={"name": "delphi"},
            author="a",
            seeds=[0],
        )
    )
    assert one == listed
    assert "target" not in one and "competing" not in one["prediction"]
    prereg = seal(tmp_path / "one.yaml", hero, None)
    result, _, _ = check(prereg, run_dir=seed_run(tmp_path, hero, 0, PREDICTED * 1.005, rename=False), record=False)
    assert result["verdict"] == "passed" and "seeds" not in result


def test_the_outcome_records_the_mean_and_scores_every_sealed_law(tmp_path, hero):
    competing = {
        "low": {"loss": PREDICTED * 0.95, "loss_90": [PREDICTED * 0.9, PREDICTED * 0.99]},
        "broken": {"error": "no prediction"},
    }
    prereg = seal(tmp_path / "laws.yaml", hero, [0, 1], competing=competing)
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED * 1.002)]
    assert (
        main(
            [
                "prereg",
                "check",
                str(prereg),
                "--run",
                str(runs[0]),
                "--run",
                str(runs[1]),
                "--plot",
                str(tmp_path / "fig.png"),
            ]
        )
        == 0
    )
    assert (tmp_path / "fig.png").stat().st_size > 0
    result, _, _ = check(prereg, run_dirs=runs)
    outcome = json.loads(fmt.outcome_path(prereg).read_text())
    assert outcome["verdict"] == "passed" and outcome["actual_final_loss"] == pytest.approx(PREDICTED * 1.001)
    assert result["competing"]["low"]["covered_90"] is False
    assert result["competing"]["low"]["rel_error"] == pytest.approx(1.001 / 0.95 - 1)
    assert "error" in result["competing"]["broken"]


def test_bad_multi_seed_input_exits_2_and_writes_nothing(tmp_path, hero, capsys):
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    a, b = seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED)
    other = tmp_path / "other"
    ps.write_run(other, ps.train_config(48, 200, 8, "hero"), np.random.default_rng(0))
    for runs in ([a], [a, a], [a, other]):
        args = ["prereg", "check", str(prereg)] + [x for r in runs for x in ("--run", str(r))]
        assert main(args) == 2, runs
        assert not fmt.outcome_path(prereg).exists()
    err = capsys.readouterr().err
    assert "one --run per seed" in err and "twice" in err and "differs" in err
    with pytest.raises(DelphiError, match="seed list is empty"):
        seal(tmp_path / "empty.yaml", hero, [])
    assert not (tmp_path / "empty.yaml").exists()
    # A one-run seal given two runs is refused too.
    one = seal(tmp_path / "one.yaml", hero, None)
    assert main(["prereg", "check", str(one), "--run", str(a), "--run", str(b)]) == 2


def test_ensemble_is_the_geometric_mean_with_mean_relative_widths():
    entry = ensemble_entry({"a": {"loss": 1.0, "loss_90": [0.9, 1.2]}, "b": {"loss": 4.0, "loss_90": [3.8, 4.4]}})
    assert entry["loss"] == pytest.approx(2.0)
    assert entry["loss_90"] == pytest.approx([2.0 * (1 - 0.075), 2.0 * (1 + 0.15)])
    scored = score_competing({"e": entry}, 2.1)
    assert scored["e"]["covered_90"] is True and scored["e"]["rel_error"] == pytest.approx(0.05)


def test_study_spec_refuses_bad_seeds_and_forced_gates_without_reason(tmp_path):
    from delphi.study.spec import GatesSpec, HeroSpec, StudySpec

    with pytest.raises(DelphiError, match="hero.seeds"):
        StudySpec(hero=HeroSpec(seeds=(0, 0))).validate("s.yaml")
    with pytest.raises(DelphiError, match="gates.force.recipe"):
        StudySpec(gates=GatesSpec(force={"recipe": " "})).validate("s.yaml")


def test_prereg_create_keeps_a_users_gates_file(tmp_path):
    """Issue 41: a refused seal wrote NAME.gates.json over a user's file without --force."""
    root = ps.write_ladder(tmp_path / "ladder")
    fit = ps.write_fit(root, tmp_path / "fit.json")
    hero = ps.write_hero(tmp_path / "hero.yaml", ps.hero_config())
    mine = tmp_path / "h.gates.json"
    mine.write_text("my notes\n")
    assert main(["prereg", "create", "--fit", str(fit), "--hero", str(hero), "--out", str(tmp_path / "h.yaml")]) == 2
    assert mine.read_text() == "my notes\n" and not (tmp_path / "h.yaml").exists()


def test_an_edited_outcome_is_refused_by_verify_and_index(tmp_path, hero):
    """Issue 41: an outcome edited from failed to passed was verified and indexed as passed."""
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    runs = [seed_run(tmp_path, hero, 0, PREDICTED * 1.03), seed_run(tmp_path, hero, 1, PREDICTED * 1.03)]
    assert main(["prereg", "check", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]) == 1  # failed
    assert main(["prereg", "verify", str(prereg)]) == 0
    path = fmt.outcome_path(prereg)
    outcome = json.loads(path.read_text())
    path.write_text(json.dumps(outcome | {"verdict": "passed", "rel_error": 0.004}))
    result = verify(prereg)
    assert not result["ok"] and any("verdict" in p for p in result["problems"])
    assert main(["prereg", "verify", str(prereg)]) == 1
    # Consistent with itself but not with the runs' own records: still refused.
    path.write_text(
        json.dumps(
            outcome
            | {
                "verdict": "passed",
                "rel_error": 0.0,
                "actual_final_loss": PREDICTED,
                "covered_50": True,
                "covered_90": True,
            }
        )
    )
    assert any("run's records" in p for p in verify(prereg)["problems"])
    assert main(["prereg", "index", str(tmp_path)]) == 0
    assert "invalid: the outcome disagrees with its records" in (tmp_path / "README.md").read_text()


def test_paper_verify_with_nothing_to_verify_is_exit_2(tmp_path):
    assert main(["paper", "verify", "--preregistrations", str(tmp_path / "missing")]) == 2
    assert main(["paper", "verify", "--preregistrations", str(tmp_path)]) == 2


def test_verify_anchors_the_seal_in_the_commit_that_added_it(tmp_path, hero):
    import subprocess

    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), *args],
            check=True,
            capture_output=True,
            env={
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t",
                "PATH": "/usr/bin:/bin",
            },
        )

    git("init", "-q")
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    git("add", "two.yaml")
    git("commit", "-q", "-m", "seal")
    time.sleep(1.1)  # commit times are whole seconds
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED)]
    result = verify(prereg, run_dirs=runs)
    assert result["seal_commit"]["commit"] and result["commit_before_start"] is True


def test_a_study_trains_a_runs_seeds_side_by_side_and_checks_their_mean(store, tmp_path):
    """The study's runs beyond the ladder at hero.seeds: one process per seed, configs differing only
    in their seeds, each seed's run checked against the seal and the verdict on their mean."""
    from dataclasses import replace

    from delphi.model.config import ModelConfig, MoEConfig
    from delphi.study.seeds import seed_runs, train_seeds
    from delphi.train.config import DataConfig, OptimConfig, TrainConfig
    from delphi.train.rundir import read_metrics

    cfg = TrainConfig(
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, moe=MoEConfig(experts=4, top_k=2, d_expert=32)),
        data=DataConfig(store=str(store), seq_len=32, batch_size=8, seed=0),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.1, decay_frac=0.3),
        steps=8,
        log_every=2,
        eval_every=4,
        eval_tokens=512,
        name="probe",
    ).validate()
    config = tmp_path / "probe.yaml"
    config.write_text(yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False))
    prereg = seal(tmp_path / "probe.prereg.yaml", cfg, [0, 1])
    runs = seed_runs(config, tmp_path / "probe", (0, 1))
    assert [r.name for _, r in runs] == ["probe", "probe_s1"] and runs[0][0] == config
    member = yaml.safe_load(runs[1][0].read_text())
    assert member["seed"] == 1 and member["data"]["seed"] == 1
    assert {k: v for k, v in member.items() if k not in ("seed", "data", "name")} == {
        k: v for k, v in train_config_to_dict(replace(cfg)).items() if k not in ("seed", "data", "name")
    }
    summaries = train_seeds(runs, prereg, "probe")
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert (
        read_metrics(runs[0][1])[-1]["train_loss"] != read_metrics(runs[1][1])[-1]["train_loss"]
    )  # two seeds, two runs
    result, _, _ = check(prereg, run_dirs=[r for _, r in runs], record=False)
    assert result["verdict"] in ("passed", "failed") and len(result["seeds"]) == 2
    mean = sum(s["val_loss"] for s in summaries) / 2
    assert result["actual_final_loss"] == pytest.approx(mean)


def test_the_eta_of_a_resumed_run_ignores_the_hours_it_stood_stopped(tmp_path):
    """The study's progress line measures the rate in the run's training time (wall_s), over its
    newest records: a run stopped for an hour and resumed must not report an ETA twice too long."""
    import json

    from delphi.study.seeds import seed_progress

    run = tmp_path / "hero"
    run.mkdir()
    rows = [
        {
            "step": s,
            "time": 1000.0 + s + (3600.0 if s > 100 else 0.0),
            "wall_s": float(s),
            "train_loss": 1.0,
            "tokens_per_s": 10.0,
        }
        for s in range(0, 201, 20)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        seed_progress(run, 400) == "hero step 200/400, loss 1.0000, 10 tok/s, ETA 3 min"
    )  # 200 steps left at 1 step/s
