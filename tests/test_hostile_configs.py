"""Configs and predictions say what they do (issue 41, class 5): a config, fit or environment
variable Delphi cannot use as written is exit 2 with one line naming it, before anything is
written; a prediction says what it predicted and where it lies against the fitted budgets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.yaml_strict import load_yaml_text as load_yaml_strict

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
QUERY = "experiment == 'epochai_chinchilla__massivetext__chinchilla' and not outlier"  # budgets 6e18 .. 1e21
TINY = REPO / "delphi" / "defaults" / "tiny.yaml"


def run(argv: list, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(err: str, *names: str) -> str:
    """One `delphi: error:` line (argparse prints its usage first) naming every `names`."""
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("delphi: error:")]
    assert len(lines) == 1, err
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- duplicate YAML keys


@pytest.mark.parametrize(
    "text, key, first, again",
    [
        ("steps: 10\nlog_every: 2\nsteps: 20\n", "steps", 1, 3),
        ("optim:\n  lr: 0.01\n  beta1: 0.9\n  lr: 0.1\n", "lr", 2, 4),
        ("runs:\n  - {seed: 1, seed: 2}\n", "seed", 2, 2),
    ],
)
def test_a_repeated_key_is_refused_with_both_lines(text, key, first, again):
    """Before: the last value won, without a word."""
    with pytest.raises(DelphiError) as e:
        load_yaml_strict(text, "cfg.yaml")
    message = str(e.value)
    assert message.startswith("cfg.yaml: ") and len(message.splitlines()) == 1
    assert f"duplicate key '{key}'" in message and f"line {again}" in message and f"first at line {first}" in message


def test_strict_yaml_keeps_merges_and_the_other_checks():
    merged = load_yaml_strict("base: &b {lr: 0.01, steps: 5}\nrun:\n  <<: *b\n  lr: 0.1\n", "c.yaml")
    assert merged["run"] == {"lr": 0.1, "steps": 5}  # a key beside a merge overrides it: not a duplicate
    assert load_yaml_strict("", "c.yaml") is None
    assert load_yaml_strict("a: 1\nb: [1, 2]\n", "c.yaml") == {"a": 1, "b": [1, 2]}
    for text, wanted in (("a: [1\n", "not valid YAML"), ("a: &a [*a]\n", "refers to itself")):
        with pytest.raises(DelphiError, match=wanted):
            load_yaml_strict(text, "c.yaml")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefg", "bcdefgh")
    )
    with pytest.raises(DelphiError, match="alias bomb"):
        load_yaml_strict(bomb, "c.yaml")


def test_every_committed_yaml_is_free_of_repeated_keys():
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "*.yaml", "*.yml"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    for name in files:
        try:
            load_yaml_strict((REPO / name).read_text(), name)
        except DelphiError as e:
            assert "duplicate key" not in str(e), e
        except (OSError, UnicodeDecodeError):
            pass


def _read_yaml_is_strict(tmp_path: Path) -> bool:
    from delphi.io import read_yaml

    probe = tmp_path / "probe.yaml"
    probe.write_text("a: 1\na: 2\n")
    try:
        read_yaml(probe)
    except DelphiError:
        return True
    return False


def test_a_config_with_a_repeated_key_is_refused_by_the_cli(tmp_path, capsys):
    assert _read_yaml_is_strict(tmp_path)
    config = tmp_path / "cfg.yaml"
    config.write_text(TINY.read_text() + "steps: 7\n")
    lines = TINY.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if line.startswith("steps:"))
    code, _, err = run(["flops", config], capsys)
    assert code == 2
    one_error(err, config, "'steps'", f"first at line {first}", f"line {len(lines) + 1}")


# --------------------------------------------------------------------------- predictions


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fits")
    out = {}
    for method in ("isoflop", "vpnls", "frontier"):
        out[method] = root / f"{method}.json"
        assert main(["fit", method, str(ISOFLOPS), "--query", QUERY, "--out", str(out[method])]) == 0
    return out


def test_predict_config_at_its_own_n_and_d(fits, capsys):
    """Before: an isoFLOP fit predicted the compute-optimal model at the config's compute and
    reported its N*, D* as if they were the config's."""
    from delphi.fits.prediction_checks import config_query
    from delphi.fits.results import load_fit

    q = config_query(TINY)
    code, out, _ = run(["predict", fits["vpnls"], "--config", TINY, "--json"], capsys)
    vp = json.loads(out)
    assert code == 0 and vp["params"] == q["params"] and vp["tokens"] == q["tokens"] and vp["compute"] == q["compute"]
    assert vp["loss"] == pytest.approx(load_fit(fits["vpnls"]).predict(params=q["params"], tokens=q["tokens"])["loss"])
    assert "at the run's N and D" in vp["how"]

    code, out, _ = run(["predict", fits["isoflop"], "--config", TINY, "--json"], capsys)
    iso = json.loads(out)
    assert code == 0 and iso["params"] == q["params"] and iso["tokens"] == q["tokens"]
    assert iso["params_opt"] != q["params"] and "tokens_opt" in iso  # N*, D* apart from the config's own
    optimum = load_fit(fits["isoflop"]).predict(compute=q["compute"])["loss"]
    assert iso["loss"] == pytest.approx(optimum + iso["off_optimum_penalty"]) and iso["off_optimum_penalty"] > 0
    assert "exact compute" in iso["how"] and "penalty" in iso["how"]

    code, out, _ = run(["predict", fits["frontier"], "--config", TINY, "--json"], capsys)
    fr = json.loads(out)
    assert code == 0 and fr["params"] == q["params"] and "params_opt" not in fr
    assert "compute-optimal loss at that C" in fr["how"]  # what a law in C alone can say, said


