"""Hostile inputs, signals and memory (issue 31, items 3, 4 and 6): one test per class of input that
used to crash, pass silently or give a message that does not name what is wrong.

Every input is validated before use: a wrong value is exit 2 with one `delphi: error:` line that
names the file, the key and (at most ~200 characters of) the value. Ctrl-C at any moment of
`delphi train` exits 130 and leaves a resumable run; a run that dies anyway is recorded as failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import prereg_synthetic as ps
import pytest
import yaml
from micro_ladder import micro_ladder

from delphi.cli import main
from delphi.train.rundir import LOCK_FILE, read_status
from tests.test_train import tiny_config, write_config

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = REPO / "delphi" / "defaults"
MAX_ERROR_LINE_CHARS = 1_000  # an error line names things; it never reproduces a document


def _run(argv: list, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _refused(code: int, err: str, *names: str) -> str:
    """Exit 2 with one short `delphi: error:` line naming every one of `names`; the line."""
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("delphi: error:")]
    assert len(lines) == 1, err[-3000:]
    assert len(lines[0]) <= MAX_ERROR_LINE_CHARS, f"{len(lines[0])} characters: {lines[0][:300]}..."
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def ladder_world(tmp_path_factory) -> dict[str, Path]:
    """The synthetic study's ladder (completed runs, results.csv) and a fit of it."""
    root = tmp_path_factory.mktemp("hostile")
    ladder = ps.write_ladder(root / "ladder")
    fit = ps.write_fit(ladder, root / "fit.json")
    return {"root": root, "ladder": ladder, "results": ladder / "results.csv", "fit": fit}


# --------------------------------------------------------------------------- YAML alias bombs


def _alias_bomb(levels: int = 7) -> str:
    """A "billion laughs" value in YAML flow style: 9 ** levels strings (33 MB as text) from a few
    hundred bytes, each level an alias of the one before."""
    items = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


@pytest.mark.parametrize("command", ["train", "flops", "study", "ladder plan"])
def test_yaml_alias_bomb_is_refused_quickly_with_a_short_line(command, tmp_path, capsys):
    """A 675-byte bomb used to print a 39 MB error line (and a deeper one to end in a MemoryError
    after 40 s); the one YAML loader bounds what a document may expand to."""
    key = {"train": "optim: {lr: %s}", "flops": "model: {d_model: %s}", "study": "name: %s", "ladder plan": "name: %s"}
    path = tmp_path / "bomb.yaml"
    path.write_text(key[command] % _alias_bomb() + "\n")
    assert path.stat().st_size < 700
    argv = {
        "train": ["train", path, "--out", tmp_path / "run"],
        "flops": ["flops", path],
        "study": ["study", path, "--out", tmp_path / "study"],
        "ladder plan": ["ladder", "plan", path, "--out", tmp_path / "l"],
    }[command]
    start = time.perf_counter()
    code, err = _run(argv, capsys)
    assert time.perf_counter() - start < 10
    _refused(code, err, path, "alias")
    assert not (tmp_path / "run").exists() and not (tmp_path / "study").exists()


# --------------------------------------------------------------------------- fit JSON


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda p: p.update(alpha="0.3"), "params.alpha"),  # wrong type: used to crash with a traceback
        (lambda p: p.update(alpha=-0.3), "params.alpha"),  # wrong sign: used to print loss=None, exit 0
        (lambda p: p.update(E=float("nan")), "params.E"),  # NaN: likewise
        (lambda p: p.update(B=float("inf")), "params.B"),
        (lambda p: p.pop("beta"), "params.beta"),
        (lambda p: p.update(A=True), "params.A"),
    ],
)
def test_fit_json_with_a_wrong_parameter_is_exit_2_naming_the_key(edit, key, ladder_world, tmp_path, capsys):
    data = json.loads(ladder_world["fit"].read_text())
    edit(data["params"])
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps(data))  # json writes NaN and Infinity, as a hand edit might
    code, err = _run(["predict", fit, "--compute", "1e18"], capsys)
    _refused(code, err, fit, key)
    # the untouched fit still predicts
    assert _run(["predict", ladder_world["fit"], "--compute", "1e18"], capsys)[0] == 0


