"""The package's imports tell its structure: its own modules are imported at module level
(an import inside a function says why with a ``# lazy:`` comment), no module or
subpackage imports one that imports it back, and planning (the Snakefile's imports)
loads neither torch, diffusers, Parsl nor numpy. Read from the source with ``ast``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workflow" / "pairflow"
PENDING: set[str] = set()
"""Modules exempt from the module-level rule while work on them is under way (none now)."""


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (``pairflow.stages`` for its
    ``__init__.py``)."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package's modules an import statement in module ``name`` loads (empty for a
    third-party or standard-library import)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if node.level:
        base = _package_of(name)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    if base not in MODULES:
        return []
    return [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]


def _function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [stmt for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for stmt in ast.walk(fn) if isinstance(stmt, (ast.Import, ast.ImportFrom))]


def _reason(lines: list[str], node: ast.stmt) -> bool:
    """Whether the comment block right above ``node`` (other imports and blank lines
    between allowed) gives a ``# lazy:`` reason."""
    i = node.lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if text.startswith("# lazy:"):
            return True
        if not (text.startswith(("#", "from ", "import ")) or text == ""):
            return False
        i -= 1
    return False


def test_the_package_imports_its_own_modules_at_module_level() -> None:
    unexplained = []
    for name, f in MODULES.items():
        if f.name in PENDING:
            continue
        source = f.read_text()
        lines = source.splitlines()
        for node in _function_imports(ast.parse(source)):
            if _targets(name, node) and not _reason(lines, node):
                unexplained.append(f"{f.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, ("imports of the package inside functions with no '# lazy:' comment saying why; "
                             "move them to the top of the module:\n" + "\n".join(unexplained))


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere: at module level, under
    ``TYPE_CHECKING`` and in a function (a lazy import is still an arrow between layers)."""
    out: dict[str, set[str]] = {}
    for name, f in MODULES.items():
        tree = ast.parse(f.read_text())
        out[name] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                     for t in _targets(name, node)} - {name}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


FOUNDATION = ("errors", "identity", "layout", "specs", "atomic", "locks", "jobenv", "envinfo", "progress", "nvml",
              "jobaccount")
"""The ground floor: flat modules that import no wing."""
WINGS = ("foundation", "metrics", "arms", "plan", "records", "media", "fleet", "generation", "budget", "analysis",
         "report", "evidence", "stages", "cli")
"""The floors, from the ground up: a module may import its own floor and the ones below,
never one above. The one table of the house (the package's docstring lists it)."""


def _wing(name: str) -> str:
    """The floor of module ``name``: its wing (first subpackage), ``foundation`` for a
    flat module of ``FOUNDATION``, ``cli`` for the command on top; a flat module not in
    the table has no floor (the test below names it)."""
    parts = name.split(".")
    if len(parts) == 1:
        return "foundation"  # the package's own __init__
    if len(parts) > 2 or MODULES[name].name == "__init__.py":
        return parts[1]
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor, as 'importer -> imported (wing -> wing)'."""
    floor = {w: i for i, w in enumerate(WINGS)}
    return [f"{a} -> {b} ({_wing(a)} -> {_wing(b)})" for a, deps in sorted(graph.items()) for b in sorted(deps)
            if floor[_wing(b)] > floor[_wing(a)]]


def test_every_module_has_a_floor() -> None:
    """A new subpackage or flat module is placed in the table (``WINGS``, ``FOUNDATION``)."""
    unplaced = sorted(n for n in MODULES if _wing(n) not in WINGS)
    assert not unplaced, f"modules on no floor; add their wing to WINGS (or a flat module to FOUNDATION): {unplaced}"


def test_no_wing_imports_a_wing_above_it() -> None:
    upward = _upward(_graph())
    assert not upward, "imports of a higher floor (move the module, or the code it needs, down):\n" + "\n".join(upward)


def test_the_floor_check_sees_an_upward_import() -> None:
    """The check above is not vacuous: the foundation importing the report is found."""
    graph = {"pairflow.layout": {"pairflow.report.table"}, "pairflow.report.table": {"pairflow.layout"}}
    assert _upward(graph) == ["pairflow.layout -> pairflow.report.table (foundation -> report)"]


def test_the_package_docstring_lists_the_floors_in_order() -> None:
    """The floor plan a reader sees (``pairflow/__init__.py``) is the table above."""
    doc = (PACKAGE / "__init__.py").read_text()
    named = re.findall(r"^- (?:the foundation|``(\w+)/?``)", doc, re.M)
    assert [n or "foundation" for n in named] == list(WINGS)
    for module in FOUNDATION:
        assert f"``{module}``" in doc


def _unit(name: str) -> str:
    """The layer a module belongs to: its subpackage (``pairflow.stages``), else itself."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or MODULES[name].name == "__init__.py" else name


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_import_cycle_between_subpackages_and_modules() -> None:
    """``stages/`` and ``metrics/`` are layers: nothing they import imports them back."""
    units: dict[str, set[str]] = {}
    for name, deps in _graph().items():
        units.setdefault(_unit(name), set()).update(_unit(d) for d in deps if _unit(d) != _unit(name))
    assert _cycles(units) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    """The check above is not vacuous: a cycle through a subpackage is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_lazy_rule_sees_an_unexplained_import() -> None:
    """A function-level import of the package is found, and a ``# lazy:`` comment excuses it."""
    source = ("def f():\n    from ..plan.candidates import candidates\n\n"
              "def g():\n    # lazy: numpy\n    from ..media.video import recipe\n    from ..layout import Layout\n")
    tree = ast.parse(source)
    lines = source.splitlines()
    found = [(node.lineno, _reason(lines, node)) for node in _function_imports(tree)
             if _targets("pairflow.evidence.healing", node)]
    assert found == [(2, False), (6, True), (7, True)]


def test_planning_imports_neither_torch_nor_scipy() -> None:
    """The Snakefile's imports of the package (``workflow/rules/*.smk``) load no heavy
    library: planning a study stays quick, and no GPU library starts while Snakemake plans.
    numpy is allowed (about 0.1 s on a quiet machine): the arms' registry, the steps and the
    calibration key bring it."""
    imports = sorted({m for smk in (ROOT / "workflow" / "rules").glob("*.smk")
                      for m in re.findall(r"^from (pairflow[\w.]*) import", smk.read_text(), re.M)})
    assert "pairflow.evidence.healing" in imports and "pairflow.plan.config" in imports
    heavy = ("torch", "diffusers", "parsl", "scipy", "av", "pyiqa", "matplotlib")
    code = (f"import sys\nfor m in {imports!r}: __import__(m)\n"
            f"print(sorted(h for h in {heavy!r} if h in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
