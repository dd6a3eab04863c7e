"""What a file was when git first recorded it: the anchor of a seal and of an outcome.

A seal's sha256 shows that its file agrees with itself, but anyone can edit the file and compute
the sha256 again. What an ordinary user cannot change unnoticed is the repository's history: the
commit that first added the file holds its content as it was then. `first_commit(path)` finds that
commit (`git log --diff-filter=A`, the oldest) and says whether the file still has that content.

What it does not protect against: anyone who rewrites the history itself (a rebase, a force-push,
a new repository). A seal's sha256 published elsewhere, or a signed tag on the commit that added
it, anchors it beyond that (docs/cli.md, "What a seal protects").

States (`FirstCommit.state`):
    same           committed, and the file has its first commit's content
    changed        committed, and the file differs from its first commit's content
    not committed  inside a git checkout, never committed (a seal just made): only its own seal
    no checkout    not inside a git checkout (an export, a copy), or git is not installed
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SAME, CHANGED, NOT_COMMITTED, NO_CHECKOUT = "same", "changed", "not committed", "no checkout"
GIT_TIMEOUT_S = 60  # one git call; a history of thousands of commits answers in well under a second


@dataclass(frozen=True)
class FirstCommit:
    """Where `path` stands against the commit that first added it."""

    path: str
    state: str
    commit: str | None = None
    time: str | None = None  # the commit's time, ISO 8601
    epoch: float | None = None  # the same, in seconds since the epoch
    shallow: bool = False  # the checkout's history is cut: the oldest commit found may not be the first

    @property
    def anchored(self) -> bool:
        return self.state == SAME

    def problem(self, what: str) -> str | None:
        """A line saying why `what` (e.g. "the seal") cannot be trusted, or None."""
        if self.state != CHANGED:
            return None
        return (
            f"{what} {self.path} differs from its content in the commit that first added it ({self.commit[:12]}, "
            f"{self.time}): what was first committed is what counts; a changed file is a new one (give it a new name)"
        )

    def note(self, what: str) -> str | None:
        """A line saying what is not anchored (not a failure), or None."""
        if self.state == NOT_COMMITTED:
            return (
                f"{what} {self.path} is not committed: nothing outside the file anchors it (its own sha256 anyone "
                "can recompute); commit it to anchor it"
            )
        if self.state == NO_CHECKOUT:
            return (
                f"{what} {self.path} is outside a git checkout: nothing outside the file anchors it (its own sha256 "
                "anyone can recompute)"
            )
        if self.shallow and self.state == SAME:
            return (
                f"{what} {self.path}: this checkout's history is shallow, so {self.commit[:12]} is the oldest commit "
                "found, not necessarily the first (fetch the whole history to anchor it)"
            )
        return None

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "state": self.state,
            "commit": self.commit,
            "time": self.time,
            "epoch": self.epoch,
            "shallow": self.shallow,
        }


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def first_commit(path: str | Path) -> FirstCommit:
    """Whether `path` has the content of the commit that first added it (module docstring)."""
    path = Path(path)
    resolved = path.resolve()
    shown = str(path)
    top = _git(["rev-parse", "--show-toplevel"], resolved.parent)
    if top is None or top.returncode != 0:
        return FirstCommit(shown, NO_CHECKOUT)
    root = Path(top.stdout.decode().strip()).resolve()
    rel = resolved.relative_to(root).as_posix()
    log = _git(["log", "--diff-filter=A", "--format=%H %ct %cI", "--", rel], root)
    lines = log.stdout.decode().strip().splitlines() if log is not None and log.returncode == 0 else []
    if not lines:
        return FirstCommit(shown, NOT_COMMITTED)
    commit, epoch, iso = lines[-1].split()
    shallow = _git(["rev-parse", "--is-shallow-repository"], root)
    is_shallow = shallow is not None and shallow.stdout.decode().strip() == "true"
    then = _git(["rev-parse", f"{commit}:{rel}"], root)
    now = _git(["hash-object", "--", rel], root) if resolved.is_file() else None
    same = (
        then is not None
        and now is not None
        and then.returncode == 0
        and now.returncode == 0
        and then.stdout.strip() == now.stdout.strip()
    )
    return FirstCommit(shown, SAME if same else CHANGED, commit, iso, float(epoch), is_shallow)
