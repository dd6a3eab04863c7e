"""`delphi study`: the whole loop from one study file, resumably.

    prepare -> plan -> ladder -> collect -> fit -> backtest -> hero -> gates
            -> dress_rehearsal (its own gate) -> prereg -> train_hero (checked live) -> check -> figures -> report

The fit stage fits the primary law under each parameter-count convention
(non-embedding, active, FLOPs per token / 6), reports the compute-optimal
exponent under each, and keeps the convention its held-out-budget backtest
favours; every law allocates compute under the ladder family's exact FLOPs per
token. The gates stage says PASS/FAIL for every gate before anything larger than
the ladder trains and stops the study (exit 1) when one fails, unless the study
says `force: true`; then the dress rehearsal predicts and trains one run at ~3x
the top budget, and its error is one more gate before the hero.

Each stage writes `stages/<name>.json` when it completes; re-running the study
skips completed stages, and the two training stages resume their runs (the
ladder runner skips finished rungs, the trainer continues from its last
checkpoint). The preregistration stage always completes before the hero's
first step, so the sealed prediction provably precedes the outcome.

The package, one module per concept: `spec` (the study file), `state` (a study directory and what
stages read back from it), `stages` (the stages in order and `run_study`), `report` (figures and
report.md), `snapshot` (compact copies), `commands` (`delphi study`). Every name is re-exported here.
"""

from __future__ import annotations

from delphi.study.spec import (  # noqa: F401
    DEFAULT_REHEARSAL_MULTIPLE,
    DEFAULT_STUDY,
    GatesSpec,
    HeroSpec,
    load_study,
    own_probe_name,
    PREDICTION_GATES,
    probe_names,
    STUDY_SEED_STRIDE,
    StudySpec,
    TRAJECTORY_SOURCES,
)
from delphi.study.state import (  # noqa: F401
    _fmt,
    _ladder_spec,
    _lr_calibration,
    _pin_study,
    _primary_backtest,
    _rehearsal,
    _say,
    chosen_convention,
    hero_compute,
    load_table,
    probe_runs,
    seed_offset,
    Study,
    STUDY_FILE,
)
from delphi.study.snapshot import (  # noqa: F401
    compact_files,
    COMPACT_SKIP_DIRS,
    export_study,
)
from delphi.study.stages import (  # noqa: F401
    _default_rationale,
    _finished,
    _fit_one,
    _hero_preflight,
    _sized_run,
    BACKTEST_BOOTSTRAP_MAX,
    check_store_unchanged,
    compare_conventions,
    optimal_exponent,
    pin_lr_calibration,
    pin_probes,
    read_store_acceptances,
    run_study,
    stage_backtest,
    stage_check,
    stage_collect,
    stage_dress_rehearsal,
    stage_fit,
    stage_gates,
    stage_hero,
    stage_ladder,
    STAGE_NAMES,
    stage_plan,
    stage_prepare,
    stage_prereg,
    stage_probes,
    stage_train_hero,
    STAGES,
)
from delphi.study.report import (  # noqa: F401
    _conventions_section,
    _gates_section,
    _hero_point,
    _markdown_table,
    _probes_section,
    _rehearsal_section,
    _residual_prediction,
    health_table,
    render_report,
    stage_figures,
    stage_report,
)

__all__ = [
    'DEFAULT_STUDY',
    'DEFAULT_REHEARSAL_MULTIPLE',
    'STUDY_SEED_STRIDE',
    'TRAJECTORY_SOURCES',
    'PREDICTION_GATES',
    'HeroSpec',
    'GatesSpec',
    'StudySpec',
    'load_study',
    'Study',
    '_say',
    '_pin_study',
    'STUDY_FILE',
    'COMPACT_SKIP_DIRS',
    'compact_files',
    'export_study',
    'stage_prepare',
    'stage_plan',
    '_hero_preflight',
    'stage_ladder',
    'check_store_unchanged',
    'read_store_acceptances',
    'stage_collect',
    '_ladder_spec',
    'seed_offset',
    'chosen_convention',
    'load_table',
    '_fit_one',
    'optimal_exponent',
    'compare_conventions',
    'stage_fit',
    'BACKTEST_BOOTSTRAP_MAX',
    'stage_backtest',
    'hero_compute',
    '_sized_run',
    'stage_hero',
    'stage_dress_rehearsal',
    '_rehearsal',
    '_primary_backtest',
    'stage_gates',
    'pin_lr_calibration',
    'pin_probes',
    'own_probe_name',
    'probe_names',
    'probe_runs',
    'stage_probes',
    '_lr_calibration',
    'stage_prereg',
    '_default_rationale',
    'stage_train_hero',
    '_finished',
    'stage_check',
    '_hero_point',
    '_residual_prediction',
    'stage_figures',
    'stage_report',
    'STAGES',
    'STAGE_NAMES',
    'run_study',
    '_fmt',
    'render_report',
    '_gates_section',
    '_rehearsal_section',
    '_probes_section',
    '_conventions_section',
    'health_table',
    '_markdown_table',
]
