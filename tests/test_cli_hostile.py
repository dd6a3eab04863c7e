"""Hostile and careless inputs to every command (issue 12): exit 2, one line naming the
file/flag/value, nothing written.

One test per class of input, parametrised over the commands it concerns. Every command runs
in-process through `delphi.cli.main`; "nothing written" is checked by listing the whole test
directory before and after (plus the --out path itself where it lies outside it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import prereg_synthetic as ps
import pytest
import yaml

from delphi.cli import main

DEFAULTS = Path(__file__).resolve().parents[1] / "delphi" / "defaults"


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of `delphi ARGV` run in-process; argparse's exits count too."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _assert_refused(code: int, err: str, *names: str) -> None:
    """Exit 2 and one `delphi: error:` line (argparse prints its usage first) naming every `names`."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("delphi: error:")]
    assert len(lines) == 1, err
    for name in names:
        assert str(name) in lines[0], (name, lines[0])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Real inputs for every command: a results table, a fit, a ladder of run dirs, a hero
    config and a sealed preregistration (the synthetic study of tests/prereg_synthetic.py)."""
    root = tmp_path_factory.mktemp("world")
    ladder = ps.write_ladder(root / "ladder")
    (ladder / "configs").mkdir()
    shutil.copy(ladder / "runs" / "d32_k10" / "config.yaml", ladder / "configs" / "d32_k10.yaml")
    fit = ps.write_fit(ladder, root / "fit.json")
    hero_cfg = ps.hero_config()
    hero = ps.write_hero(root / "hero.yaml", hero_cfg)
    prereg = root / "regs" / "sealed.yaml"
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
                "5",
                "--force",
            ]
        )
        == 0
    )
    coord = root / "coordcheck.json"
    coord.write_text(json.dumps({"results": [{"width": 32}]}))
    return {
        "root": root,
        "ladder": ladder,
        "results": ladder / "results.csv",
        "fit": fit,
        "hero": hero,
        "hero_cfg": hero_cfg,
        "prereg": prereg,
        "coord": coord,
        "train": DEFAULTS / "tiny.yaml",
        "spec": DEFAULTS / "ladder_default.yaml",
    }


@pytest.fixture
def work(world, tmp_path) -> dict[str, Path]:
    """A private copy of the world's input files (the tests write garbage over some of them)."""
    out = {}
    for key, path in world.items():
        if isinstance(path, Path) and path.is_file():
            out[key] = tmp_path / "in" / path.name
            out[key].parent.mkdir(exist_ok=True)
            shutil.copy(path, out[key])
    out["ladder"] = world["ladder"]
    out["tmp"] = tmp_path
    return out


# ----------------------------------------------------------------- --out is one of the inputs (row 1)

# (command with {input} and {out} placeholders, which input --out points at)
OUT_IS_INPUT = {
    "fit isoflop": (["fit", "isoflop", "{results}", "--out", "{out}"], "results"),
    "fit vpnls": (["fit", "vpnls", "{results}", "--out", "{out}"], "results"),
    "fit backtest": (["fit", "backtest", "{results}", "--out", "{out}"], "results"),
    "ladder hero (fit)": (
        ["ladder", "hero", "--fit", "{fit}", "--compute", "1e15", "--spec", "{spec}", "--out", "{out}"],
        "fit",
    ),
    "ladder hero (spec)": (
        ["ladder", "hero", "--fit", "{fit}", "--compute", "1e15", "--spec", "{spec}", "--out", "{out}"],
        "spec",
    ),
    "prereg create (hero)": (["prereg", "create", "--fit", "{fit}", "--hero", "{hero}", "--out", "{out}"], "hero"),
    "prereg create (fit)": (["prereg", "create", "--fit", "{fit}", "--hero", "{hero}", "--out", "{out}"], "fit"),
    "plot coordcheck": (["plot", "coordcheck", "{coord}", "--out", "{out}"], "coord"),
    "plot residuals": (["plot", "residuals", "{results}", "--fit", "{fit}", "--out", "{out}"], "fit"),
}


def _fill(template: list[str], values: dict) -> list[str]:
    return [t.format(**{k: str(v) for k, v in values.items()}) for t in template]


