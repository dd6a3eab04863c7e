"""A seal means what was first committed (issue 53, causes 2, 3, 4, 6 and 18's `paper verify`).

`prereg verify`, `prereg index` and `paper verify` compare a seal and its outcome with their content
at the commit that first added them; an outcome is written once; verify checks an outcome against
the seal it scored and against its own seeds. Each test builds a real git repository in a temporary
directory (or a copy of the project's committed preregistrations and an edition outside git)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import prereg_synthetic as ps
import pytest
import yaml
from test_prereg_seeds import PREDICTED, seal, seed_run

from delphi import prereg_format as fmt
from delphi.cli import main
from delphi.prereg.check import check
from delphi.prereg.verify import verify

REPO = Path(__file__).resolve().parents[1]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "PATH": "/usr/bin:/bin:/usr/local/bin",
}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=GIT_ENV)


def commit(root: Path, *paths: Path, message: str = "seal") -> None:
    git(root, "add", *(str(p.relative_to(root)) for p in paths))
    git(root, "commit", "-q", "-m", message)


@pytest.fixture
def hero():
    return ps.train_config(32, 200, 8, "hero")


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    return tmp_path


def _failed_two_seed_outcome(root: Path, hero) -> tuple[Path, list[Path]]:
    """A committed two-seed seal whose runs missed it by 3% (failed), with its committed outcome."""
    prereg = seal(root / "two.yaml", hero, [0, 1])
    runs = [seed_run(root / "runs", hero, 0, PREDICTED * 1.03), seed_run(root / "runs", hero, 1, PREDICTED * 1.03)]
    assert main(["prereg", "check", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]) == 1
    commit(root, prereg, fmt.outcome_path(prereg))
    return prereg, runs


def test_a_seal_resealed_after_its_first_commit_is_refused_by_verify_index_and_paper_verify(repo, hero, capsys):
    """Cause 3: a committed seal edited (a wider tolerance) and sealed again verified as passed."""
    prereg, runs = _failed_two_seed_outcome(repo, hero)
    assert verify(prereg)["ok"] is True
    doc = fmt.read(prereg)
    doc["decision"]["tolerance_rel"] = 0.05
    prereg.write_text(fmt.dump(fmt.seal(doc)))  # a seal that agrees with itself
    outcome = fmt.outcome_path(prereg)
    record = json.loads(outcome.read_text())
    outcome.write_text(json.dumps(record | {"verdict": "passed"}))
    assert fmt.seal_status(fmt.read(prereg))["ok"]
    result = verify(prereg)
    assert not result["ok"]
    assert any(
        "differs from its content in the commit that first added it" in p and "the seal" in p
        for p in result["problems"]
    )
    assert result["first_commit"]["state"] == "changed"
    assert any(p.startswith("the outcome") for p in result["problems"])
    capsys.readouterr()
    assert main(["prereg", "verify", str(prereg)]) == 1
    assert "THE FILE HAS CHANGED SINCE" in capsys.readouterr().err
    # Committing the edit does not make it the seal: the first commit is.
    commit(repo, prereg, outcome, message="edit")
    assert not verify(prereg)["ok"]
    assert main(["prereg", "index", str(repo), "--paper-root", str(repo / "nopaper")]) == 0
    assert "invalid: the seal changed after its first commit" in (repo / "README.md").read_text()
    (repo / "paper").mkdir()
    assert main(["paper", "verify", "--paper-root", str(repo / "paper"), "--preregistrations", str(repo)]) == 1


def test_an_outcome_edited_after_its_first_commit_is_refused_even_when_consistent(repo, hero):
    """Cause 3: an outcome edited to agree with itself (and its runs' records gone) reads as passed."""
    prereg, runs = _failed_two_seed_outcome(repo, hero)
    outcome = fmt.outcome_path(prereg)
    record = json.loads(outcome.read_text())
    outcome.write_text(
        json.dumps(
            record
            | {
                "verdict": "passed",
                "rel_error": 0.0,
                "actual_final_loss": PREDICTED,
                "covered_50": True,
                "covered_90": True,
                "seeds": [],
                "runs": [],
            }
        )
    )
    for run in runs:
        shutil.rmtree(run)
    result = verify(prereg)
    assert not result["ok"]
    assert any(p.startswith("the outcome") and "first added it" in p for p in result["problems"])
    assert main(["prereg", "index", str(repo), "--paper-root", str(repo / "nopaper")]) == 0
    assert "invalid: the outcome changed after its first commit" in (repo / "README.md").read_text()


def test_a_seal_outside_git_or_not_committed_verifies_but_says_it_is_not_anchored(tmp_path, repo, hero, capsys):
    """Outside a git checkout, or before its commit, the seal is only self-consistent: verify says so."""
    elsewhere = tmp_path / "export"
    elsewhere.mkdir()
    outside = seal(Path(elsewhere) / "one.yaml", hero, None)
    result = verify(outside)
    assert result["ok"] is True and result["first_commit"]["state"] in ("no checkout", "not committed")
    uncommitted = seal(repo / "new.yaml", hero, None)
    result = verify(uncommitted)
    assert result["ok"] is True and result["first_commit"]["state"] == "not committed"
    assert any("is not committed" in w for w in result["warnings"])
    capsys.readouterr()
    assert main(["prereg", "verify", str(uncommitted)]) == 0
    assert "NOT ANCHORED (not committed)" in capsys.readouterr().err


def test_a_final_outcome_is_never_replaced_and_a_disagreeing_recheck_names_both(tmp_path, hero, capsys):
    """Cause 2: after the runs' metrics logs and summaries were edited, a failed outcome became passed."""
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    runs = [seed_run(tmp_path, hero, 0, PREDICTED * 1.03), seed_run(tmp_path, hero, 1, PREDICTED * 1.03)]
    args = ["prereg", "check", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]
    assert main(args) == 1
    outcome = fmt.outcome_path(prereg)
    first = outcome.read_bytes()
    assert main(args) == 1  # the same runs again: the outcome stands, unchanged (not even its time)
    assert outcome.read_bytes() == first
    for run in runs:  # both runs' records edited to pass
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps(summary | {"val_loss": PREDICTED}))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows[-1]["val_loss"] = PREDICTED
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(args + ["--json"]) == 1
    captured = capsys.readouterr()
    assert outcome.read_bytes() == first
    assert "failed" in captured.err and "passed" in captured.err and "recorded" in captured.err
    assert json.loads(captured.out)["outcome_conflict"]


