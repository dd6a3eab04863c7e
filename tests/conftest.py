"""Fixtures shared by the test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small real token store: the sources of the stdlib's `email` package (~0.5 MB)."""
    import email

    from delphi.data.store import prepare_store

    out = tmp_path_factory.mktemp("store")
    prepare_store(str(Path(email.__file__).parent), out)
    return out


def load_benchmark(name: str):
    """Import benchmarks/NAME.py as a module for a test (a script, not a package); yields it and
    unregisters it after. Dataclasses look their module up in sys.modules, so it is registered."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        f"{name}_under_test", Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)
