"""Nothing a user has is lost, and outcomes mean what they say (issue 31, items 1, 2 and 5 and
the broken seal's exit code).

One test per class of the issue. Every command runs in-process through `delphi.cli.main`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import prereg_synthetic as ps
import pytest
import yaml
from test_cli_hostile import _hero_run, _run, _tree

from delphi.cli import main

DEFAULTS = Path(__file__).resolve().parents[1] / "delphi" / "defaults"
USER_TEXT = "my notes: the sources and rationale of this study\n"
PREDATES = "invalid: the run predates the preregistration"
HOUR_S = 3600.0


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A ladder of run dirs with its results table, a fit, a hero config and a sealed
    preregistration (the synthetic study of tests/prereg_synthetic.py)."""
    root = tmp_path_factory.mktemp("world")
    ladder = ps.write_ladder(root / "ladder")
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
    return {
        "root": root,
        "ladder": ladder,
        "results": ladder / "results.csv",
        "fit": fit,
        "hero": hero,
        "hero_cfg": hero_cfg,
        "prereg": prereg,
    }


def _refused(code: int, err: str, *names: object) -> None:
    assert code == 2, err
    line = [x for x in err.splitlines() if x.startswith("delphi: error:")]
    assert len(line) == 1 and "Traceback" not in err, err
    for name in names:
        assert str(name) in line[0], (name, line[0])


# ------------------------------------------------ class 1a: --out FILE replaces any existing file

# command -> (argv with {out}; the files it writes for --out {out})
FILE_WRITERS = {
    "fit vpnls": (["fit", "vpnls", "{results}", "--out", "{out}.json"], [".json"]),
    "ladder family": (["ladder", "family", str(DEFAULTS / "ladder_default.yaml"), "--out", "{out}.json"], [".json"]),
    "ladder hero": (
        [
            "ladder",
            "hero",
            "--fit",
            "{fit}",
            "--compute",
            "1e15",
            "--spec",
            str(DEFAULTS / "ladder_default.yaml"),
            "--out",
            "{out}.yaml",
        ],
        [".yaml"],
    ),
    "plot residuals": (["plot", "residuals", "{results}", "--fit", "{fit}", "--out", "{out}.png"], [".png", ".svg"]),
}


@pytest.mark.parametrize("name", sorted(FILE_WRITERS))
def test_out_replaces_only_what_that_command_wrote(name, world, tmp_path, capsys):
    template, suffixes = FILE_WRITERS[name]
    stem = tmp_path / "out"
    argv = [a.format(out=stem, **{k: v for k, v in world.items() if isinstance(v, Path)}) for a in template]
    for suffix in suffixes:  # a user's file under each name the command writes (plot: the .svg sibling too)
        user = stem.with_suffix(suffix)
        user.write_text(USER_TEXT)
        before = _tree(tmp_path)
        code, err = _run(argv, capsys)
        _refused(code, err, user, "--force")
        assert user.read_text() == USER_TEXT and _tree(tmp_path) == before
        user.unlink()
    code, err = _run(argv, capsys)  # a new file: written, and it says which command wrote it
    assert code == 0, err
    from delphi.written_by import written_by

    assert all(written_by(stem.with_suffix(s)) == name for s in suffixes)
    code, err = _run(argv, capsys)  # the command's own file: replaced
    assert code == 0, err
    other = stem.with_suffix(suffixes[-1])
    other.write_text(USER_TEXT)
    code, err = _run([*argv, "--force"], capsys)  # --force replaces the user's file
    assert code == 0, err
    assert other.read_text() != USER_TEXT


def test_ladder_collect_refuses_to_replace_a_users_table(world, tmp_path, capsys):
    out = tmp_path / "results.csv"
    out.write_text("a,b\n1,2\n")
    code, err = _run(["ladder", "collect", world["ladder"], "--out", out], capsys)
    _refused(code, err, out, "--force")
    assert out.read_text() == "a,b\n1,2\n"


# ------------------------------------- class 1b: a command never writes over one of its inputs


