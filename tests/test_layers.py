"""The import graph of the `delphi` package respects its layer order (docs/design.md §2.2).

Every module is parsed with `ast` (imports inside functions and under `if TYPE_CHECKING:` count:
they are dependencies all the same) and each import of a `delphi` module is checked:

- it goes down the layers, or stays inside its own part (a subpackage, or the base modules);
- parts that share a layer (ladder, prereg, plot) do not import each other;
- a command module (`<part>/commands.py`) sits in its part's layer: it may
  import its own part, any part below it and the CLI helpers in `delphi.cli` (the top layer),
  never another part's commands, and no library module imports a command module;
- no two modules import each other, directly or through others (no cycle): a module imports
  nothing that imports it back, at top level or inside a function.

A lazy import is an import too: `importlib.import_module("delphi.x")` with the name written out,
and a module-level `__getattr__` (PEP 562) that hands out names of other modules (the old homes
of moved names) imports every `delphi` module whose name the module spells as a string (a
package's `f"{__name__}.{sub}"` included). `importlib.import_module(name)` of a name computed
elsewhere (how `delphi.cli` finds the command modules) is not: the CLI discovers its commands by
name, on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "delphi"

# Bottom to top. A module belongs to the entry with the longest prefix that matches it (command
# modules excepted, see `layer_of`). Parts listed together would share a layer and must not import
# each other; today only the command modules share one.
LAYERS: list[tuple[str, ...]] = [
    (
        "delphi",
        "delphi.errors",
        "delphi.hashes",
        "delphi.written_by",
        "delphi.path_policy",
        "delphi.io",
        "delphi.config_schema",
    ),  # base: one part
    ("delphi.data",),
    ("delphi.model",),
    ("delphi.train",),
    ("delphi.fits",),
    ("delphi.plot",),  # draws what it is given: imports only the base
    ("delphi.ladder",),
    ("delphi.prereg",),  # reads the ladder's spec and results, the fits, the hero config
    ("delphi.experiments",),  # muP experiments: train models, draw with plot
    ("delphi.study",),
    ("delphi.paper",),
    ("delphi.cli",),  # wires the command modules together (by name) and holds their argparse helpers
]
CLI_HUB = "delphi.cli"  # argparse helpers every command module uses

# Imports that break the rules today, each waiting for its owner to remove it. The test fails on
# any violation not listed here, and on any entry listed here that no longer occurs (delete it).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}
# Import cycles that exist today (modules of one strongly connected component); a cycle found
# must lie inside one of these. Same rule: the test fails on a new cycle and on a stale entry.
KNOWN_CYCLES: list[frozenset[str]] = []


def module_files() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` refers to: itself, else its closest enclosing package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every `delphi` module that `module` imports, anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name, modules) for alias in node.names if alias.name.split(".")[0] == "delphi")
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "delphi":
                continue
            for alias in node.names:  # `from delphi.model import mup` imports the module delphi.model.mup
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else _resolve(source, modules))
    found.update(_lazy_imports_of(module, tree, modules))
    found.discard(None)
    found.discard(module)
    return found


def _is_import_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
    )


def _lazy_imports_of(module: str, tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """The `delphi` modules `module` imports lazily (see the module docstring)."""
    found = {
        _resolve(node.args[0].value, modules)
        for node in ast.walk(tree)
        if _is_import_module(node)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and node.args[0].value.split(".")[0] == "delphi"
    }
    if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body):
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(name for name in (node.value, f"{module}.{node.value}") if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def is_command_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1] == "commands"


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, part) of a module; the part is what it may import freely within its layer.
    A command module sits in its part's layer (`delphi.train.commands` with `delphi.train`)."""
    best: tuple[int, str] | None = None
    for index, parts in enumerate(LAYERS):
        for prefix in parts:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its part to LAYERS (and to docs/design.md §2.2)")
    index, prefix = best
    return index, "base" if index == 0 else prefix


