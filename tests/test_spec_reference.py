"""docs/spec-reference.md is generated from the schema: a key added, removed or re-commented without
regenerating the page (`python -m delphi.study.spec_reference --write`) fails here."""

from __future__ import annotations

import dataclasses
import typing

from delphi.ladder.spec import LadderSpec
from delphi.study import spec_reference
from delphi.study.spec import StudySpec


def test_the_page_is_the_schema():
    assert spec_reference.PAGE.read_text() == spec_reference.render(), (
        f"docs/spec-reference.md differs from the schema; regenerate it with `{spec_reference.COMMAND}`"
    )
    assert spec_reference.main(["--check"]) == 0


def test_every_key_has_a_meaning_and_every_number_a_unit():
    assert spec_reference.problems() == []


def test_every_field_of_the_schema_is_on_the_page():
    text = spec_reference.PAGE.read_text()

    def keys(cls: type, prefix: str = "") -> list[str]:
        out = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.append(prefix + f.name)
            section = spec_reference._section_of(hints[f.name])
            if section is not None and section.__name__ != "RecipeConstant":
                out += keys(section, f"{prefix}{f.name}.")
        return out

    for key in keys(LadderSpec) + keys(StudySpec):
        assert f"| `{key}` |" in text, key


def test_a_field_without_a_comment_is_reported(monkeypatch):
    monkeypatch.setattr(spec_reference, "field_comments", lambda cls: {})
    monkeypatch.setattr(spec_reference, "MEANINGS", {})
    assert "budgets: no meaning (a comment at the field, or MEANINGS)" in spec_reference.problems()
