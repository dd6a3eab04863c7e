"""Every command's `--help` works, and building the parser stays light (no jax, no pandas).

The help walk goes over the argparse tree that `delphi.cli.build_parser()` builds, so a
command added later is covered without touching this file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from delphi.cli import build_parser, main


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under `parser`, depth first: (), ("fit",), ("fit", "isoflop"), ..."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += _subcommands(child, (*path, name))
    return paths


COMMANDS = _subcommands(build_parser())


def test_the_walk_finds_every_part():
    top = {p[0] for p in COMMANDS if p}
    assert {"data", "train", "flops", "mup", "ladder", "fit", "predict", "prereg", "plot", "study", "paper"} <= top
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "delphi")
def test_help_exits_0_with_text(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() and "usage: delphi" in out


@pytest.mark.parametrize("group", sorted({p[0] for p in COMMANDS if len(p) == 2}))
def test_a_group_without_its_subcommand_prints_its_own_help(group, capsys):
    try:
        code = main([group])
    except SystemExit as e:  # argparse's own "required" error is fine too, if it names the group
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert f"usage: delphi {group}" in err  # the group's usage, not the top-level one


def test_building_the_parser_imports_no_heavy_library():
    heavy = ("jax", "flax", "optax", "pandas", "matplotlib", "scipy", "ray")
    code = (
        "import sys; from delphi.cli import build_parser; build_parser(); "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"building the parser imported {loaded}"


def test_the_parsers_copy_of_the_param_conventions_is_the_fitters():
    from delphi import cli
    from delphi.fits.allocation import PARAM_CONVENTIONS

    assert cli.PARAM_CONVENTIONS == PARAM_CONVENTIONS


def test_the_parsers_copies_of_the_probe_carries_and_noise_scopes_are_the_backtests():
    from delphi.fits import commands as fit_commands
    from delphi.fits.probes import NOISE_SCOPES, PROBE_CARRIES
    from delphi.prereg import commands as prereg_commands

    assert fit_commands.PROBE_CARRIES == prereg_commands.PROBE_CARRIES == tuple(PROBE_CARRIES)
    assert prereg_commands.NOISE_SCOPES == tuple(NOISE_SCOPES)


def test_an_argument_error_imports_no_heavy_library():
    code = (
        "import sys; from delphi.cli import main\n"
        "try:\n    main(['predict', 'fit.json', '--compute', 'nan'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, 'jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "False"]