@pytest.mark.parametrize("name", sorted(OUT_IS_INPUT))
def test_out_that_is_an_input_is_refused_and_the_input_kept(name, work, capsys):
    template, target = OUT_IS_INPUT[name]
    if target == "spec":
        shutil.copy(DEFAULTS / "ladder_default.yaml", work["tmp"] / "in" / "spec.yaml")
        work["spec"] = work["tmp"] / "in" / "spec.yaml"
    before = _tree(work["tmp"])
    # spelled differently from the input (./ and the absolute path): the same file all the same
    out = (
        Path(os.path.relpath(work[target], Path.cwd()))
        if target != "fit"
        else Path(str(work[target]).replace("/in/", "/in/./"))
    )
    code, err = _run(_fill(template, {**work, "out": out}), capsys)
    _assert_refused(code, err, "--out", "input")
    assert _tree(work["tmp"]) == before


# ------------------------------------------------------------- a ladder's own files as --out (row 2)


@pytest.mark.parametrize("own", ["manifest.csv", "ladder.yaml", "configs/d32_k10.yaml", "runs/d32_k10/metrics.jsonl"])
@pytest.mark.parametrize("command", ["ladder collect", "prereg curves"])
def test_out_inside_a_ladders_own_files_is_refused(command, own, world, tmp_path, capsys):
    ladder = tmp_path / "ladder"
    shutil.copytree(world["ladder"], ladder)
    (ladder / "ladder.yaml").write_text("name: x\n")
    before = _tree(tmp_path)
    argv = (
        ["ladder", "collect", ladder, "--out", ladder / own]
        if command == "ladder collect"
        else ["prereg", "curves", ladder, "--out", ladder / own, "--bootstrap", "0"]
    )
    code, err = _run(argv, capsys)
    _assert_refused(code, err, "--out", own.split("/")[-1])
    assert _tree(tmp_path) == before
    # the ladder still reads: `ladder collect` into a fresh file works
    code, err = _run(["ladder", "collect", ladder, "--out", tmp_path / "results.csv", "--all"], capsys)
    assert "Traceback" not in err


def test_a_clobbered_manifest_is_a_clear_error_not_a_key_error(world, tmp_path, capsys):
    ladder = tmp_path / "ladder"
    shutil.copytree(world["ladder"], ladder)
    (ladder / "manifest.csv").write_text(json.dumps({"kind": "isoflop"}) + "\n")  # what row 2 left behind
    for argv in (
        ["ladder", "run", ladder, "--workers", "1"],
        ["ladder", "collect", ladder, "--out", tmp_path / "r.csv"],
    ):
        code, err = _run(argv, capsys)
        _assert_refused(code, err, "manifest.csv")
    assert not (tmp_path / "r.csv").exists()


# ------------------------------------------------------------------ garbage as YAML / JSON (row 5)

BINARY = bytes(random.Random(12).randrange(256) for _ in range(600)) + b"\xff\xfe"
TEXT_GARBAGE = b'{"unclosed": [1, 2,\n  key: : value\n\t- ]]'

# (command, which input gets the garbage)
GARBAGE_READERS = {
    "flops": (["flops", "{bad}"], None),
    "train": (["train", "{bad}", "--out", "{out}"], None),
    "ladder plan": (["ladder", "plan", "{bad}", "--out", "{out}"], None),
    "ladder hero --spec": (
        ["ladder", "hero", "--fit", "{fit}", "--compute", "1e15", "--spec", "{bad}", "--out", "{out}"],
        None,
    ),
    "ladder hero --fit": (
        ["ladder", "hero", "--fit", "{bad}", "--compute", "1e15", "--spec", "{spec}", "--out", "{out}"],
        None,
    ),
    "predict": (["predict", "{bad}", "--compute", "1e15"], None),
    "prereg create --fit": (["prereg", "create", "--fit", "{bad}", "--hero", "{hero}", "--out", "{out}"], None),
    "prereg create --hero": (["prereg", "create", "--fit", "{fit}", "--hero", "{bad}", "--out", "{out}"], None),
    "prereg verify": (["prereg", "verify", "{bad}"], None),
    "prereg check": (["prereg", "check", "{bad}", "--run", "{ladder}/runs/d32_k10"], None),
    "plot prediction": (["plot", "prediction", "{bad}", "--out", "{out}"], None),
    "plot allocation": (["plot", "allocation", "{bad}", "--out", "{out}"], None),
    "plot coordcheck": (["plot", "coordcheck", "{bad}", "--out", "{out}"], None),
    "plot frontier --prereg": (["plot", "frontier", "{results}", "--prereg", "{bad}", "--out", "{out}"], None),
    "study": (["study", "{bad}", "--out", "{out}"], None),
}