# --------------------------------------------------------------------------- manifests and summaries


@pytest.fixture
def planned_ladder(tmp_path) -> Path:
    """A planned micro ladder whose rungs are all finished (constructed run dirs, no training)."""
    from delphi.ladder.manifest import read_manifest

    ladder = micro_ladder(tmp_path, [1e9, 2e9])
    for i, row in enumerate(read_manifest(ladder)):
        run_dir = ladder / "runs" / row["run_id"]
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text((ladder / row["config"]).read_text())
        (run_dir / "metrics.jsonl").write_text(
            json.dumps({"step": int(row["steps"]), "val_loss": 3.0 - 0.1 * i}) + "\n"
        )
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "val_loss": 3.0 - 0.1 * i,
                    "val_bpb": 4.0,
                    "steps": int(row["steps"]),
                    "tokens": int(row["tokens"]),
                    "flops": float(row["flops"]),
                }
            )
        )
        (run_dir / "status.json").write_text(
            json.dumps({"status": "completed", "reason": "", "step": int(row["steps"])})
        )
    return ladder


def test_truncated_manifest_and_corrupt_summary_are_named(planned_ladder, tmp_path, capsys):
    ladder = planned_ladder
    manifest = ladder / "manifest.csv"
    text = manifest.read_text()
    rows = text.splitlines()
    assert len(rows) >= 3
    # A manifest cut in the middle of its last row used to be a TypeError traceback from `ladder run`.
    manifest.write_text(text[: len(text) - len(rows[-1]) // 2 - 1])
    for argv in (
        ["ladder", "run", ladder, "--workers", "1"],
        ["ladder", "collect", ladder, "--out", tmp_path / "r.csv"],
    ):
        code, err = _run(argv, capsys)
        _refused(code, err, "manifest.csv", f"line {len(rows)}")
    manifest.write_text(text)

    # A completed rung whose summary.json is corrupt: `ladder collect` used to drop it silently and
    # `ladder run` to count it completed. Now collect names it (exit 2), run fails it (exit 1).
    victim = sorted((ladder / "runs").iterdir())[0]
    (victim / "summary.json").write_text('{"status": "completed", "val_lo')
    code, err = _run(["ladder", "collect", ladder, "--out", tmp_path / "r.csv"], capsys)
    _refused(code, err, victim / "summary.json", "corrupt")
    assert not (tmp_path / "r.csv").exists()
    code, err = _run(["ladder", "run", ladder, "--workers", "1", "--json"], capsys)
    assert code == 1, err
    assert f"{victim.name}: failed" in err and "summary.json" in err
    assert read_status(victim)["status"] == "completed"  # nothing was retrained or rewritten


# --------------------------------------------------------------------------- duplicate rows in a results table


def test_duplicate_rows_and_run_ids_are_refused_unless_dropped(ladder_world, tmp_path, capsys):
    """Duplicates used to count as extra seeds (E's 90% interval narrowed from [0.957, 1.427] to
    [1.058, 1.428] in the issue's example)."""
    table = pd.read_csv(ladder_world["results"])
    doubled = tmp_path / "doubled.csv"
    pd.concat([table, table.iloc[[2, 5]]], ignore_index=True).to_csv(doubled, index=False)
    for command in (["fit", "vpnls"], ["fit", "parametric"], ["fit", "backtest"]):
        code, err = _run([*command, doubled], capsys)
        _refused(code, err, doubled, "--drop-duplicates", f"rows {len(table)}, {len(table) + 1}")
    # --drop-duplicates keeps going, with exactly the fit of the table without them
    assert _run(["fit", "vpnls", ladder_world["results"], "--out", tmp_path / "kept.json"], capsys)[0] == 0
    code, err = _run(["fit", "vpnls", doubled, "--drop-duplicates", "--out", tmp_path / "dropped.json"], capsys)
    assert code == 0 and "dropped 2 row(s)" in err, err
    params = [json.loads((tmp_path / f"{name}.json").read_text())["params"] for name in ("kept", "dropped")]
    assert params[0] == pytest.approx(params[1], rel=1e-9)
    # a run_id on two rows with different values: which is the run cannot be told, even with the flag
    clash = table.copy()
    clash.loc[1, "run_id"] = clash.loc[0, "run_id"]
    path = tmp_path / "clash.csv"
    clash.to_csv(path, index=False)
    code, err = _run(["fit", "vpnls", path, "--drop-duplicates"], capsys)
    _refused(code, err, path, repr(str(clash.loc[0, "run_id"])), "rows 0, 1")


# --------------------------------------------------------------------------- infinities in configs


@pytest.mark.parametrize(
    "key, value",
    [
        ("optim.lr", ".inf"),
        ("optim.weight_decay", ".inf"),
        ("optim.grad_clip", ".inf"),
        ("model.rope_theta", ".inf"),
        ("checkpoint_every_s", ".inf"),
        ("optim.lr", ".nan"),  # refused before as well: the rule infinities now follow
    ],
)
def test_infinite_float_in_a_config_is_refused_like_nan(key, value, store, tmp_path, capsys):
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    data = yaml.safe_load(config.read_text())
    *parents, leaf = key.split(".")
    node = data
    for parent in parents:
        node = node[parent]
    node[leaf] = "PLACEHOLDER"
    config.write_text(yaml.safe_dump(data).replace("PLACEHOLDER", value))
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    _refused(code, err, config, key, value.strip("-."))
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- values quoted in full


def test_error_messages_quote_at_most_about_200_characters_of_a_value(tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"optim": {"lr": "x" * 100_000}, "steps": list(range(20_000))}))
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    line = _refused(code, err, config, "optim.lr")
    from delphi.errors import QUOTED_VALUE_MAX_CHARS, quoted

    assert "x" * (QUOTED_VALUE_MAX_CHARS + 10) not in line
    assert len(quoted("y" * 10**6)) <= QUOTED_VALUE_MAX_CHARS + 3
    assert len(quoted([[list(range(1000))] * 1000] * 1000)) <= QUOTED_VALUE_MAX_CHARS + 3


