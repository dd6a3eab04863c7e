"""The paper's editions in compact form (delphi.editions): lossless, and what the seals hashed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from delphi.cli import main as cli_main
from delphi.compact import CURVES_FILE, FILES_FILE, compare_trees, pack, read_curves, unpack
from delphi.editions import edition_tree
from delphi.errors import DelphiError

REPO = Path(__file__).resolve().parents[1]
EDITIONS = REPO / "paper" / "editions"
PAPER_FILES_MAX = 300  # issue 32: paper/ has 300 files or fewer


def _run(path: Path, records: list[dict], summary: dict) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("steps: 10\n")
    (path / "status.json").write_text(json.dumps({"status": "completed"}, indent=2))
    (path / "summary.json").write_text(json.dumps(summary, indent=2))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_pack_and_unpack_give_every_file_back(tmp_path):
    """Run dirs become rows of curves.csv.gz (ints stay ints, a missing key stays missing, a null
    stays null) and files.csv.gz; small files stay plain; a link stays a link."""
    source = tmp_path / "study"
    train = {"step": 5, "tokens": 640, "train_loss": 2.5, "lr": 0.001}
    evals = train | {"step": 10, "tokens": 1280, "val_loss": 1.9375, "val_bpb": None}
    _run(source / "ladder" / "runs" / "C1e9_d8", [train, evals], {"val_loss": 1.9375})
    _run(source / "hero", [train], {"val_loss": 2.5})
    (source / "stages").mkdir()
    (source / "stages" / "fit.json").write_text('{"result": {}}\n')
    (source / "results.csv").write_text("run_id,loss\nC1e9_d8,1.9375\n")
    (source / "fits").mkdir()
    (source / "fits" / "isoflop.json").write_text("{}\n")
    (source / "hero30x").symlink_to("hero")
    dest = tmp_path / "compact"
    counts = pack(source, dest)
    assert counts["runs"] == 2 and counts["records"] == 3
    plain = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert plain == [CURVES_FILE, FILES_FILE, "fits/isoflop.json", "results.csv"]
    curves = read_curves(dest / CURVES_FILE)
    assert curves["ladder/runs/C1e9_d8"] == [train, evals] and isinstance(curves["hero"][0]["step"], int)
    header = gzip.open(dest / CURVES_FILE, "rt").readline().strip().split(",")
    assert header[:4] == ["run", "step", "tokens", "train_loss"]
    back = unpack(dest, tmp_path / "back")
    assert compare_trees(source, back) == []
    assert (back / "hero" / "metrics.jsonl").read_bytes() == (source / "hero" / "metrics.jsonl").read_bytes()
    assert (back / "hero30x").is_symlink() and (back / "hero30x" / "summary.json").is_file()
    with pytest.raises(DelphiError, match="not a compact edition"):
        unpack(source, tmp_path / "nowhere")


def test_the_committed_editions_are_compact():
    """No directory per run under paper/, and paper/ within the issue's file budget."""
    files = [p for p in (REPO / "paper").rglob("*") if p.is_file()]
    assert len(files) <= PAPER_FILES_MAX
    assert not [p for p in files if p.name in ("metrics.jsonl", "status.json")]
    editions = [e for e in EDITIONS.iterdir() if e.is_dir()]
    assert sorted(e.name for e in editions) == [f"v{k}" for k in range(1, 9)]
    assert all((e / CURVES_FILE).is_file() and (e / FILES_FILE).is_file() for e in editions)


def test_prereg_verify_runs_on_a_hero_inside_a_compact_edition(capsys):
    """`prereg verify --run` takes a run inside a compact edition as before (its unpacked copy)."""
    code = cli_main(
        [
            "prereg",
            "verify",
            str(REPO / "preregistrations" / "paper-v3-hero-30x.yaml"),
            "--run",
            str(EDITIONS / "v3" / "study" / "hero"),
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["seal_ok"] and result["created_before_start"] is True


def test_paper_verify_finds_every_sealed_hash_in_the_editions(capsys):
    """Every preregistration's recorded sha256s (fit, hero config, manifest, results, probe summaries)
    are files of its edition's compact copy, and its hero verifies from there."""
    code = cli_main(
        [
            "paper",
            "verify",
            "--paper-root",
            str(REPO / "paper"),
            "--preregistrations",
            str(REPO / "preregistrations"),
            "--json",
        ]
    )
    rows = {Path(r["file"]).stem: r for r in json.loads(capsys.readouterr().out)["preregistrations"]}
    assert code == 0
    assert rows["paper-v7-hero-90x"]["editions_holding_all"] == ["v7"] and rows["paper-v7-hero-90x"]["hashes"] == 8
    assert rows["paper-hero"]["run"] == "editions/v1/data/hero"
    assert all(r["seal_ok"] and (r["run_ok"] or r["pending"]) for r in rows.values())
    # A seal whose runs have not finished waits for its edition (the eighth edition's, while they train).
    assert all(r["run_ok"] for r in rows.values() if not r["pending"])


def test_an_unpacked_edition_is_the_committed_tree():
    """The cache copy of an edition is what unpacking gives, and it holds the run dirs the study named."""
    tree = edition_tree(EDITIONS / "v4")
    assert (tree / "probe3x" / "metrics.jsonl").is_file() and len(
        list((tree / "study" / "ladder" / "runs").iterdir())
    ) == 67
    assert (tree.parent / "preregistrations").resolve() == (REPO / "preregistrations").resolve()