def test_verify_refuses_an_outcome_of_another_seal_and_a_mean_that_is_not_its_seeds(tmp_path, hero):
    """Cause 4: `prereg index` flagged an outcome that scored another seal, `verify` said ok; an
    outcome whose mean contradicts its own per-seed losses verified too."""
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED * 1.002)]
    check(prereg, run_dirs=runs)
    outcome = fmt.outcome_path(prereg)
    record = json.loads(outcome.read_text())
    for run in runs:
        shutil.rmtree(run)  # nothing to recompute from: only the outcome's own word
    assert verify(prereg)["ok"] is True
    outcome.write_text(json.dumps(record | {"seal": "0" * 64}))
    assert any("another seal" in p for p in verify(prereg)["problems"])
    seeds = [s | {"actual_final_loss": PREDICTED * 1.2} for s in record["seeds"]]
    outcome.write_text(json.dumps(record | {"seeds": seeds}))
    assert any("mean of its seeds" in p for p in verify(prereg)["problems"])


def test_index_recomputes_an_outcome_from_the_runs_the_editions_hold(tmp_path, capsys):
    """Cause 6: outside git, an edited outcome of the fifth edition's hero (consistent with itself,
    its runs' recorded dirs absent) was indexed as passed while `paper verify` refused it."""
    prereg_dir, paper = tmp_path / "preregistrations", tmp_path / "paper" / "editions"
    prereg_dir.mkdir()
    paper.mkdir(parents=True)
    for name in ("paper-v5-hero-30x.yaml", "paper-v5-hero-30x.outcome.json"):
        shutil.copy(REPO / "preregistrations" / name, prereg_dir / name)
    shutil.copytree(REPO / "paper" / "editions" / "v5", paper / "v5")
    outcome = prereg_dir / "paper-v5-hero-30x.outcome.json"
    record = json.loads(outcome.read_text())
    predicted = yaml.safe_load((prereg_dir / "paper-v5-hero-30x.yaml").read_text())["prediction"]["final"]["loss"]
    assert record["verdict"] == "failed"
    outcome.write_text(
        json.dumps(
            record
            | {
                "verdict": "passed",
                "actual_final_loss": predicted * 1.001,
                "rel_error": 0.001,
                "covered_50": True,
                "covered_90": True,
            }
        )
    )
    assert (
        main(["paper", "verify", "--paper-root", str(tmp_path / "paper"), "--preregistrations", str(prereg_dir)]) == 1
    )
    assert main(["prereg", "index", str(prereg_dir), "--paper-root", str(tmp_path / "paper")]) == 0
    row = [line for line in (prereg_dir / "README.md").read_text().splitlines() if "paper-v5-hero-30x" in line][0]
    assert "invalid: the outcome disagrees with its records" in row and "| passed" not in row