def violation(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    if imported == CLI_HUB:  # the argparse helpers: for command modules only
        return None if is_command_module(importer) else "a library module imports the command line"
    if is_command_module(imported):
        return (
            "imports another part's command module"
            if is_command_module(importer)
            else "a library module imports a command module"
        )
    (low_layer, low_part), (high_layer, high_part) = layer_of(imported), layer_of(importer)
    if low_layer < high_layer:
        return None
    if low_part == high_part:
        return None
    if low_layer == high_layer:
        return f"imports {low_part}, which shares its layer"
    return f"imports up: layer {high_layer} ({high_part}) -> layer {low_layer} ({low_part})"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_imports_inside_functions():
    graph = import_graph()
    # delphi.train.trainer imports the transformer inside init_model only
    assert "delphi.model.transformer" in graph["delphi.train.trainer"]
    assert "delphi.model.mup" in graph["delphi.train.optim"]  # `from delphi.model import mup`


def test_graph_sees_lazy_imports():
    graph = import_graph()
    # the old home of moved names hands them out from the new one, by `__getattr__`
    assert "delphi.fits.parametric" in graph["delphi.fits"]
    assert not {m for m in graph["delphi.cli"] if m.endswith(".commands")}  # found by name, on purpose


def test_the_fits_package_imports_run_one_way():
    """The backtest imports the probes' trend, never the other way round; the curve law and the shape
    trajectory share a run's evals (delphi.fits.evals) below them and import neither each other nor
    the backtest."""
    graph = import_graph()
    assert "delphi.fits.probes" in graph["delphi.fits.backtest"]
    assert "delphi.fits.backtest" not in graph["delphi.fits.probes"]
    assert (
        "delphi.fits.evals" in graph["delphi.fits.curves"]
        and "delphi.fits.evals" in graph["delphi.fits.shape_trajectory"]
    )
    assert "delphi.fits.curves" not in graph["delphi.fits.shape_trajectory"]
    assert "delphi.fits.backtest" not in graph["delphi.fits.shape_trajectory"]


def test_rules_catch_what_they_should():
    assert violation("delphi.model.moe", "delphi.train.trainer")  # up
    assert violation("delphi.plot.figures", "delphi.prereg.check")  # plot draws what it is given
    assert violation("delphi.ladder.runner", "delphi.prereg.check")
    assert violation("delphi.plot.commands", "delphi.prereg.commands")  # another part's commands
    assert violation("delphi.ladder.runner", "delphi.fits.commands")
    assert violation("delphi.fits.curves", "delphi.train.schedules") is None  # down
    assert violation("delphi.prereg.commands", "delphi.plot.figures") is None  # down from prereg's layer
    assert violation("delphi.model.commands", "delphi.train.config")  # a command module sits in its part's layer
    assert violation("delphi.train.commands", "delphi.prereg.check")
    assert violation("delphi.study.commands", "delphi.paper")
    assert violation("delphi.paper.commands", "delphi.paper.build") is None
    assert violation("delphi.fits.curves", "delphi.cli")  # library modules never use the command line
    assert violation("delphi.fits.commands", "delphi.cli") is None
    assert violation("delphi.io", "delphi.errors") is None  # within the base
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]  # two modules that import each other


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_no_import_goes_up_or_sideways():
    graph = import_graph()
    found = {
        (importer, imported): why
        for importer, targets in graph.items()
        for imported in targets
        if (why := violation(importer, imported)) is not None
    }
    new = {k: v for k, v in found.items() if k not in KNOWN_VIOLATIONS}
    stale = sorted(set(KNOWN_VIOLATIONS) - set(found))
    assert not new, "imports against the layer order (docs/design.md §2.2):\n" + "\n".join(
        f"  {a} -> {b}: {why}" for (a, b), why in sorted(new.items())
    )
    assert not stale, f"fixed, so delete from KNOWN_VIOLATIONS: {stale}"


def test_no_import_cycle():
    found = cycles(import_graph())
    new = [c for c in found if not any(set(c) <= known for known in KNOWN_CYCLES)]
    stale = [sorted(k) for k in KNOWN_CYCLES if not any(set(c) & k for c in found)]
    assert not new, f"import cycles: {new}"
    assert not stale, f"fixed, so delete from KNOWN_CYCLES: {stale}"
