"""`prereg check` on another trainer's log (issue 50, item 3; issue 53, cause 5): a JSONL, CSV, TSV
or W&B-export log under the trainer's own names, judged against a real seal; a final verdict once the
log reaches the hero's tokens; the midway lines of every seal; each bad log an exit 2 naming it; and a
multi-seed watch that waits for every seed."""

from __future__ import annotations

import csv
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import prereg_synthetic as ps
import pytest

from delphi import prereg_format as fmt
from delphi.cli import main
from delphi.errors import DelphiError
from delphi.train.runlog import END_TOLERANCE_REL, ColumnNotFound, EvalPoint, LogColumns, RunEnd, read_log, read_run

SEED = 5  # the hero curve's noise; this seed's curve passes the seals below (tests/test_prereg.py)


@pytest.fixture(scope="module")
def seals(tmp_path_factory):
    """Two real seals of one hero: one with the trajectory the curve law fits on the ladder's curves,
    and one from the results table alone (no curves: the final loss only, as an external table gives)."""
    root = tmp_path_factory.mktemp("live")
    ladder = ps.write_ladder(root / "ladder")
    fit = ps.write_fit(ladder, root / "fit.json")
    hero_cfg = ps.hero_config()
    hero = ps.write_hero(root / "hero.yaml", hero_cfg)
    trajectory, final_only = root / "seals" / "trajectory.yaml", root / "seals" / "final_only.yaml"
    common = ["prereg", "create", "--fit", str(fit), "--hero", str(hero), "--tolerance", "0.03", "--force"]
    assert main([*common, "--ladder", str(ladder), "--out", str(trajectory), "--bootstrap", "40"]) == 0
    assert main([*common, "--results", str(ladder / "results.csv"), "--out", str(final_only)]) == 0
    assert len(fmt.read(final_only)["prediction"]["trajectory"]["points"]) == 1
    return {
        "root": root,
        "hero_cfg": hero_cfg,
        "trajectory": trajectory,
        "final_only": final_only,
        "ladder": ladder,
        "fit": fit,
    }


def _copy(seal: Path, tmp_path: Path) -> Path:
    """A copy of the seal: a final verdict writes NAME.outcome.json beside it."""
    (tmp_path / "regs").mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(seal, tmp_path / "regs" / seal.name))


def trainer_rows(cfg, *, upto: float = 1.0, shift: float = 0.0, start: float | None = None) -> list[dict]:
    """What another trainer logs, under its own names: a training row between evals (iter,
    tokens_seen, train/loss, lr) and an eval row (iter, tokens_seen, eval/loss), each with a wall-clock time."""
    steps, tokens, loss = ps.true_curve(cfg, np.random.default_rng(SEED))
    keep = steps <= upto * cfg.steps
    now = time.time() if start is None else start
    rows, previous = [], 0
    for k, (s, t, l) in enumerate(zip(steps[keep], tokens[keep], loss[keep] + shift)):
        half, previous = (previous + int(s)) // 2, int(s)
        rows.append(
            {
                "iter": half,
                "tokens_seen": half * cfg.tokens_per_step,
                "train/loss": float(l) + 0.05,
                "lr": 0.01,
                "time": now + 2 * k,
            }
        )
        rows.append({"iter": int(s), "tokens_seen": int(t), "eval/loss": float(l), "time": now + 2 * k + 1})
    return rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _table(path: Path, rows: list[dict], columns: list[str], delimiter: str = ",") -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(columns)
        for r in rows:
            writer.writerow(["" if r.get(c) is None else r[c] for c in columns])
    return path