@pytest.mark.parametrize("payload", [BINARY, TEXT_GARBAGE], ids=["binary", "broken-syntax"])
@pytest.mark.parametrize("name", sorted(GARBAGE_READERS))
def test_garbage_yaml_or_json_names_the_file(name, payload, work, capsys):
    template, _ = GARBAGE_READERS[name]
    bad = work["tmp"] / "in" / "bad.yaml"
    bad.write_bytes(payload)
    out = work["tmp"] / "thing.png" if name.startswith("plot") else work["tmp"] / "out" / "thing"
    before = _tree(work["tmp"])
    code, err = _run(_fill(template, {**work, "bad": bad, "out": out}), capsys)
    _assert_refused(code, err, bad)
    assert _tree(work["tmp"]) == before


# ------------------------------------------------- --out not writable, a directory, or empty (rows 6-7)


def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create files in (root ignores mode bits: use sysfs)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        return locked
    try:
        probe = Path("/sys") / f"delphi-probe-{os.getpid()}"
        probe.write_text("")
    except OSError:
        return Path("/sys")
    probe.unlink()
    pytest.skip("no unwritable directory available to root here")


# command -> (argv with {out}, whether --out is a directory)
OUT_COMMANDS = {
    "fit isoflop": (["fit", "isoflop", "{results}", "--out", "{out}"], False),
    "fit backtest": (["fit", "backtest", "{results}", "--out", "{out}"], False),
    "train": (["train", "{train}", "--out", "{out}"], True),
    "data prepare": (["data", "prepare", "--source", "{train}", "--out", "{out}"], True),
    "ladder plan": (["ladder", "plan", "{spec}", "--out", "{out}"], True),
    "ladder collect": (["ladder", "collect", "{ladder}", "--out", "{out}"], False),
    "ladder hero": (
        ["ladder", "hero", "--fit", "{fit}", "--compute", "1e15", "--spec", "{spec}", "--out", "{out}"],
        False,
    ),
    "prereg create": (["prereg", "create", "--fit", "{fit}", "--hero", "{hero}", "--out", "{out}"], False),
    "prereg curves": (["prereg", "curves", "{ladder}", "--out", "{out}"], False),
    "plot isoflop": (["plot", "isoflop", "{results}", "--out", "{out}"], False),
    "plot residuals": (["plot", "residuals", "{results}", "--fit", "{fit}", "--out", "{out}"], False),
    "study": (["study", "--out", "{out}"], True),
    "mup coord-check": (["mup", "coord-check", "--out", "{out}"], True),
    "mup lr-sweep": (["mup", "lr-sweep", "--out", "{out}"], True),
}


@pytest.mark.parametrize("name", sorted(OUT_COMMANDS))
def test_out_in_an_unwritable_directory_is_refused_before_any_work(name, work, capsys):
    locked = _unwritable_dir(work["tmp"])
    template, is_dir = OUT_COMMANDS[name]
    out = locked / ("newdir" if is_dir else "out.png" if name.startswith("plot") else "out.json")
    before = _tree(work["tmp"])
    code, err = _run(_fill(template, {**work, "out": out}), capsys)
    _assert_refused(code, err, "--out", locked)
    assert not out.exists() and _tree(work["tmp"]) == before


@pytest.mark.parametrize("name", sorted(n for n, (_, is_dir) in OUT_COMMANDS.items() if not is_dir))
def test_out_that_is_a_directory_where_a_file_is_expected(name, work, capsys):
    out = work["tmp"] / "a_directory"
    out.mkdir()
    before = _tree(work["tmp"])
    code, err = _run(_fill(OUT_COMMANDS[name][0], {**work, "out": out}), capsys)
    _assert_refused(code, err, "--out", out)
    assert _tree(work["tmp"]) == before


