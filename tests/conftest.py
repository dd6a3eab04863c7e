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
