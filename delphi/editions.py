"""The paper's editions: where they are, which study each renders, and their unpacked copies.

PAPER_ROOT/editions/vN holds each edition's data in compact form (`delphi.compact`), PAPER_ROOT/next/vN/STAGE
the stages of the edition being built. `edition_tree` keeps one unpacked copy per content hash in a
cache, `resolve_data` reads a directory inside an edition through that copy, and `check_provenance`
and `hero_runs` find what a sealed preregistration recorded among the editions. Nothing here reads a
preregistration's seal: `delphi prereg verify` does that.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from delphi.compact import CURVES_FILE, FILES_FILE, is_run_dir, unpack
from delphi.errors import DelphiError
from delphi.hashes import sha256_file
from delphi.io import read_yaml

CACHE_ENV = "DELPHI_EDITIONS_CACHE"  # where unpacked editions are kept (default: the system temp dir)


def content_key(edition: Path) -> str:
    """A short hash of every file of a compact edition: its unpacked copy's name in the cache."""
    digest = hashlib.sha256()
    for path in sorted(p for p in edition.rglob("*") if p.is_file()):
        digest.update(path.relative_to(edition).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _preregistrations_above(path: Path) -> Path | None:
    for parent in path.resolve().parents:
        if (parent / "preregistrations").is_dir():
            return parent / "preregistrations"
    return None


def edition_tree(edition: str | Path) -> Path:
    """An unpacked copy of a compact edition, made once per content (cached under $DELPHI_EDITIONS_CACHE
    or the temp dir). Beside it, `preregistrations` links to the repository's own, so that a study's
    sealed file is found above its data as in the repository."""
    edition = Path(edition)
    root = Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "delphi-editions")
    prereg = _preregistrations_above(edition)
    # The link beside the tree names one checkout's preregistrations: two clones (a CI clone, a
    # worktree) with the same edition must not share a copy that points into the other.
    checkout = hashlib.sha256(str(prereg).encode()).hexdigest()[:8]
    home = root / f"{edition.resolve().name}-{content_key(edition)}-{checkout}"
    tree = home / edition.resolve().name
    if tree.is_dir():
        return tree
    home.mkdir(parents=True, exist_ok=True)
    if prereg is not None and not (home / "preregistrations").exists():  # before the tree appears: a reader finds both
        try:
            (home / "preregistrations").symlink_to(prereg)
        except FileExistsError:
            pass
    staging = Path(tempfile.mkdtemp(dir=home, prefix=".unpack-"))
    unpack(edition, staging)
    try:
        staging.rename(tree)
    except OSError:  # another process unpacked the same content first
        shutil.rmtree(staging, ignore_errors=True)
    return tree


