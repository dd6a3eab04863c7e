"""House rules of the `delphi` package that a reader relies on (docs/design.md, "Package map").

- Comments and docstrings say what the code does today: none cites an issue number, a date, or
  an edition's result as the reason for code (the story is in docs/notebook.md).
- Imports are in sight: a `delphi` import sits at module top, except in the command modules
  (`commands.py`, `cli.py`), where a lazy import keeps the CLI's start-up short and says so with
  a `# lazy: <reason>` comment.
- No module imports another module's private names.
- No function takes more than `MAX_PARAMETERS` parameters; wider evidence travels in a dataclass.
- The layer test (tests/test_layers.py) lists no known violation and no known cycle.
- docs/design.md's package map (what each part owns, which parts it imports) is the one the code
  has: `python tests/test_house.py --write` regenerates it from the import graph and each
  subpackage's docstring.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from test_layers import CLI_HUB, KNOWN_CYCLES, KNOWN_VIOLATIONS, LAYERS, import_graph, layer_of

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "delphi"
MODULES = sorted(PACKAGE_DIR.rglob("*.py"))
MAX_PARAMETERS = 10
COMMAND_MODULES = ("commands.py", "cli.py")  # where a lazy import may keep `delphi --help` fast

ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
EDITION = re.compile(
    r"\bedition\b|\bpaper v?\d\b|\bv[1-9]\b(?! *[:=])|\b(first|second|third|fourth|fifth|sixth|seventh|eighth) paper\b",
    re.IGNORECASE,
)
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(])")
RESULT = re.compile(r"(?<![\w.])[+-]\d+(\.\d+)?\s?%|\bmiss(ed)?\b|\berred\b")  # a signed error, a miss


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE_DIR.parent))


def prose_blocks(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and every run of adjacent comment lines."""
    blocks: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                blocks.append((node.body[0].lineno, doc))
    last_line, lines, start = -2, [], 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        if row != last_line + 1 and lines:
            blocks.append((start, "\n".join(lines)))
            lines = []
        if not lines:
            start = row
        lines.append(tok.string)
        last_line = row
    if lines:
        blocks.append((start, "\n".join(lines)))
    return blocks


def history_in(source: str) -> list[str]:
    """Comment or docstring blocks that tell history: an issue number, a date, an edition's result."""
    found = []
    for line, text in prose_blocks(source):
        for pattern, what in ((ISSUE, "cites an issue"), (DATE, "carries a date")):
            if m := pattern.search(text):
                found.append(f"line {line}: {what}: {m.group(0)!r}")
        for sentence in SENTENCE_END.split(re.sub(r"\s*\n\s*#?\s*", " ", text)):
            if (e := EDITION.search(sentence)) and (r := RESULT.search(sentence)):
                found.append(f"line {line}: an edition's result ({e.group(0)!r} with {r.group(0)!r})")
                break
    return found


def test_history_check_sees_history() -> None:
    """The checker is not vacuous."""
    assert history_in("# Before issue 41 the runner retried\nx = 1\n")
    assert history_in('"""Measured on 2026-12-03."""\n')
    assert history_in("def f():\n    # the eighth edition missed 30x by +2.07%, so we widen\n    pass\n")
    assert not history_in("# the 90% interval of the law's prediction\nx = 1  # 50% of the tokens\n")
    assert not history_in('COLOR = "#1f77b4"  # matplotlib blue\n')


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_comments_and_docstrings_say_what_the_code_does_today(path: Path) -> None:
    found = history_in(path.read_text())
    assert not found, f"{_name(path)} tells history (move it to docs/notebook.md):\n  " + "\n  ".join(found)


def _delphi_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "delphi" for a in node.names)
    return isinstance(node, ast.ImportFrom) and (bool(node.level) or (node.module or "").split(".")[0] == "delphi")


def hidden_imports(source: str, command_module: bool) -> list[str]:
    """`delphi` imports inside functions: none in a library module; in a command module, only
    those that say why (`# lazy: <reason>` on the import's first or last line)."""
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if not _delphi_import(node):
                continue
            said = any("# lazy:" in lines[n - 1] for n in (node.lineno, node.end_lineno or node.lineno))
            if not (command_module and said):
                found.append(f"line {node.lineno} in {func.name}()")
    return found


