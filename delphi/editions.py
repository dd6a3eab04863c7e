"""The paper's editions in compact form: a few tables instead of a directory per run.

A study leaves hundreds of run directories (config.yaml, status.json, summary.json, metrics.jsonl),
one per ladder rung, probe, rehearsal and hero. An edition of the paper commits them as

    EDITION/curves.csv.gz   every metrics.jsonl record of every run: run (its directory, relative to
                            EDITION), then the trainer's own keys (step, tokens, train_loss, val_loss,
                            lr, ...). A cell is the JSON value; an empty cell is a key the record lacks.
    EDITION/files.csv.gz    every other file of those directories, verbatim: path, encoding, content
                            (the stage markers, run configs and summaries, ladder manifests, symlinks).
    EDITION/**              plain files a reader or a seal needs: the text and figures, each study's
                            results.csv, study.json, gates.json, hero.yaml, fits/*.json, the notebook's
                            scripts, tables and logs.

`unpack` writes the original tree back (every file byte for byte, metrics.jsonl record for record),
`edition_tree` keeps one unpacked copy per content hash in a cache, and `check_provenance` hashes the
compact copy against what a sealed preregistration recorded. Nothing here reads a preregistration's
seal: `delphi prereg verify` does that.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from delphi.errors import DelphiError
from delphi.io import atomic_write_bytes

CURVES_FILE = "curves.csv.gz"
FILES_FILE = "files.csv.gz"
METRICS_FILE = "metrics.jsonl"  # delphi.train.rundir.METRICS_FILE; named here so that packing needs no trainer
RUN_MARKERS = ("config.yaml", "status.json", "summary.json", METRICS_FILE)  # a directory holding these is a run

# Small files kept as they are: what a reader opens, what a seal's sha256 covers (results.csv, fits,
# hero.yaml, probe summaries through files.csv.gz) and what the build reads most.
PLAIN_NAMES = frozenset(
    {
        "results.csv",
        "results.csv.family.json",
        "study.json",
        "gates.json",
        "hero.yaml",
        "rehearsal.yaml",
        "report.md",
        "lr_calibration.json",
        "preregistration.yaml",
        "store_accepted.json",
    }
)
PLAIN_SUFFIXES_TOP = frozenset({".md", ".py", ".csv", ".json", ".log"})  # an edition's own notebook, scripts and tables
FIGURE_SUFFIXES = frozenset({".png", ".svg"})
CACHE_ENV = "DELPHI_EDITIONS_CACHE"  # where unpacked editions are kept (default: the system temp dir)
CSV_FIELD_LIMIT = 2**31 - 1  # the csv module's default (128 KiB) is smaller than a stage marker or a train.log
GZIP_MTIME = 0  # a fixed header time: packing the same tree twice gives the same bytes


def _is_run_dir(path: Path) -> bool:
    return sum((path / name).exists() for name in RUN_MARKERS) >= 2


def _under_link(root: Path, rel: Path) -> bool:
    return any((root / parent).is_symlink() for parent in rel.parents if parent != Path("."))


def _plain(rel: Path, run_dirs: set[Path]) -> bool:
    """Whether a file of the source tree stays a plain file of the edition."""
    if any(parent in run_dirs for parent in rel.parents):
        return False
    if len(rel.parts) == 1:
        return rel.suffix in PLAIN_SUFFIXES_TOP or rel.name == "template.md"
    if rel.parts[0] == "figures" and len(rel.parts) == 2:
        return rel.suffix in FIGURE_SUFFIXES
    if "stages" in rel.parts or "configs" in rel.parts:
        return False
    return rel.name in PLAIN_NAMES or (rel.parent.name == "fits" and rel.suffix == ".json")


def _gzip_bytes(text: str) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=GZIP_MTIME, filename="") as gz:
        gz.write(text.encode())
    return buffer.getvalue()


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _read_csv_gz(path: Path) -> list[dict[str, str]]:
    csv.field_size_limit(CSV_FIELD_LIMIT)  # a file of files.csv.gz is one cell
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def curves_table(runs: dict[str, list[dict]]) -> str:
    """One row per metrics record, runs in the given order; columns in order of first appearance."""
    columns: list[str] = []
    seen: set[str] = set()
    for records in runs.values():
        for record in records:
            for key in record:
                if key not in seen:
                    seen.add(key)
                    columns.append(key)
    rows = [
        [run] + [json.dumps(r[k]) if k in r else "" for k in columns] for run, records in runs.items() for r in records
    ]
    return _csv_text(["run", *columns], rows)


def read_curves(path: Path) -> dict[str, list[dict]]:
    """The records of every run in a curves table, by run directory, in their logged order."""
    runs: dict[str, list[dict]] = {}
    for row in _read_csv_gz(path):
        run = row.pop("run")
        runs.setdefault(run, []).append({k: json.loads(v) for k, v in row.items() if v != ""})
    return runs


def pack(source: str | Path, dest: str | Path, *, skip: tuple[str, ...] = ()) -> dict:
    """Write the compact form of the tree `source` (an edition's directory, or a study's) into
    `dest`: plain files, curves.csv.gz and files.csv.gz. `skip`: relative paths left out whole (a
    stale copy). Refuses unless unpacking the result gives every file back."""
    source, dest = Path(source), Path(dest)
    skipped = {Path(s) for s in skip}
    paths = sorted(
        p
        for p in source.rglob("*")
        if (p.is_file() or p.is_symlink())
        and not any(s == p.relative_to(source) or s in p.relative_to(source).parents for s in skipped)
    )
    run_dirs = {p.parent.relative_to(source) for p in paths if not p.is_symlink() and _is_run_dir(p.parent)}
    # A symlinked directory (the fifth edition's hero30x -> study/hero) is one entry, not a second copy.
    paths = [p for p in paths if not _under_link(source, p.relative_to(source))]
    runs: dict[str, list[dict]] = {}
    files: list[list[str]] = []
    plain = 0
    for path in paths:
        rel = path.relative_to(source)
        if path.is_symlink():
            files.append([rel.as_posix(), "symlink", os.readlink(path)])
        elif path.name == METRICS_FILE and rel.parent in run_dirs:
            runs[rel.parent.as_posix()] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif _plain(rel, run_dirs):
            atomic_write_bytes(dest / rel, path.read_bytes())
            plain += 1
        else:
            data = path.read_bytes()
            try:
                files.append([rel.as_posix(), "utf-8", data.decode("utf-8")])
            except UnicodeDecodeError:
                files.append([rel.as_posix(), "base64", base64.b64encode(data).decode()])
    atomic_write_bytes(dest / CURVES_FILE, _gzip_bytes(curves_table(runs)))
    atomic_write_bytes(dest / FILES_FILE, _gzip_bytes(_csv_text(["path", "encoding", "content"], files)))
    with tempfile.TemporaryDirectory() as tmp:
        unpack(dest, Path(tmp) / "tree")
        differ = compare_trees(source, Path(tmp) / "tree", skip=skipped)
    if differ:
        raise DelphiError(f"{dest}: the compact copy does not give {source} back: {', '.join(differ[:5])}")
    return {
        "plain_files": plain,
        "runs": len(runs),
        "records": sum(len(r) for r in runs.values()),
        "archived_files": len(files),
    }


def unpack(edition: str | Path, dest: str | Path) -> Path:
    """Write an edition's original tree (plain files, archived files, every run's metrics.jsonl) into `dest`."""
    edition, dest = Path(edition), Path(dest)
    if not (edition / CURVES_FILE).is_file() or not (edition / FILES_FILE).is_file():
        raise DelphiError(f"{edition}: not a compact edition (no {CURVES_FILE} and {FILES_FILE})")
    for path in sorted(edition.rglob("*")):
        rel = path.relative_to(edition)
        if path.is_file() and rel.as_posix() not in (CURVES_FILE, FILES_FILE):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)
    links = []
    for row in _read_csv_gz(edition / FILES_FILE):
        target = dest / row["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if row["encoding"] == "symlink":
            links.append((target, row["content"]))
        else:
            target.write_bytes(
                base64.b64decode(row["content"]) if row["encoding"] == "base64" else row["content"].encode()
            )
    for run, records in read_curves(edition / CURVES_FILE).items():
        (dest / run).mkdir(parents=True, exist_ok=True)
        (dest / run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    for target, pointee in links:
        target.symlink_to(pointee)
    return dest


def compare_trees(original: Path, copy: Path, *, skip: set[Path] = frozenset()) -> list[str]:
    """Files of `original` that `copy` lacks or holds with other bytes (metrics.jsonl: other records)."""
    differ = []
    for path in sorted(original.rglob("*")):
        rel = path.relative_to(original)
        if any(s == rel or s in rel.parents for s in skip) or path.is_dir() and not path.is_symlink():
            continue
        other = copy / rel
        if path.is_symlink():
            if not other.is_symlink() or os.readlink(other) != os.readlink(path):
                differ.append(f"{rel} (link)")
        elif _under_link(original, rel):
            continue
        elif not other.is_file():
            differ.append(f"{rel} (missing)")
        elif path.name == METRICS_FILE:
            parse = lambda p: [json.loads(line) for line in p.read_text().splitlines() if line.strip()]  # noqa: E731
            if parse(path) != parse(other):
                differ.append(f"{rel} (records)")
        elif path.read_bytes() != other.read_bytes():
            differ.append(f"{rel} (bytes)")
    return differ


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
    if edition is None or _is_run_dir(path) or (path / "ladder" / "runs").is_dir():
        return path
    return edition_tree(edition) / path.resolve().relative_to(edition.resolve())


def check_provenance(prereg_doc: dict, tree: Path) -> dict:
    """The sha256s a sealed preregistration recorded (fit, hero config, ladder manifest, results
    table, probe summaries), each against the file of that name in an (unpacked) edition: the
    compact copy is the one sealed if every recorded hash is found."""
    from delphi.hashes import sha256_file

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


def seed_runs_of(doc: dict, run: Path) -> list[Path]:
    """The runs a seal's outcome is the mean of: `run` (the sealed config's own seed) and, for a
    multi-seed seal (`target.seeds`), its siblings RUN_s<seed> (the names a study gives them)."""
    from delphi.io import read_yaml

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
    from delphi.hashes import sha256_file

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