# --------------------------------------------------------------------------- messages that name the file


def test_messages_name_the_file(ladder_world, store, tmp_path, capsys):
    # the vocabulary check names the config
    config = write_config(tmp_path / "vocab.yaml", tiny_config(store), **{"model.vocab_size": 16})
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    _refused(code, err, config, "model.vocab_size")
    # "1 compute budget" and a backtest cut outside the budgets name the table
    table = pd.read_csv(ladder_world["results"])
    one = tmp_path / "one_budget.csv"
    table.assign(budget=1e15).to_csv(one, index=False)
    code, err = _run(["fit", "isoflop", one], capsys)
    _refused(code, err, one, "1 compute budget")
    code, err = _run(["fit", "backtest", ladder_world["results"], "--cut", "1e30"], capsys)
    _refused(code, err, ladder_world["results"], "cut")
    # a directory given as a table is a directory, not "file not found"
    code, err = _run(["fit", "isoflop", tmp_path], capsys)
    line = _refused(code, err, tmp_path, "is a directory")
    assert "not found" not in line
    # a byte that is not UTF-8 on line 32 is reported on line 32, not at "position 0"
    lines = (REPO / "tests" / "data" / "isoflops.csv").read_bytes().split(b"\n")
    lines[31] = lines[31][:5] + b"\xff" + lines[31][5:]
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\n".join(lines))
    code, err = _run(["fit", "isoflop", bad], capsys)
    _refused(code, err, bad, "line 32")