def test_hidden_import_check_sees_them() -> None:
    src = "def f():\n    from delphi.fits import laws\n"
    assert hidden_imports(src, command_module=False) and hidden_imports(src, command_module=True)
    lazy = "def f():\n    from delphi.fits import laws  # lazy: scipy\n"
    assert not hidden_imports(lazy, command_module=True) and hidden_imports(lazy, command_module=False)
    assert not hidden_imports("def f():\n    import json\n", command_module=False)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_imports_are_in_sight(path: Path) -> None:
    found = hidden_imports(path.read_text(), command_module=path.name in COMMAND_MODULES)
    assert not found, f"{_name(path)}: delphi imports inside functions (move to module top):\n  " + "\n  ".join(found)


def private_imports(source: str) -> list[str]:
    return [
        f"line {node.lineno}: {node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if _delphi_import(node) and isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_private_names(path: Path) -> None:
    found = private_imports(path.read_text())
    assert not found, f"{_name(path)} imports private names (make them public or move them): {found}"


def wide_functions(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            if len(names) > MAX_PARAMETERS:
                found.append(f"line {node.lineno}: {node.name}() takes {len(names)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_function_takes_more_than_ten_parameters(path: Path) -> None:
    found = wide_functions(path.read_text())
    assert not found, f"{_name(path)}: pass a dataclass instead:\n  " + "\n  ".join(found)


def test_the_layer_test_has_no_exceptions() -> None:
    assert not KNOWN_VIOLATIONS, f"imports against the layer order remain: {sorted(KNOWN_VIOLATIONS)}"
    assert not KNOWN_CYCLES, f"import cycles remain: {KNOWN_CYCLES}"


DESIGN = PACKAGE_DIR.parent / "docs" / "design.md"
MAP_START, MAP_END = (
    "<!-- package-map: generated by `python tests/test_house.py --write` -->",
    "<!-- package-map end -->",
)


def _first_clause(text: str, stop: str) -> str:
    """The first sentence of a docstring, cut at the first of `stop`'s characters that ends a clause."""
    first = " ".join(text.split("\n\n")[0].split())
    return re.split(rf"(?<=[a-z)`])[{stop}](\s|$)", first, maxsplit=1)[0]


def _owns(part: str) -> str:
    """What a part owns: its docstring's first clause (a subpackage's `__init__.py`, a base module's own)."""
    package = PACKAGE_DIR.parent / part.replace(".", "/")
    path = package / "__init__.py" if (package / "__init__.py").is_file() else package.with_suffix(".py")
    owns = _first_clause(
        ast.get_docstring(ast.parse(path.read_text())) or "", "." if path.name == "__init__.py" else ".:"
    )
    assert owns, f"{path}: its docstring's first sentence says what the part owns (docs/design.md package map)"
    return owns


def package_map() -> str:
    """The markdown table of docs/design.md's package map: layer, part, what it owns, what it imports
    (the command modules' use of `delphi.cli`'s helpers aside)."""
    graph = import_graph()
    uses: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        part = layer_of(importer)[1]
        uses.setdefault(part, set()).update(layer_of(t)[1] for t in targets if layer_of(t)[1] not in (part, CLI_HUB))
    order = ["base"] + [p for parts in LAYERS[1:] for p in parts]
    short = {p: p.removeprefix("delphi.") for p in order}
    rows = ["| layer | part | owns | imports |", "|---|---|---|---|"]
    for layer, part in enumerate(order):
        if part == "base":
            base = sorted(m for m in graph if m != "delphi" and layer_of(m)[1] == "base")
            name = "base (`delphi.*` modules)"
            owns = "; ".join(f"`{m.rpartition('.')[2]}`: {_owns(m)}" for m in base)
        else:
            name, owns = f"`{short[part]}`", _owns(part)
        used = [short[p] if p == "base" else f"`{short[p]}`" for p in order if p in uses.get(part, set())]
        rows.append(f"| {layer} | {name} | {owns} | {', '.join(used) or 'third-party only'} |")
    return "\n".join(rows)


def _design_with_map() -> str:
    text = DESIGN.read_text()
    head, _, rest = text.partition(MAP_START)
    _, _, tail = rest.partition(MAP_END)
    assert rest, f"{DESIGN}: no package map section (a line {MAP_START!r})"
    return f"{head}{MAP_START}\n{package_map()}\n{MAP_END}{tail}"


def test_design_package_map_is_the_code() -> None:
    assert DESIGN.read_text() == _design_with_map(), (
        "docs/design.md's package map is stale: python tests/test_house.py --write"
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        DESIGN.write_text(_design_with_map())
    else:
        print(package_map())
