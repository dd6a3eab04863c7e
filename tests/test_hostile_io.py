"""Inputs are never outputs, special files are refused, and pipes, disks and names fail in one line
(issue 41, classes 3 and 6).

Every case: the documented exit code, one `delphi: error:` line on stderr and no traceback, and
the user's files byte-identical afterwards (`_snapshot` lists the whole test directory without
following links: kinds, bytes, link targets). Commands run in-process through `delphi.cli.main`,
except the closed pipe, which needs a real stdout. Nothing here writes to /dev/null or any other
device: the device case checks the policy on the path alone.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from delphi.cli import EXIT_PIPE_CLOSED, main
from delphi.errors import DelphiError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "delphi" / "defaults" / "ladder_default.yaml"
TINY = ROOT / "delphi" / "defaults" / "tiny.yaml"
LONG_NAME = "a" * 300


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> dict[str, Path]:
    """A small public isoFLOP table T.csv (one sweep, ~130 rows; fits in about a second) and a
    valid FLOPs family, written by `ladder family`, to put beside it."""
    root = tmp_path_factory.mktemp("table")
    full = pd.read_csv(ROOT / "tests" / "data" / "isoflops.csv")
    full[full["experiment"] == "llama_3__exp_loss"].to_csv(root / "T.csv", index=False)
    assert main(["ladder", "family", str(SPEC), "--out", str(root / "family.json")]) == 0
    return {"T": root / "T.csv", "family": root / "family.json"}


@pytest.fixture
def work(table, tmp_path) -> Path:
    """tmp_path with T.csv and its family sidecar T.csv.family.json (what `ladder collect` writes)."""
    (tmp_path / "T.csv").write_bytes(table["T"].read_bytes())
    (tmp_path / "T.csv.family.json").write_bytes(table["family"].read_bytes())
    assert main(["fit", "isoflop", str(tmp_path / "T.csv")]) == 0  # the family is read and fits
    return tmp_path


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, links not followed: a regular file's bytes, a link's target,
    the kind of anything else."""
    out = {}
    for p in sorted(root.rglob("*")):
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            out[str(p.relative_to(root))] = ("link", os.readlink(p))
        elif stat.S_ISREG(mode):
            out[str(p.relative_to(root))] = ("file", p.read_bytes())
        else:
            out[str(p.relative_to(root))] = (stat.S_IFMT(mode),)
    return out