@pytest.mark.parametrize("name", sorted(n for n, (_, is_dir) in OUT_COMMANDS.items() if is_dir))
def test_out_dir_that_is_a_file(name, work, capsys):
    out = work["tmp"] / "a_file"
    out.write_text("not a directory\n")
    before = _tree(work["tmp"])
    code, err = _run(_fill(OUT_COMMANDS[name][0], {**work, "out": out}), capsys)
    _assert_refused(code, err, "--out", out)
    assert _tree(work["tmp"]) == before and out.read_text() == "not a directory\n"


@pytest.mark.parametrize("name", sorted(OUT_COMMANDS))
def test_out_under_a_regular_file_is_refused(name, work, capsys):
    out = work["results"] / ("sub" if OUT_COMMANDS[name][1] else "x.json")  # parent is a file: ENOTDIR
    before = _tree(work["tmp"])
    code, err = _run(_fill(OUT_COMMANDS[name][0], {**work, "out": out}), capsys)
    _assert_refused(code, err, "--out", work["results"])
    assert _tree(work["tmp"]) == before


@pytest.mark.parametrize("name", sorted(OUT_COMMANDS))
def test_empty_out_is_refused(name, work, capsys, monkeypatch):
    monkeypatch.chdir(work["tmp"])  # an empty path means "." to some parsers: keep it inside the test dir
    before = _tree(work["tmp"])
    code, err = _run(_fill(OUT_COMMANDS[name][0], {**work, "out": ""}), capsys)
    _assert_refused(code, err, "--out")
    assert _tree(work["tmp"]) == before


# --------------------------------------------------------------- numbers that are not positive (row 12)

NUMBER_FLAGS = {
    "predict --compute": ["predict", "{fit}", "--compute", "{v}"],
    "predict --params": ["predict", "{fit}", "--params", "{v}", "--tokens", "1e9"],
    "ladder hero --compute": [
        "ladder",
        "hero",
        "--fit",
        "{fit}",
        "--compute",
        "{v}",
        "--spec",
        "{spec}",
        "--out",
        "{tmp}/h.yaml",
    ],
    "fit backtest --cut": ["fit", "backtest", "{results}", "--cut", "{v}"],
    "prereg create --tolerance": [
        "prereg",
        "create",
        "--fit",
        "{fit}",
        "--hero",
        "{hero}",
        "--out",
        "{tmp}/p.yaml",
        "--tolerance",
        "{v}",
    ],
    "ladder run --workers": ["ladder", "run", "{ladder}", "--workers", "{v}"],
}


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "abc"])
@pytest.mark.parametrize("name", sorted(NUMBER_FLAGS))
def test_a_non_positive_or_non_finite_number_is_refused(name, value, work, capsys):
    if name.endswith("--workers") and value in ("nan", "inf", "-inf"):
        value = "1.5"  # an integer flag: a fraction is its non-integer case
    argv = _fill(NUMBER_FLAGS[name], {**work, "v": value})
    if value == "-inf":  # argparse reads a bare "-inf" as an option; a user writes --flag=-inf
        at = argv.index(value)
        argv[at - 1 : at + 1] = [f"{argv[at - 1]}={value}"]
    before = _tree(work["tmp"])
    with np.errstate(all="raise"):  # no numpy warning may leak: it would raise here
        code, err = _run(argv, capsys)
    flag = name.split()[-1]
    _assert_refused(code, err, flag, repr(value))
    assert "Warning" not in err and _tree(work["tmp"]) == before


# ----------------------------------------------------- prereg verify / check against the wrong run (rows 3-4)


