"""`delphi paper verify`: every sealed preregistration against the editions' compact data."""

from __future__ import annotations

from pathlib import Path

from delphi.editions import EDITIONS_DIR, NEXT_DIR, check_provenance, edition_trees, hero_runs
from delphi.errors import CheckFailed, DelphiError
from delphi.prereg.check import read_outcome
from delphi.prereg.verify import verify
from delphi.prereg_format import read


def verify_editions(paper_root: str | Path = "paper", preregistrations: str | Path = "preregistrations") -> list[dict]:
    """Each sealed preregistration against the editions: its seal (`prereg verify`: as first
    committed), the editions whose compact data hold every file it hashed (fit, hero config,
    manifest, results table, probe summaries), and `prereg verify --run` on its hero as unpacked
    from the first such edition. A preregistration that cannot be verified (a run whose records
    disagree) is a problem of its row, not the end of the command."""
    if not Path(paper_root).is_dir():
        raise DelphiError(f"--paper-root {paper_root}: not a directory; nothing to verify against")
    if not Path(preregistrations).is_dir():
        raise DelphiError(f"--preregistrations {preregistrations}: not a directory; nothing to verify")
    files = sorted(Path(preregistrations).glob("*.yaml"))
    if not files:
        raise DelphiError(
            f"--preregistrations {preregistrations}: holds no preregistration (*.yaml); nothing to verify"
        )
    trees = edition_trees(paper_root)
    out = []
    for path in files:
        doc = read(path)
        plain = _verified(path, verify)
        holding = {name: check_provenance(doc, tree) for name, tree in trees.items()}
        complete = [name for name, c in holding.items() if c["checked"] and not c["missing"]]
        # A seal whose run has not finished (no outcome yet) waits for its edition; it is not a failure.
        row = {
            "file": str(path),
            "seal_ok": plain["seal_ok"],
            "hashes": next(iter(holding.values()))["checked"] if holding else 0,
            "editions_holding_all": complete,
            "run": None,
            "run_ok": None,
            "pending": read_outcome(path) is None,
            "problems": plain["problems"],
            "warnings": plain.get("warnings", []),
            "first_commit": plain.get("first_commit"),
        }
        found = hero_runs(doc, {name: trees[name] for name in complete})
        if found is not None:
            name, run, runs = found
            checked = _verified(path, verify, runs)
            where = name if name.startswith(f"{NEXT_DIR}/") else f"{EDITIONS_DIR}/{name}"
            row["run"] = f"{where}/{run.relative_to(trees[name]).as_posix()}"
            row["run_ok"] = checked["ok"] and checked.get("created_before_start") is True
            row["problems"] = checked["problems"]
            row["warnings"] = checked.get("warnings", [])
        out.append(row)
    return out


def _verified(path: Path, verify, runs: list[Path] | None = None) -> dict:
    """`prereg verify` of one file (with its runs); a check it cannot make (CheckFailed: a run whose
    summary disagrees with its metrics log) is the row's problem."""
    try:
        return verify(path, run_dirs=runs)
    except CheckFailed as e:
        return {"seal_ok": None, "ok": False, "problems": [str(e)], "created_before_start": None}