def edition_root(path: str | Path) -> Path | None:
    """The compact edition that `path` (a directory inside it, e.g. EDITION/study) belongs to, if any."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if (candidate / CURVES_FILE).is_file() and (candidate / FILES_FILE).is_file():
            return candidate
    return None


def resolve_data(path: str | Path) -> Path:
    """A directory as the code reads it: inside a compact edition, the same place in its unpacked
    copy; anywhere else, itself."""
    path = Path(path)
    edition = edition_root(path)
    if edition is None or is_run_dir(path) or (path / "ladder" / "runs").is_dir():
        return path
    return edition_tree(edition) / path.resolve().relative_to(edition.resolve())


def check_provenance(prereg_doc: dict, tree: Path) -> dict:
    """The sha256s a sealed preregistration recorded (fit, hero config, ladder manifest, results
    table, probe summaries), each against the file of that name in an (unpacked) edition: the
    compact copy is the one sealed if every recorded hash is found."""
    provenance = prereg_doc.get("provenance") or {}
    recorded = {k: v for k, v in provenance.items() if k.endswith("_sha256") and isinstance(v, str)}
    recorded |= {
        f"probe_summaries_sha256.{name}": v for name, v in (provenance.get("probe_summaries_sha256") or {}).items()
    }
    by_hash: dict[str, list[str]] = {}
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and p.suffix in (".csv", ".json", ".yaml")):
        by_hash.setdefault(sha256_file(path), []).append(path.relative_to(tree).as_posix())
    found = {key: by_hash.get(digest, []) for key, digest in recorded.items()}
    return {
        "checked": len(found),
        "missing": sorted(k for k, v in found.items() if not v),
        "found": {k: v[:3] for k, v in found.items() if v},
    }


EDITIONS_DIR = "editions"  # PAPER_ROOT/editions/vN: the committed editions
NEXT_DIR = "next"  # PAPER_ROOT/next: the edition being built, stage by stage


def editions(paper_root: str | Path = "paper") -> list[Path]:
    """Every edition directory, oldest first (v1, v2, ..., v10)."""
    root = Path(paper_root) / EDITIONS_DIR
    found = [p for p in root.glob("v*") if p.is_dir() and p.name[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[1:]))


def edition_trees(paper_root: str | Path = "paper") -> dict[str, Path]:
    """An unpacked copy of every edition (by name: v1, ...) and of every stage of the edition being
    built (PAPER_ROOT/next/vN/STAGE, each a compact pack that holds the runs of its seals until it
    becomes an edition), by name."""
    trees = {e.name: edition_tree(e) for e in editions(paper_root)}
    trees |= {
        f"{NEXT_DIR}/{pack.parent.parent.name}/{pack.parent.name}": edition_tree(pack.parent)
        for pack in sorted((Path(paper_root) / NEXT_DIR).glob(f"v*/*/{FILES_FILE}"))
    }
    return trees


STUDY_DIRS = ("data", "study")  # where an edition keeps the study its text is rendered from (v1: data)


def current_edition(paper_root: str | Path = "paper") -> Path | None:
    """The newest edition: its data are the current paper's (PAPER_ROOT/paper.md), its text is not in it."""
    found = editions(paper_root)
    return found[-1] if found else None


def edition_data(edition: Path) -> Path:
    """The study an edition's text is rendered from (EDITION/data or EDITION/study)."""
    for name in STUDY_DIRS:
        if (edition / name / "study.json").is_file():
            return edition / name
    raise DelphiError(f"{edition}: no study data (no data/study.json or study/study.json)")


def edition_data_or_none(edition: Path) -> Path | None:
    """`edition_data`, or None where the edition holds no study."""
    try:
        return edition_data(edition)
    except DelphiError:
        return None


def built_editions(paper_root: str | Path = "paper") -> dict[str, tuple[Path, Path]]:
    """The editions `paper build` renders, by name: (paper dir, data dir). An earlier edition is
    rendered when it has a template.md; the current one renders into PAPER_ROOT. Editions written by
    hand (v2, v4: a README) are kept as text only."""
    paper_root = Path(paper_root)
    out = {e.name: (e, edition_data(e)) for e in editions(paper_root) if (e / "template.md").is_file()}
    if (current := current_edition(paper_root)) is not None and (paper_root / "template.md").is_file():
        out[current.name] = (paper_root, edition_data(current))
    return out


def seed_runs_of(doc: dict, run: Path) -> list[Path]:
    """The runs a seal's outcome is the mean of: `run` (the sealed config's own seed) and, for a
    multi-seed seal (`target.seeds`), its siblings RUN_s<seed> (the names a study gives them)."""
    target = doc.get("target")
    seeds = [int(s) for s in target["seeds"]] if isinstance(target, dict) and target.get("seeds") else None
    if not seeds:
        return [run]
    own = read_yaml(run / "config.yaml").get("seed") if (run / "config.yaml").is_file() else None
    return [run] + [run.with_name(f"{run.name}_s{seed}") for seed in seeds if seed != own]


def hero_runs(doc: dict, trees: dict[str, Path]) -> tuple[str, Path, list[Path]] | None:
    """Where the editions hold a sealed preregistration's hero: (the edition's name, its run dir, the
    runs its outcome is the mean of), from the first edition whose data hold every sha256 the seal
    recorded and a finished run of the sealed hero config; None when none does."""
    hero_sha = (doc.get("provenance") or {}).get("hero_config_sha256")
    for name, tree in trees.items():
        held = check_provenance(doc, tree)
        if not held["checked"] or held["missing"]:
            continue
        runs = [
            c.parent
            for c in sorted(tree.rglob("config.yaml"))
            if (c.parent / "summary.json").is_file() and sha256_file(c) == hero_sha
        ]
        if runs:
            return name, runs[0], seed_runs_of(doc, runs[0])
    return None