@contextmanager
def _deadline(seconds: int = 60):
    """Turn a hang (opening a FIFO nobody writes to) into a failure instead of a stuck suite."""

    def hung(*_):
        raise TimeoutError(f"the command did not return within {seconds} s (blocked on a FIFO?)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run(argv: list, capsys) -> tuple[int, str]:
    with _deadline():
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, capsys.readouterr().err


def _refused(code: int, err: str, *names: object, exit_code: int = 2) -> str:
    """`exit_code`, exactly one line on stderr, `delphi: error: ...`, no traceback, naming each of `names`."""
    assert code == exit_code, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("delphi: error: "), err
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


# ---------------------------------------------------------------- class 3: inputs are never outputs


@pytest.mark.parametrize("sidecar", [".family.json", ".delphi.json"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing", "absent"])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_out_onto_a_file_read_beside_an_input_is_refused(sidecar, exists, force, work, capsys):
    """`fit isoflop T.csv --out T.csv.family.json --force` replaced the FLOPs family it had just
    read, and every later fit of T failed. Absent, it would appear and be read by the next fit."""
    target = work / f"T.csv{sidecar}"
    if not exists:
        target.unlink(missing_ok=True)
    elif not target.exists():
        target.write_text('{"mine": true}\n')
    before = _snapshot(work)
    code, err = _run(["fit", "isoflop", work / "T.csv", "--out", target, *(["--force"] if force else [])], capsys)
    line = _refused(code, err, "--out", target, "T.csv", "input")
    assert "--force or not" in line
    assert _snapshot(work) == before
    assert main(["fit", "isoflop", str(work / "T.csv")]) == 0  # later fits of T still work


def test_out_onto_an_explicit_family_is_refused(work, capsys):
    family = work / "T.csv.family.json"
    before = _snapshot(work)
    code, err = _run(["fit", "isoflop", work / "T.csv", "--family", family, "--out", family, "--force"], capsys)
    _refused(code, err, "--out", family, "input")
    assert _snapshot(work) == before


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_out_onto_a_fifo_is_refused_not_hung_or_replaced(force, work, capsys):
    fifo = work / "out.json"
    os.mkfifo(fifo)
    before = _snapshot(work)
    code, err = _run(["fit", "isoflop", work / "T.csv", "--out", fifo, *(["--force"] if force else [])], capsys)
    _refused(code, err, "--out", fifo, "FIFO", "not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _snapshot(work) == before


def test_a_device_is_never_an_output_force_or_not(tmp_path):
    """As root, `--out /dev/null --force` replaced /dev/null with a regular file. Checked on the path
    alone: the policy and the atomic write both refuse before anything is written."""
    from delphi.path_policy import check_output_file, check_replaceable, refuse_non_regular

    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    for force in (False, True):
        with pytest.raises(DelphiError, match=r"--out /dev/null: exists and is a character device, not a regular file"):
            check_output_file("/dev/null", command="ladder family", force=force)
        with pytest.raises(DelphiError, match="character device"):
            check_replaceable("/dev/null", "ladder family", force=force)
    with pytest.raises(DelphiError, match="character device"):
        refuse_non_regular("/dev/null", flag=None)  # the first thing atomic_write_bytes does
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_symlinked_out_is_refused_and_stays_a_link(force, work, capsys):
    target = work / "mine.json"
    target.write_text('{"mine": true}\n')
    link = work / "link.json"
    os.symlink(target.name, link)
    before = _snapshot(work)
    code, err = _run(["ladder", "family", SPEC, "--out", link, *(["--force"] if force else [])], capsys)
    _refused(code, err, "--out", link, "symbolic link")
    assert _snapshot(work) == before and link.is_symlink()


@pytest.mark.parametrize("command", ["fit", "ladder family"])
def test_out_with_a_trailing_slash_never_becomes_a_file(command, work, capsys):
    """`--out newdir/` (no such directory) wrote a file named `newdir`."""
    newdir = str(work / "newdir") + os.sep
    argv = (
        ["fit", "isoflop", work / "T.csv", "--out", newdir]
        if command == "fit"
        else ["ladder", "family", SPEC, "--out", newdir]
    )
    before = _snapshot(work)
    code, err = _run(argv, capsys)
    _refused(code, err, "--out", newdir, "does not exist")
    assert _snapshot(work) == before and not (work / "newdir").exists()


def test_the_atomic_write_itself_refuses_special_files_and_directory_names(tmp_path):
    """Writers that reach `atomic_write_*` without a policy check (a study's stages, files inside an
    output directory) get the same refusals, at the write."""
    from delphi.io import atomic_write_json, atomic_write_text

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    os.symlink("f.json", tmp_path / "l.json")
    before = _snapshot(tmp_path)
    with _deadline():
        for path in (fifo, tmp_path / "l.json"):
            with pytest.raises(DelphiError, match="not a regular file"):
                atomic_write_json(path, {"x": 1})
        with pytest.raises(DelphiError, match="names a directory"):
            atomic_write_text(str(tmp_path / "newdir") + os.sep, "x")
    assert _snapshot(tmp_path) == before


def test_an_outputs_sidecar_follows_the_same_rules(tmp_path):
    """A CSV says who wrote it in FILE.delphi.json: that sidecar may not be a FIFO, a link or an input either."""
    from delphi.path_policy import check_output_file

    out = tmp_path / "results.csv"
    os.mkfifo(tmp_path / "results.csv.delphi.json")
    with _deadline(), pytest.raises(DelphiError, match=r"--out .*results\.csv.*FIFO"):
        check_output_file(out, command="ladder collect", force=True)
    os.unlink(tmp_path / "results.csv.delphi.json")
    inp = tmp_path / "results.csv.delphi.json"
    inp.write_text("{}\n")
    with pytest.raises(DelphiError, match="sidecar results.csv.delphi.json.*input"):
        check_output_file(out, inputs=(inp,), command="ladder collect", force=True)
    check_output_file(out, command="ladder collect", force=True)  # a plain name: fine
    assert not out.exists()


# -------------------------------------------------------------- class 6: pipes, disks and names


def test_a_closed_stdout_exits_141_quietly(tmp_path):
    """`delphi flops CONFIG --json | true`: the reader is gone before the JSON is written. Was a
    BrokenPipeError traceback and exit 1; now exit 141 (128 + SIGPIPE, as `yes | head`) and
    stderr exactly what the command prints with a reader."""
    argv = [sys.executable, "-m", "delphi.cli", "flops", str(TINY), "--json"]
    with_reader = subprocess.run(argv, capture_output=True, timeout=120, cwd=tmp_path)
    assert with_reader.returncode == 0 and with_reader.stdout.startswith(b"{")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader exits before delphi writes a byte
    proc = subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, timeout=120, cwd=tmp_path)
    os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == EXIT_PIPE_CLOSED == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert err == with_reader.stderr.decode()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "new"])
def test_a_full_disk_is_one_line_and_keeps_the_old_file(existing, tmp_path, capsys, monkeypatch):
    out = tmp_path / "family.json"
    argv = ["ladder", "family", SPEC, "--out", out]
    if existing:
        assert main([str(a) for a in argv]) == 0  # the command's own file: replaced without --force
        capsys.readouterr()
    before = _snapshot(tmp_path)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # the write fails after the data went to the temporary file
    code, err = _run(argv, capsys)
    monkeypatch.undo()
    line = _refused(code, err, out, "No space left on device")
    assert ("keeps its previous content" if existing else "nothing was written") in line
    assert _snapshot(tmp_path) == before  # the old file, and no temporary file left beside it


def test_write_failed_is_still_the_oserror_it_was(tmp_path):
    from delphi.io import WriteFailed

    failed = WriteFailed.of(tmp_path / "x.json", OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    assert isinstance(failed, DelphiError) and isinstance(failed, OSError) and failed.errno == errno.EDQUOT
    assert str(failed).startswith(f"{tmp_path / 'x.json'}: cannot write (")


@pytest.mark.parametrize("where", ["out", "input table", "input config"])
def test_a_300_character_name_is_one_line(where, work, capsys):
    long = work / f"{LONG_NAME}.json"
    argv = {
        "out": ["fit", "isoflop", work / "T.csv", "--out", long],
        "input table": ["fit", "isoflop", work / f"{LONG_NAME}.csv"],
        "input config": ["flops", work / f"{LONG_NAME}.yaml"],
    }[where]
    before = _snapshot(work)
    code, err = _run(argv, capsys)
    line = _refused(code, err, *(["--out", "shorter name"] if where == "out" else ["too long"]))
    assert len(line) < 600
    assert _snapshot(work) == before


def test_a_name_too_long_for_its_sidecar_is_refused_before_the_work(tmp_path):
    """250 bytes fit a name, but not with `.delphi.json` after it: refused before, not half written after."""
    from delphi.path_policy import check_output_file

    with pytest.raises(DelphiError, match=r"with its \.delphi\.json sidecar.*shorter name"):
        check_output_file(tmp_path / ("b" * 240 + ".csv"), command="ladder collect")
    check_output_file(tmp_path / ("b" * 240 + ".json"), command="ladder family")  # in-band marker: fine


def _pipe_path() -> tuple[str, int, int]:
    """What `<(cat T.csv)` hands a command: /dev/fd/N, a pipe."""
    r, w = os.pipe()
    return f"/dev/fd/{r}", r, w


@pytest.mark.parametrize("what", ["stdin", "dev-null", "fifo", "process-substitution"])
@pytest.mark.parametrize("command", ["fit", "flops"])
def test_a_special_input_says_what_it_is(what, command, work, capsys):
    """`delphi fit isoflop -` / `/dev/null` / a FIFO / `<(...)` said "file not found"."""
    fds: tuple[int, ...] = ()
    if what == "stdin":
        path, expected = "-", "standard input is not read"
    elif what == "dev-null":
        path, expected = "/dev/null", "not a regular file but a character device"
    elif what == "fifo":
        path, expected = str(work / "table.fifo"), "not a regular file but a FIFO"
        os.mkfifo(path)
    else:
        path, *fds = _pipe_path()
        expected = "not a regular file but a FIFO"
    before = _snapshot(work)
    try:
        code, err = _run(["fit", "isoflop", path] if command == "fit" else ["flops", path], capsys)
    finally:
        for fd in fds:
            os.close(fd)
    line = _refused(code, err, path, expected)
    assert "not found" not in line
    assert _snapshot(work) == before


def test_an_oserror_from_the_system_is_one_line_naming_the_file(monkeypatch, capsys):
    """The CLI's net for what the checks did not foresee: EACCES, EROFS, ENOSPC... deep inside a
    command are one line naming the file (exit 2), not a traceback; anything else stays a bug."""
    import delphi.train.commands as tc

    def denied(*_, **__):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/somewhere/config.yaml")

    monkeypatch.setattr(tc, "load_model_config", denied)
    code, err = _run(["flops", TINY], capsys)
    _refused(code, err, "/somewhere/config.yaml", "Permission denied")
