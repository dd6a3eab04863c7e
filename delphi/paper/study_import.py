"""A finished study's compact data, written in the editions' form (`delphi.compact`): imported into
a paper's data, or snapshotted to commit a completed stage."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from delphi.compact import pack
from delphi.errors import DelphiError
from delphi.study.snapshot import compact_files, export_study


def import_study(study_dir: Path, data_dir: Path) -> list[str]:
    """Write a finished study's compact data (no checkpoints, no logs, no figures) into `data_dir`
    in the editions' form (`delphi.compact`: curves.csv.gz, files.csv.gz, small plain files)."""
    if not (study_dir / "stages" / "report.json").is_file():
        raise DelphiError(f"--from-study: {study_dir} is not a finished study (no stages/report.json)")

    copied = []
    with tempfile.TemporaryDirectory() as tmp:
        for rel in compact_files(study_dir):
            if rel.parts[0] == "figures" or rel.name == "report.md":
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(study_dir / rel, Path(tmp) / rel)
            copied.append(str(rel))
        prereg = Path(json.loads((study_dir / "stages" / "prereg.json").read_text())["result"]["prereg"])
        if prereg.parent != study_dir:  # sealed outside the study dir (the project's own study)
            shutil.copy2(prereg, Path(tmp) / "preregistration.yaml")
            copied.append(f"preregistration.yaml (from {prereg})")
        pack(tmp, data_dir)
    return copied


def snapshot(study_dir: str | Path, dest: str | Path, *, resumable: bool = False) -> dict:
    """Write a study's compact data (`delphi.study.compact_files`) into `dest` in the editions' form:
    plain small files, curves.csv.gz and files.csv.gz, no directory per run. `delphi paper unpack`
    gives the study directory back (to continue it elsewhere: unpack, then rerun the same study)."""
    with tempfile.TemporaryDirectory() as tmp:
        copied = export_study(study_dir, Path(tmp) / "study", resumable=resumable)
        packed = pack(Path(tmp) / "study", dest)
    runs = sorted({p.split("/")[2] for p in copied if p.startswith("ladder/runs/")})
    return {"files": len(copied), "ladder_runs": runs, "to": str(dest), "compact": packed}