def test_ladder_plan_never_rewrites_its_spec_or_a_users_ladder_files(tmp_path, capsys):
    ladder = tmp_path / "ladder"
    ladder.mkdir()
    spec = ladder / "ladder.yaml"
    spec.write_text(
        "# sources and rationale, which a normalised copy would drop\n" + (DEFAULTS / "ladder_default.yaml").read_text()
    )
    text = spec.read_text()
    for extra in ([], ["--force"]):  # --force never makes an input writable
        code, err = _run(["ladder", "plan", spec, "--out", ladder, *extra], capsys)
        _refused(code, err, spec, "input")
        assert spec.read_text() == text and sorted(p.name for p in ladder.iterdir()) == ["ladder.yaml"]
    # a user's configs/*.yaml in a directory that is not a ladder delphi planned (no manifest.csv)
    (ladder / "configs").mkdir()
    (ladder / "configs" / "mine.yaml").write_text(USER_TEXT)
    spec.rename(tmp_path / "spec.yaml")
    code, err = _run(["ladder", "plan", tmp_path / "spec.yaml", "--out", ladder], capsys)
    _refused(code, err, ladder / "configs" / "mine.yaml", "--force")
    assert (ladder / "configs" / "mine.yaml").read_text() == USER_TEXT and not (ladder / "manifest.csv").exists()


# ------------------------------------------------------ class 1c: a token store of another source


def _corpus(root: Path, word: str) -> Path:
    root.mkdir()
    for i in range(6):
        (root / f"doc{i}.txt").write_text(f"{word} document {i}\n" * 50)
    return root


def test_data_prepare_replaces_a_store_only_of_the_same_source(tmp_path, capsys):
    a, b, store = _corpus(tmp_path / "a", "alpha"), _corpus(tmp_path / "b", "beta"), tmp_path / "store"
    assert _run(["data", "prepare", "--source", a, "--out", store], capsys)[0] == 0
    meta = (store / "meta.json").read_bytes()
    before = _tree(store)
    code, err = _run(["data", "prepare", "--source", b, "--out", store], capsys)
    _refused(code, err, store, str(a), "--force")
    assert _tree(store) == before and (store / "meta.json").read_bytes() == meta
    code, err = _run(["data", "prepare", "--source", f"{tmp_path}/./a", "--out", store], capsys)  # the same source
    assert code == 0, err
    code, err = _run(["data", "prepare", "--source", b, "--out", store, "--force"], capsys)
    assert code == 0 and json.loads((store / "meta.json").read_text())["source"] == str(b)


# ----------------------------------------------------------------- class 1d: the user's umask