def _check(args: list[str], capsys) -> tuple[int, dict | None, str]:
    code = main(["prereg", "check", *args, "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


# --------------------------------------------------------------------------- the live watch


def test_a_trainer_appending_jsonl_is_watched_to_a_verdict(seals, tmp_path, capsys, monkeypatch):
    """A simulated trainer appends its own keys (iter, tokens_seen, eval/loss) line by line while
    `prereg check --watch` follows the log: the watch waits for the first eval loss, judges each eval
    against the sealed band, and ends with the final verdict when the log reaches the hero's tokens,
    without any status.json. The trainer writes its next line only after the watch has read the log
    twice more, so every state of the log is seen however loaded the machine is."""
    from delphi.prereg import check as ck

    prereg = _copy(seals["trajectory"], tmp_path)
    cfg = seals["hero_cfg"]
    log = tmp_path / "hero" / "train_log.jsonl"
    log.parent.mkdir()
    rows = trainer_rows(cfg)
    _jsonl(log, rows[:1])  # a training row only: no eval loss column yet
    polls, read = [0], threading.Condition()

    def counted(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        finally:
            with read:
                polls[0] += 1
                read.notify_all()

    check = ck.check
    monkeypatch.setattr(ck, "check", counted)

    def train():
        with open(log, "a") as f:
            for row in rows[1:]:
                with read:
                    seen = polls[0]
                    assert read.wait_for(lambda: polls[0] >= seen + 2, timeout=60)  # noqa: B023  (called at once, inside the loop)
                row["time"] = time.time()
                f.write(json.dumps(row) + "\n")
                f.flush()

    thread = threading.Thread(target=train)
    thread.start()
    code, result, err = _check(
        [
            str(prereg),
            "--run",
            str(log.parent),
            "--watch",
            "--interval",
            "0.05",
            "--timeout",
            "60",
            "--plot",
            str(tmp_path / "pred.png"),
        ],
        capsys,
    )
    thread.join()
    assert code == 0 and result["verdict"] == "passed", err
    assert result["log"] == {
        "path": str(log),
        "columns": {"step": "iter", "tokens": "tokens_seen", "loss": "eval/loss", "time": "time"},
    }
    assert "the first to reach" in result["why"] and result["created_before_start"] is True
    assert result["n_points"] == 21 and result["actual_final_loss"] == pytest.approx(rows[-1]["eval/loss"])
    assert "waiting:" in err and "no eval loss column" in err and "on-track" in err
    assert "read " + str(log) + ": step = iter, tokens = tokens_seen, loss = eval/loss, time = time" in err
    outcome = json.loads(fmt.outcome_path(prereg).read_text())
    assert outcome["verdict"] == "passed" and outcome["run_dir"] == str(log.parent.resolve())
    assert (tmp_path / "pred.png").stat().st_size > 0


def test_a_log_off_the_band_deviates_then_fails(seals, tmp_path, capsys):
    prereg = _copy(seals["trajectory"], tmp_path)
    cfg = seals["hero_cfg"]
    log = _jsonl(tmp_path / "off.jsonl", trainer_rows(cfg, upto=0.5, shift=0.15))
    code, result, _ = _check([str(prereg), "--run", str(log)], capsys)
    assert code == 1 and result["verdict"] == "deviating" and result["rel_error"] > 0.05
    assert "sealed trajectory's 90% band" in result["judged"]
    _jsonl(log, trainer_rows(cfg, shift=0.15))
    code, result, _ = _check([str(prereg), "--run", str(log)], capsys)
    assert code == 1 and result["verdict"] == "failed" and result["covered_90"] is False


def test_a_seal_of_the_final_loss_only_says_so_midway(seals, tmp_path, capsys):
    """A seal made from a results table without ladder curves predicts the final loss alone: midway
    the check says that nothing can be judged before the hero's tokens (verdict in-progress, exit 0),
    not "not-started"; at the end it gives the verdict."""
    prereg = _copy(seals["final_only"], tmp_path)
    cfg = seals["hero_cfg"]
    log = _jsonl(tmp_path / "log.jsonl", trainer_rows(cfg, upto=0.5))
    code, result, err = _check([str(prereg), "--run", str(log)], capsys)
    assert code == 0 and result["verdict"] == "in-progress" and result["n_points"] == 0 and result["n_evals"] == 10
    assert "the seal predicts the final loss only" in result["judged"] and "50% of them" in result["judged"]
    assert "in-progress: latest eval" in err and "the seal predicts the final loss only" in err
    _jsonl(log, trainer_rows(cfg))
    code, result, _ = _check([str(prereg), "--run", str(log)], capsys)
    assert code == 0 and result["verdict"] == "passed" and result["n_points"] == 1


# --------------------------------------------------------------------------- formats


def test_csv_tsv_and_wandb_exports_read_alike(seals, tmp_path, capsys):
    """The same run as CSV (HF-style names), TSV, a W&B history CSV (`_step`, `_runtime`,
    `_timestamp`, `eval/loss`, no tokens column: tokens are the step x the hero's tokens per step) and
    a W&B JSON export (pandas' column mapping) gives the same verdict and final loss."""
    cfg = seals["hero_cfg"]
    rows = trainer_rows(cfg)
    hf = [
        {
            "global_step": r["iter"],
            "num_tokens": r["tokens_seen"],
            "eval_loss": r.get("eval/loss"),
            "timestamp": r["time"],
        }
        for r in rows
    ]
    wandb = [
        {
            "": i,
            "_step": r["iter"],
            "_runtime": 3.0 * i,
            "_timestamp": r["time"],
            "eval/loss": r.get("eval/loss"),
            "train/loss": r.get("train/loss"),
        }
        for i, r in enumerate(rows)
    ]
    logs = {
        "csv": _table(tmp_path / "hf.csv", hf, ["global_step", "num_tokens", "eval_loss", "timestamp"]),
        "tsv": _table(tmp_path / "hf.tsv", hf, ["global_step", "num_tokens", "eval_loss", "timestamp"], "\t"),
        "wandb_csv": _table(
            tmp_path / "wandb_export.csv", wandb, ["", "_step", "_runtime", "_timestamp", "eval/loss", "train/loss"]
        ),
    }
    columns = {
        k: {str(i): r.get(k) for i, r in enumerate(wandb)} for k in ("_step", "_runtime", "_timestamp", "eval/loss")
    }
    logs["wandb_json"] = tmp_path / "history.json"
    logs["wandb_json"].write_text(json.dumps(columns))
    finals = {}
    for name, log in logs.items():
        prereg = _copy(seals["trajectory"], tmp_path / name)
        code, result, err = _check([str(prereg), "--run", str(log)], capsys)
        assert code == 0 and result["verdict"] == "passed", (name, err)
        finals[name] = result["actual_final_loss"]
        assert result["n_points"] == 21, name
    assert len({round(v, 12) for v in finals.values()}) == 1
    assert result["log"]["columns"] == {
        "step": "_step",
        "tokens": f"_step x {cfg.tokens_per_step:g} tokens per step",
        "loss": "eval/loss",
        "time": "_timestamp",
    }


def test_mapping_flags_name_the_columns(seals, tmp_path, capsys):
    cfg = seals["hero_cfg"]
    rows = [
        {"k": r["iter"], "seen": r["tokens_seen"], "loss": r.get("eval/loss"), "when": r["time"]}
        for r in trainer_rows(cfg)
    ]
    log = _table(tmp_path / "mine.csv", rows, ["k", "seen", "loss", "when"])
    prereg = _copy(seals["trajectory"], tmp_path)
    code, _, err = _check([str(prereg), "--run", str(log)], capsys)
    assert code == 2 and "no eval loss column" in err and "most trainers log the training loss under it" in err
    assert "'k', 'seen', 'loss', 'when'" in err
    code, result, _ = _check(
        [
            str(prereg),
            "--run",
            str(log),
            "--step-col",
            "k",
            "--tokens-col",
            "seen",
            "--loss-col",
            "loss",
            "--time-col",
            "when",
        ],
        capsys,
    )
    assert code == 0 and result["verdict"] == "passed"
    assert result["log"]["columns"] == {"step": "k", "tokens": "seen", "loss": "loss", "time": "when"}


def test_the_reader_alone(tmp_path):
    """`read_run` on a Delphi run dir stays the trainer's reader (the mapping flags are for other
    logs); a metrics.jsonl alone, with no status.json or config.yaml, is read as any trainer's log."""
    cfg = ps.train_config(32, 200, 8, "run")
    ps.write_run(tmp_path / "run", cfg, np.random.default_rng(0))
    run = read_run(tmp_path / "run")
    assert run.kind == "run_dir" and run.status == "completed" and run.evals[-1].loss == run.final_loss
    with pytest.raises(DelphiError, match="is a Delphi run dir"):
        read_run(tmp_path / "run", LogColumns(loss="val_loss"))
    (tmp_path / "other").mkdir()
    shutil.copy(tmp_path / "run" / "metrics.jsonl", tmp_path / "other")
    log = read_run(tmp_path / "other")
    assert log.kind == "log" and log.status == "running" and log.evals == run.evals
    assert log.columns == {"step": "step", "tokens": "tokens", "loss": "val_loss", "time": "time"}
    end, close = RunEnd(1000.0, steps=100), EvalPoint(90, 999.5, 1.0)
    assert (
        not end.reached_by(close)
        and end.reached_by(EvalPoint(100, 990.0, 1.0))
        and end.reached_by(EvalPoint(9, 1000.0, 1.0))
    )
    assert end.reached_by(close, END_TOLERANCE_REL) and not end.reached_by(EvalPoint(90, 998.0, 1.0), END_TOLERANCE_REL)


# --------------------------------------------------------------------------- bad logs


def test_each_bad_log_is_exit_2_naming_file_line_and_column(seals, tmp_path, capsys):
    prereg = _copy(seals["trajectory"], tmp_path)
    cfg = seals["hero_cfg"]
    good = [r for r in trainer_rows(cfg) if "eval/loss" in r]

    def refused(rows, *flags, text=None, name="bad.jsonl"):
        log = tmp_path / name
        log.write_text(text if text is not None else "".join(json.dumps(r) + "\n" for r in rows))
        code, result, err = _check([str(prereg), "--run", str(log), *flags], capsys)
        assert code == 2 and result is None and len(err.strip().splitlines()) == 1, err
        assert not fmt.outcome_path(prereg).exists()
        return err

    err = refused(good, "--loss-col", "val/loss")
    assert (
        "bad.jsonl" in err and "column 'val/loss' (mapped to the eval loss) not found" in err and "'eval/loss'" in err
    )
    backwards = good[:5] + [good[2] | {"time": good[4]["time"] + 1}] + good[5:]
    err = refused(backwards)
    assert "bad.jsonl:6" in err and "goes backwards" in err and "iter = " in err
    twice = good[:5] + [good[4] | {"eval/loss": 3.0}] + good[5:]
    err = refused(twice)
    assert "bad.jsonl:6" in err and "a second eval at iter" in err and "bad.jsonl:5" in err
    err = refused(good[:3] + [good[3] | {"eval/loss": "2.9 nats"}])
    assert "bad.jsonl:4" in err and "eval/loss = '2.9 nats'" in err
    err = refused(good[:3], text="iter,tokens_seen,eval/loss,time\n1,10,nan,1900000000\n", name="bad.csv")
    assert "bad.csv:2" in err and "eval/loss = 'nan'" in err and "finite" in err
    err = refused(good[:3], "--finished")
    assert "declared finished" in err and f"{cfg.tokens:.4g} tokens" in err and f"step {cfg.steps}" in err
    err = refused([r | {"time": 12.5 + k} for k, r in enumerate(good[:3])])
    assert "time = 12.5" in err and "epoch seconds" in err
    err = refused([{"iter": r["iter"], "loss": r["eval/loss"], "time": r["time"]} for r in good[:3]])
    assert "no eval loss column" in err and "'iter', 'loss', 'time'" in err


def test_a_log_without_a_time_cannot_show_it_started_after_the_seal(seals, tmp_path, capsys):
    prereg = _copy(seals["trajectory"], tmp_path)
    rows = [{k: v for k, v in r.items() if k != "time"} for r in trainer_rows(seals["hero_cfg"])]
    code, result, _ = _check([str(prereg), "--run", str(_jsonl(tmp_path / "log.jsonl", rows))], capsys)
    assert code == 1 and result["verdict"] == "invalid: the run's start cannot be established"
    assert "--time-col" in result["why"] and not fmt.outcome_path(prereg).exists()
    early = trainer_rows(seals["hero_cfg"], start=time.time() - 10 * 86400)
    code, result, _ = _check([str(prereg), "--run", str(_jsonl(tmp_path / "early.jsonl", early))], capsys)
    assert code == 1 and result["verdict"] == "invalid: the run predates the preregistration"


def test_a_torn_last_line_is_being_written():
    """The one torn-line rule, in every format: a last line without its newline is skipped."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.csv"
        log.write_text("step,tokens,val_loss,time\n1,10,2.5,1900000000\n2,20,2.")
        run = read_log(log)
        assert [e.loss for e in run.evals] == [2.5] and run.n_rows == 1
        jsonl = Path(tmp) / "log.jsonl"
        jsonl.write_text('{"step": 1, "train_loss": 3.0}\n{"step": 2, "val_')
        with pytest.raises(ColumnNotFound) as missing:
            read_log(jsonl)
        assert missing.value.sparse and "keys in the rows so far: 'step', 'train_loss'" in str(missing.value)


# --------------------------------------------------------------------------- multi-seed watch (issue 53, cause 5)


def test_a_multi_seed_watch_waits_for_every_seed(tmp_path, capsys):
    """Seed 0 has finished, seed 1 is still training: the watch goes on (before, it returned
    "on-track", exit 0, as soon as the first seed finished); it ends with the verdict on the mean
    once seed 1 finishes."""
    from test_prereg_seeds import PREDICTED, seal, seed_run

    hero = ps.train_config(32, 200, 8, "hero")
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    first = seed_run(tmp_path, hero, 0, PREDICTED * 1.004)
    done = seed_run(tmp_path / "done", hero, 1, PREDICTED * 0.998)  # seed 1 as it will end
    second = tmp_path / done.name
    second.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(done / name, second / name)
    (second / "status.json").write_text(json.dumps({"status": "running", "reason": "", "step": 190, "updated": ""}))
    args = [str(prereg), "--run", str(first), "--run", str(second), "--watch", "--interval", "0.05"]
    started = time.monotonic()
    code, result, _ = _check([*args, "--timeout", "1"], capsys)
    assert time.monotonic() - started >= 1 and code == 0
    assert result["verdict"] == "on-track" and result["watch"] == "stopped after 1 s without a final verdict"
    assert not fmt.outcome_path(prereg).exists()

    def finish():  # as the trainer ends a run: the summary, then the status, each replaced in one step
        time.sleep(0.5)
        for name in ("summary.json", "status.json"):
            shutil.copy(done / name, second / f"{name}.tmp")
            (second / f"{name}.tmp").replace(second / name)

    thread = threading.Thread(target=finish)
    thread.start()
    code, result, _ = _check([*args, "--timeout", "60"], capsys)
    thread.join()
    assert (
        code == 0 and result["verdict"] == "passed" and result["actual_final_loss"] == pytest.approx(PREDICTED * 1.001)
    )
    assert json.loads(fmt.outcome_path(prereg).read_text())["verdict"] == "passed"