@pytest.mark.parametrize("compute, where", [(1e15, "below"), (1e20, "inside"), (6e18, "inside"), (1e22, "above")])
def test_predict_says_where_the_compute_lies(fits, capsys, compute, where):
    """Before: 1e15 on a fit of 6e18 .. 1e21 said 'inside the fitted budgets'."""
    code, _, err = run(["predict", fits["isoflop"], "--compute", compute], capsys)
    assert code == 0 and f"{where} the fitted budgets" in err


@pytest.mark.parametrize("kind, key, value", [("isoflop", "a", -0.5), ("isoflop", "b", 0.0), ("vpnls", "beta", -0.3)])
def test_a_fit_with_an_impossible_exponent_is_refused(fits, tmp_path, capsys, kind, key, value):
    data = json.loads(fits[kind].read_text())
    data["params"][key] = value
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data))
    code, out, err = run(["predict", bad, "--compute", "1e20"], capsys)
    assert code == 2 and out == ""
    one_error(err, bad, f"params.{key}", "> 0")


# --------------------------------------------------------------------------- seeds and the environment


@pytest.mark.parametrize(
    "argv",
    [
        ["fit", "isoflop", ISOFLOPS, "--seed", "-1", "--bootstrap", "20"],
        [
            "ladder",
            "hero",
            "--fit",
            "f.json",
            "--compute",
            "1e15",
            "--spec",
            "s.yaml",
            "--out",
            "h.yaml",
            "--seed",
            "-1",
        ],
        ["mup", "lr-sweep", "--out", "sweep", "--seed", "-1"],
    ],
    ids=["fit", "ladder-hero", "mup-lr-sweep"],
)
def test_a_negative_seed_is_refused(tmp_path, capsys, monkeypatch, argv):
    """Before: `fit --seed -1 --bootstrap N` ended in numpy's ValueError traceback."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2
    one_error(err, "--seed", "-1")
    assert list(tmp_path.iterdir()) == []


def test_the_bootstrap_refuses_a_negative_seed():
    import pandas as pd

    from delphi.fits.bootstrap import bootstrap

    with pytest.raises(DelphiError, match="seed = -1"):
        bootstrap(lambda t: {"m": 1.0}, pd.DataFrame({"loss": [1.0, 2.0]}), 20, -1)


@pytest.mark.parametrize("key", ["data.seed", "seed"])
def test_a_negative_seed_in_a_train_config_writes_nothing(store, tmp_path, capsys, key):
    """Before: data.seed: -1 was refused at the first batch, after the run directory was written."""
    from tests.test_train import tiny_config, write_config

    config = write_config(tmp_path / "cfg.yaml", tiny_config(store), **{key: -1})
    out = tmp_path / "run"
    code, _, err = run(["train", config, "--out", out, "--no-progress"], capsys)
    assert code == 2
    one_error(err, config, f"{key}: must be an integer in [0, 2**63), got -1")
    assert not out.exists()


@pytest.mark.parametrize(
    "env, name",
    [
        ({"WANDB_MODE": "garbage"}, "WANDB_MODE"),
        ({"WANDB_MODE": "online"}, "WANDB_MODE"),  # no key anywhere: wandb.init would stop to ask
        ({"DELPHI_STEPS_PER_CALL": "abc"}, "DELPHI_STEPS_PER_CALL"),
        ({"DELPHI_STEPS_PER_CALL": "0"}, "DELPHI_STEPS_PER_CALL"),
        ({"DELPHI_CHECKPOINT_CLOCK_S": "soon"}, "DELPHI_CHECKPOINT_CLOCK_S"),
        ({"DELPHI_PEAK_FLOPS_F32": "-1"}, "DELPHI_PEAK_FLOPS_F32"),  # before: a negative MFU
        ({"DELPHI_PEAK_FLOPS_BF16": "fast"}, "DELPHI_PEAK_FLOPS_BF16"),
        ({"DELPHI_PEAK_FLOPS_F32": "inf"}, "DELPHI_PEAK_FLOPS_F32"),
        ({"DELPHI_DISTRIBUTED": "maybe"}, "DELPHI_DISTRIBUTED"),
    ],
    ids=lambda v: v if isinstance(v, str) else "=".join(next(iter(v.items()))),
)
def test_an_unusable_environment_variable_is_refused_before_training(store, tmp_path, capsys, monkeypatch, env, name):
    """Before: a traceback (WANDB_MODE, DELPHI_* not numbers) after the run directory was written."""
    from tests.test_train import tiny_config, write_config

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a W&B key
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    out = tmp_path / "run"
    code, _, err = run(["train", config, "--out", out, "--no-progress"], capsys)
    assert code == 2
    one_error(err, f"environment variable {name}")
    assert not out.exists()


def test_environment_values_that_work(monkeypatch, tmp_path):
    from delphi.train import environment as envmod

    monkeypatch.setenv("HOME", str(tmp_path))
    for var in (
        "WANDB_API_KEY",
        "WANDB_IDENTITY_TOKEN_FILE",
        "NETRC",
        "WANDB_MODE",
        "DELPHI_PEAK_FLOPS_F32",
        "DELPHI_STEPS_PER_CALL",
        "DELPHI_CHECKPOINT_CLOCK_S",
        "DELPHI_DISTRIBUTED",
    ):
        monkeypatch.delenv(var, raising=False)
    envmod.check_training_environment()
    assert envmod.wandb_mode(None) == "disabled" and envmod.steps_per_call_env() is None
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    monkeypatch.setenv("DELPHI_PEAK_FLOPS_F32", "1e11")
    monkeypatch.setenv("DELPHI_STEPS_PER_CALL", "4")
    monkeypatch.setenv("DELPHI_CHECKPOINT_CLOCK_S", "0")
    monkeypatch.setenv("DELPHI_DISTRIBUTED", "false")
    envmod.check_training_environment([None, "disabled"])
    assert envmod.wandb_mode(None) == "offline" and envmod.peak_flops_env("f32") == 1e11
    assert envmod.steps_per_call_env() == 4 and envmod.checkpoint_clock_env() == 0.0 and not envmod.distributed_env()
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("WANDB_MODE", "online")
    assert envmod.check_wandb(None) == "online"  # a key from `wandb login`


# --------------------------------------------------------------------------- Parquet


@pytest.mark.skipif(
    importlib.util.find_spec("pyarrow") is not None or importlib.util.find_spec("fastparquet") is not None,
    reason="a Parquet engine is installed",
)
def test_parquet_without_pyarrow_says_what_to_install(tmp_path, capsys):
    table = tmp_path / "results.parquet"
    table.write_bytes(b"PAR1" + b"\0" * 16 + b"PAR1")
    code, _, err = run(["fit", "isoflop", table], capsys)
    assert code == 2
    one_error(err, table, "pyarrow", "delphi[parquet]")