def test_written_files_get_the_users_umask(world, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        code, err = _run(["fit", "vpnls", world["results"], "--out", tmp_path / "fit.json"], capsys)
        from delphi.io import atomic_write_text

        os.umask(0o027)
        atomic_write_text(tmp_path / "group.txt", "x")
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE((tmp_path / "fit.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "group.txt").stat().st_mode) == 0o640


# ------------------------------------------------ class 2a: a run that started before the seal


def _copy_prereg(world, tmp_path: Path) -> Path:
    prereg = tmp_path / "regs" / world["prereg"].name
    prereg.parent.mkdir()
    shutil.copy(world["prereg"], prereg)
    return prereg


def _predating_run(world, run: Path) -> Path:
    """The hero, finished, its first step logged an hour before the preregistration was created."""
    from delphi.prereg.create import parse_utc

    _hero_run(run, world["hero_cfg"])
    created = parse_utc(yaml.safe_load(world["prereg"].read_text())["created"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    shift = rows[0]["time"] - (created - HOUR_S)
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "time": r["time"] - shift}) + "\n" for r in rows))
    return run


def test_check_refuses_a_run_that_predates_the_preregistration(world, tmp_path, capsys):
    prereg = _copy_prereg(world, tmp_path)
    outcome = prereg.with_name(prereg.stem + ".outcome.json")
    outcome.write_text('{"note": "whatever is here stays"}\n')
    run = _predating_run(world, tmp_path / "hero")
    before = _tree(tmp_path)
    try:
        code = main(["prereg", "check", str(prereg), "--run", str(run), "--json"])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert json.loads(captured.out)["verdict"] == PREDATES and PREDATES in captured.err
    assert _tree(tmp_path) == before and outcome.read_text() == '{"note": "whatever is here stays"}\n'


# ------------------------------------------- class 2b: one outcome, bound to the run it scored


def test_checking_another_run_never_replaces_the_outcome(world, tmp_path, capsys):
    prereg = _copy_prereg(world, tmp_path)
    first, second = tmp_path / "hero", tmp_path / "hero_again"
    _hero_run(first, world["hero_cfg"])
    code, err = _run(["prereg", "check", prereg, "--run", first], capsys)
    assert code in (0, 1) and "invalid" not in err, err
    outcome = prereg.with_name(prereg.stem + ".outcome.json")
    recorded = outcome.read_bytes()
    assert json.loads(recorded)["run"] == str(first)
    _hero_run(second, world["hero_cfg"])
    code, err = _run(["prereg", "check", prereg, "--run", second], capsys)
    assert code in (0, 1) and "not recorded" in err, err
    assert outcome.read_bytes() == recorded
    code, err = _run(["prereg", "check", prereg, "--run", first], capsys)  # the same run again: still its outcome
    assert json.loads(outcome.read_text())["run"] == str(first)


# ----------------------------------------------------- class 2c: the index says what verify says


def test_index_shows_what_verify_would_say(world, tmp_path, capsys):
    """An outcome written before checks refused a predating run (as main's `prereg check` wrote
    it) is listed as invalid, not as passed; the committed kind of outcome keeps its verdict."""
    prereg = _copy_prereg(world, tmp_path)
    run = _predating_run(world, tmp_path / "hero")
    doc = yaml.safe_load(prereg.read_text())
    predicted = doc["prediction"]["final"]["loss"]  # consistent with the seal: only its run's start is wrong
    outcome = {
        "prereg": doc["id"],
        "seal": doc["seal"]["digest"],
        "run": str(run),
        "verdict": "passed",
        "actual_final_loss": predicted,
        "rel_error": 0.0,
        "covered_90": True,
        "points": [],
    }
    prereg.with_name(prereg.stem + ".outcome.json").write_text(json.dumps(outcome))
    code, err = _run(["prereg", "verify", prereg, "--run", run], capsys)
    assert code == 1 and "CREATED AFTER THE RUN STARTED" in err
    code, err = _run(["prereg", "index", prereg.parent], capsys)
    assert code == 0, err
    row = [
        line for line in (prereg.parent / "README.md").read_text().splitlines() if line.startswith(f"| [{doc['id']}]")
    ]
    assert len(row) == 1 and PREDATES in row[0] and "| passed" not in row[0]
    shutil.rmtree(run)  # the run is gone: the outcome stands as recorded
    assert _run(["prereg", "index", prereg.parent], capsys)[0] == 0
    assert "| passed" in (prereg.parent / "README.md").read_text()


def test_index_never_replaces_a_readme_it_did_not_write(world, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# My project\n")
    code, err = _run(["prereg", "index", tmp_path], capsys)
    _refused(code, err, tmp_path, "--force")
    assert readme.read_text() == "# My project\n"


# -------------------------------------------------------- class 5: predict says how far it goes


def test_predict_says_how_far_beyond_the_fitted_budgets(world, tmp_path, capsys):
    fit = tmp_path / "fit.json"
    assert _run(["fit", "vpnls", world["results"], "--out", fit], capsys)[0] == 0
    largest = json.loads(fit.read_text())["fitted_compute"][1]
    try:
        code = main(["predict", str(fit), "--compute", "1e60", str(largest * 2), "--json"])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    assert code == 0, captured.err
    far, near = json.loads(captured.out)["predictions"]
    assert far["extrapolation"]["factor_over_largest"] == pytest.approx(1e60 / largest)
    assert (
        near["extrapolation"]["factor_over_largest"] == pytest.approx(2.0) and near["extrapolation"]["warning"] is None
    )
    assert far["extrapolation"]["warning"] and "warning:" in captured.err and f"{1e60 / largest:.3g}x" in captured.err
    assert captured.err.count("warning:") == 1


# ------------------------------------------- messages: a broken seal is exit 1 from check and verify


def test_a_broken_seal_is_exit_1_from_check_and_verify(world, tmp_path, capsys):
    prereg = _copy_prereg(world, tmp_path)
    doc = yaml.safe_load(prereg.read_text())
    doc["decision"]["tolerance_rel"] = doc["decision"]["tolerance_rel"] * 10  # widened after sealing
    prereg.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = tmp_path / "hero"
    _hero_run(run, world["hero_cfg"])
    before = _tree(tmp_path)
    for command in ("verify", "check"):
        code, err = _run(["prereg", command, prereg, "--run", run], capsys)
        assert code == 1 and "Traceback" not in err, (command, err)
        assert "seal" in err.lower()
    assert _tree(tmp_path) == before  # no outcome
