"""docs/labs.md runs as written: every ```bash block of the tutorial, in order, in one shell, from a
directory that sees the clone's docs/ and tests/ and has an empty DELPHI_CACHE. Then its promises
are checked on the files it wrote: a plan with no store, an export, a seal made without --force, a
verdict reached by --watch on another trainer's log, the figures and the report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "labs.md"


def tutorial_script(text: str) -> str:
    """The tutorial's ```bash blocks, in order, as one script."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 5, "docs/labs.md lost a step"
    return "\n".join(blocks)


def test_the_labs_tutorial_runs_as_written(tmp_path):
    script = tutorial_script(TUTORIAL.read_text())
    assert "--force" not in script
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("docs", "tests"):
        (work / name).symlink_to(ROOT / name)
    cache = tmp_path / "cache"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "DELPHI_CACHE": str(cache),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "WANDB_MODE": "disabled",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lab = work / "lab"

    # 1. planned and exported without a token store
    assert not cache.exists() or not any(cache.rglob("*.bin")), "planning prepared a token store"
    recipe = pd.read_csv(lab / "recipe.csv")
    assert len(recipe) == 15
    assert set(recipe["budget_flops"]) == {1e17, 1e18, 1e19}

    # 3. sealed without --force, from N and D, with the gates an external table cannot hold marked N/A
    sealed = yaml.safe_load((lab / "hero.prereg.yaml").read_text())
    gates = json.loads((lab / "hero.prereg.gates.json").read_text())
    assert not gates.get("forced")
    assert {g["name"] for g in gates["gates"] if g.get("applicable") is False} >= {"rung_health", "hero_depth"}
    assert sealed["hero"]["params"] == 1.04e10 and sealed["hero"]["tokens"] == 1.6e11

    # 4. the watch reached the final verdict on the stand-in trainer's log (its own key names)
    outcome = json.loads((lab / "hero.prereg.outcome.json").read_text())
    assert outcome["verdict"] == "passed"
    assert abs(outcome["actual_final_loss"] - 1.99) < 1e-9
    assert "passed" in done.stderr

    # 5. figures and the report
    for figure in ("isoflop.png", "prediction.png", "report/report.md"):
        assert (lab / figure).is_file(), figure
    report = (lab / "report" / "report.md").read_text()
    assert "| passed |" in report