def _hero_run(run_dir: Path, cfg) -> None:
    """The hero's run dir as the trainer leaves it when it completed."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(ps.train_config_to_dict(cfg), sort_keys=False))
    steps, tokens, loss = ps.true_curve(cfg, np.random.default_rng(5))
    rows = ps.metrics_rows(cfg, steps, tokens, loss)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "status.json").write_text(
        json.dumps({"status": "completed", "reason": "", "step": int(steps[-1]), "updated": ""})
    )
    (run_dir / "summary.json").write_text(
        json.dumps({"status": "completed", "val_loss": float(loss[-1]), "val_bpb": 1.0})
    )


@pytest.mark.parametrize("damage", ["deleted", "emptied", "no-timestamps"])
def test_verify_cannot_establish_the_start_of_a_run_whose_metrics_are_gone(damage, world, tmp_path, capsys):
    run = tmp_path / "hero"
    _hero_run(run, world["hero_cfg"])
    metrics = run / "metrics.jsonl"
    if damage == "deleted":
        metrics.unlink()
    elif damage == "emptied":
        metrics.write_text("")
    else:
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text(
            "".join(json.dumps({k: v for k, v in r.items() if k not in ("time", "wall_s")}) + "\n" for r in rows)
        )
    before = _tree(tmp_path)
    code, err = _run(["prereg", "verify", world["prereg"], "--run", run], capsys)
    assert code == 1, err
    assert "created before the run's first step" not in err
    assert "cannot establish when the run started" in err and "metrics.jsonl" in err and "status.json" in err
    assert _tree(tmp_path) == before


def test_verify_of_a_run_not_started_yet_is_fine(world, tmp_path, capsys):
    run = tmp_path / "hero"
    run.mkdir()
    code, err = _run(["prereg", "verify", world["prereg"], "--run", run], capsys)
    assert code == 0 and "created before the run's first step" in err


@pytest.mark.parametrize("command", ["check", "verify"])
@pytest.mark.parametrize("which", ["a ladder rung", "the hero with another seed"])
def test_a_run_that_is_not_the_preregistered_hero_is_refused(command, which, world, tmp_path, capsys):
    import dataclasses

    prereg = tmp_path / "regs" / world["prereg"].name
    prereg.parent.mkdir()
    shutil.copy(world["prereg"], prereg)
    if which == "a ladder rung":
        run = world["ladder"] / "runs" / "d32_k10"
    else:
        run = tmp_path / "hero_seed1"
        _hero_run(run, dataclasses.replace(world["hero_cfg"], seed=world["hero_cfg"].seed + 1))
    before = _tree(tmp_path)
    code, err = _run(["prereg", command, prereg, "--run", run], capsys)
    _assert_refused(code, err, str(run), "not the preregistered hero")
    assert _tree(tmp_path) == before  # no outcome file


def test_check_accepts_the_hero_on_another_mesh(world, tmp_path, capsys):
    """`mesh` does not change the maths: the same hero trained on another mesh is the hero."""
    prereg = tmp_path / "regs" / world["prereg"].name
    prereg.parent.mkdir()
    shutil.copy(world["prereg"], prereg)
    run = tmp_path / "hero"
    _hero_run(run, world["hero_cfg"])
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["mesh"] = {"data": 2, "expert": 4}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, err = _run(["prereg", "check", prereg, "--run", run], capsys)
    assert code in (0, 1) and "not the preregistered hero" not in err, err


@pytest.mark.parametrize("payload", [BINARY, b'{"n_train": 5'], ids=["binary", "broken-syntax"])
@pytest.mark.parametrize("command", ["train", "ladder run"])
def test_garbage_token_store_meta_names_the_file(command, payload, tmp_path, capsys):
    """The config is fine; the token store it names has a garbage meta.json (read before any work;
    `ladder plan` reads no store, `ladder run` reads it before any rung trains)."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "meta.json").write_bytes(payload)
    for split in ("train.bin", "val.bin"):
        (store / split).write_bytes(bytes(range(256)) * 8)
    if command == "train":
        config = yaml.safe_load((DEFAULTS / "tiny.yaml").read_text())
        config.setdefault("data", {})["store"] = str(store)
    else:
        config = yaml.safe_load((DEFAULTS / "ladder_default.yaml").read_text())
        config["run"]["store"] = str(store)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    if command == "train":
        args = ["train", tmp_path / "config.yaml", "--out", tmp_path / "out"]
    else:
        assert _run(["ladder", "plan", tmp_path / "config.yaml", "--out", tmp_path / "out"], capsys)[0] == 0
        args = ["ladder", "run", tmp_path / "out"]
    before = _tree(tmp_path)
    code, err = _run(args, capsys)
    _assert_refused(code, err, store / "meta.json")
    assert _tree(tmp_path) == before
