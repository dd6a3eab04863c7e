"""`delphi study`: the whole loop from one study file, resumably.

    prepare -> plan -> ladder -> collect -> fit -> backtest -> hero -> gates
            -> dress_rehearsal (its own gate) -> seals -> probes -> prereg -> train_hero (checked live)
            -> check -> figures -> report

The fit stage fits the primary law under each parameter-count convention
(non-embedding, active, FLOPs per token / 6), reports the compute-optimal
exponent under each, and keeps the convention its held-out-budget backtest
favours; every law allocates compute under the ladder family's exact FLOPs per
token. The gates stage says PASS/FAIL for every gate before anything larger than
the ladder trains and stops the study (exit 1) when one fails, unless the study
says `force: true`; then the dress rehearsal predicts and trains one run at ~3x
the top budget, and its error is one more gate before the hero. Under the law alone
(`hero.probe_correction: false`) the seals stage then seals every prediction beyond the ladder
(the study's own probes and the hero) before any of them trains; `--stop-after seals` stops there
so the seals can be committed first.

Each stage writes `stages/<name>.json` when it completes; re-running the study
skips completed stages, and the two training stages resume their runs (the
ladder runner skips finished rungs, the trainer continues from its last
checkpoint). The preregistration stage always completes before the hero's
first step, so the sealed prediction provably precedes the outcome.

The package, one module per concept: `spec` (the study file), `state` (a study directory and what
stages read back from it), `stages` (the stages in order and `run_study`), `report` (figures and
report.md), `snapshot` (compact copies), `commands` (`delphi study`). Every name is importable from here,
lazily: `delphi.study.commands` (and so `delphi --help`) does not import pandas through this file.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each name of the former delphi/study.py lives now.
_MODULE_OF: dict[str, str] = {
    "DEFAULT_REHEARSAL_MULTIPLE": "spec",
    "DEFAULT_STUDY": "spec",
    "GatesSpec": "spec",
    "HeroSpec": "spec",
    "load_study": "spec",
    "own_probe_name": "spec",
    "PREDICTION_GATES": "spec",
    "probe_names": "spec",
    "STUDY_SEED_STRIDE": "spec",
    "StudySpec": "spec",
    "TRAJECTORY_SOURCES": "spec",
    "_fmt": "state",
    "_ladder_spec": "state",
    "_lr_calibration": "state",
    "_pin_study": "state",
    "_primary_backtest": "state",
    "_rehearsal": "state",
    "_say": "state",
    "chosen_convention": "state",
    "hero_compute": "state",
    "load_table": "state",
    "probe_runs": "state",
    "seed_offset": "state",
    "Study": "state",
    "STUDY_FILE": "state",
    "compact_files": "snapshot",
    "COMPACT_SKIP_DIRS": "snapshot",
    "export_study": "snapshot",
    "_default_rationale": "stages",
    "_finished": "stages",
    "_fit_one": "stages",
    "_hero_preflight": "stages",
    "_sized_run": "stages",
    "BACKTEST_BOOTSTRAP_MAX": "stages",
    "check_store_unchanged": "stages",
    "compare_conventions": "stages",
    "optimal_exponent": "stages",
    "pin_lr_calibration": "stages",
    "pin_probes": "stages",
    "read_store_acceptances": "stages",
    "run_study": "stages",
    "stage_backtest": "stages",
    "stage_check": "stages",
    "stage_collect": "stages",
    "stage_dress_rehearsal": "stages",
    "stage_fit": "stages",
    "stage_gates": "stages",
    "stage_hero": "stages",
    "stage_ladder": "stages",
    "STAGE_NAMES": "stages",
    "stage_plan": "stages",
    "stage_prepare": "stages",
    "stage_prereg": "stages",
    "stage_probes": "stages",
    "stage_seals": "stages",
    "seal_hero": "stages",
    "seal_probe": "stages",
    "stage_train_hero": "stages",
    "STAGES": "stages",
    "_conventions_section": "report",
    "_gates_section": "report",
    "_hero_point": "report",
    "_markdown_table": "report",
    "_probes_section": "report",
    "_rehearsal_section": "report",
    "_residual_prediction": "report",
    "health_table": "report",
    "render_report": "report",
    "stage_figures": "report",
    "stage_report": "report",
}

__all__ = list(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
