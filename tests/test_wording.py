"""Messages that say what is wrong (issue 53, cause 18): a multi-seed `prereg verify` missing a seed
names the seeds, not the config; an infinite interval bound is not called empty. (The query a fit
suggests and `paper verify` without its paper root are in test_study_refusals.py and
test_seal_anchor.py.)"""

from __future__ import annotations

import prereg_synthetic as ps
from test_coverage_table import _summary, _world
from test_prereg_seeds import PREDICTED, seal, seed_run

from delphi.cli import main
from delphi.fits import coverage as cov


def test_a_multi_seed_verify_missing_a_seed_names_the_seeds_not_the_config(tmp_path, capsys):
    hero = ps.train_config(32, 200, 8, "hero")
    prereg = seal(tmp_path / "two.yaml", hero, [0, 1])
    runs = [seed_run(tmp_path, hero, 0, PREDICTED), seed_run(tmp_path, hero, 1, PREDICTED)]
    for run in runs:
        assert main(["prereg", "verify", str(prereg), "--run", str(run)]) == 2
        err = capsys.readouterr().err
        assert "seals the mean of seeds 0, 1: give one --run per seed (2), got 1 --run" in err
        assert "config.yaml differs" not in err
    assert main(["prereg", "verify", str(prereg), "--run", str(runs[0]), "--run", str(runs[1])]) == 0


def test_an_infinite_interval_bound_is_not_called_empty(tmp_path, capsys):
    root = _world(tmp_path)
    _summary(root / cov.SUMMARY, [["e1-s0", "1", "0", 1.0, 0.99, 1.01, 0.9, "inf", 1.0, "True", "passed"]])
    assert main(["fit", "coverage", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "'sealed_90_hi' is 'inf'; expected a finite number" in err and "empty" not in err