def test_paper_verify_without_its_paper_root_is_exit_2(tmp_path, capsys):
    """Cause 18: `paper verify --paper-root MISSING` exited 0, having verified nothing against editions."""
    assert (
        main(
            [
                "paper",
                "verify",
                "--paper-root",
                str(tmp_path / "missing"),
                "--preregistrations",
                str(REPO / "preregistrations"),
            ]
        )
        == 2
    )
    assert "--paper-root" in capsys.readouterr().err


def test_paper_verify_prints_json_when_a_run_cannot_be_verified(tmp_path, capsys):
    """Cause 16: a hero whose summary disagrees with its metrics log made `paper verify --json` exit 1
    with nothing on stdout."""
    prereg_dir, paper = tmp_path / "preregistrations", tmp_path / "paper" / "editions"
    prereg_dir.mkdir()
    paper.mkdir(parents=True)
    shutil.copy(REPO / "preregistrations" / "paper-v5-hero-30x.yaml", prereg_dir)
    shutil.copy(REPO / "preregistrations" / "paper-v5-hero-30x.outcome.json", prereg_dir)
    shutil.copytree(REPO / "paper" / "editions" / "v5", paper / "v5")
    from delphi.compact import FILES_FILE, csv_text, gzip_bytes, read_csv_gz

    rows = read_csv_gz(paper / "v5" / FILES_FILE)
    for row in rows:
        if row["path"] == "study/hero/summary.json":
            row["content"] = json.dumps(json.loads(row["content"]) | {"val_loss": 0.5})
    (paper / "v5" / FILES_FILE).write_bytes(
        gzip_bytes(csv_text(["path", "encoding", "content"], [[r["path"], r["encoding"], r["content"]] for r in rows]))
    )
    capsys.readouterr()
    assert (
        main(
            [
                "paper",
                "verify",
                "--paper-root",
                str(tmp_path / "paper"),
                "--preregistrations",
                str(prereg_dir),
                "--json",
            ]
        )
        == 1
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and any("summary" in p for r in out["preregistrations"] for p in r["problems"])


def test_the_projects_own_seals_are_as_first_committed():
    """Every file in preregistrations/ verifies against its first commit in this checkout (where
    the checkout has a history: an export has none, and says so)."""
    for path in sorted((REPO / "preregistrations").glob("*.yaml")):
        result = verify(path)
        assert result["ok"], (path, result["problems"])
        assert result["first_commit"]["state"] in ("same", "not committed", "no checkout"), path