# --------------------------------------------------------------------------- memory


def test_a_run_too_big_for_available_memory_is_refused_with_the_numbers(store, tmp_path, capsys):
    """Parameters small enough for the old check (16 bytes per parameter against the machine's RAM),
    activations far beyond any machine's memory: refused before anything is written."""
    config = write_config(tmp_path / "big.yaml", tiny_config(store), **{"data.batch_size": 4096, "data.seq_len": 65536})
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    line = _refused(code, err, config, "activations", "optimizer state", "GB", "data.batch_size=4096")
    assert "available" in line
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- signals: Ctrl-C and deaths


def _train_process(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    """`delphi train` as a user runs it, with Ctrl-C's default action (a test runner may ignore it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # A process started in the background inherits SIGINT ignored: restore Python's own handler
    # first (in the child, not by preexec_fn, which would fork this process's JAX threads).
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'delphi'; runpy.run_module('delphi.cli', run_name='__main__')"
    )
    return subprocess.Popen(
        [sys.executable, "-c", start, "train", str(config), "--out", str(out), "--no-progress", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _assert_interrupted_cleanly(proc: subprocess.Popen, run: Path) -> None:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Segmentation" not in err and "Fatal Python error" not in err, err[-3000:]
    assert not (run / LOCK_FILE).exists()
    status = read_status(run)
    if status is not None:  # something was written: a resumable stop, never a stale "pending"
        assert status["status"] == "failed" and status["reason"].endswith("continue with --resume"), status


def test_ctrl_c_during_start_up_exits_130_and_writes_nothing(store, tmp_path):
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    run = tmp_path / "run"
    proc = _train_process(config, run)
    time.sleep(0.5)  # importing JAX: the moment a KeyboardInterrupt used to unwind through native code
    proc.send_signal(signal.SIGINT)
    _assert_interrupted_cleanly(proc, run)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["importing", "run dir written", "first metrics"])
def test_ctrl_c_at_any_moment_exits_130_and_the_run_resumes(moment, store, tmp_path):
    """Used to end in a segmentation fault (exit 139) in 4 of 5 tries during start-up or compilation,
    or to leave `status: pending`. Each moment, then `--resume` finishes the run."""
    cfg = tiny_config(store, steps=160, log_every=4, eval_every=80, checkpoint_every=80)
    config = write_config(tmp_path / "cfg.yaml", cfg)
    run = tmp_path / "run"
    proc = _train_process(config, run)
    try:
        reached = {
            "importing": lambda: time.sleep(1.5) or True,
            "run dir written": lambda: (run / "status.json").exists(),
            "first metrics": lambda: (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size > 0,
        }[moment]
        assert _wait_for(reached, 180), "the trainer never got there"
        proc.send_signal(signal.SIGINT)
        _assert_interrupted_cleanly(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
    resumed = _train_process(config, run, *(["--resume"] if run.exists() else []))
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert read_status(run)["status"] == "completed" and not (run / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_trainer_killed_by_an_uncatchable_signal_is_recorded_failed_without_a_stale_lock(store, tmp_path):
    """An abort inside XLA (SIGABRT) used to leave `status: pending` and train.lock behind: the
    `delphi train` supervisor records the death; `--resume` then finishes the run."""
    config = write_config(
        tmp_path / "cfg.yaml", tiny_config(store, steps=160, log_every=4, eval_every=80, checkpoint_every=80)
    )
    run = tmp_path / "run"
    proc = _train_process(config, run)
    try:
        assert _wait_for(lambda: (run / LOCK_FILE).exists(), 180)
        trainer = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(trainer, signal.SIGABRT)  # what XLA's allocator does when it fails
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGABRT, err[-3000:]
    status = read_status(run)
    assert status["status"] == "failed" and "SIGABRT" in status["reason"], status
    assert not (run / LOCK_FILE).exists()
    resumed = _train_process(config, run, "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
