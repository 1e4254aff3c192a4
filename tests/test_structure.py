"""The package's import structure: no import circle, no private name taken across packages.

The graph is read from the source with :mod:`ast` (nothing is imported): every ``import`` and
``from ... import`` of a ``soulmem_torch`` module, at module level or inside a function (a lazy
import runs too, so a circle it closes is still a circle), with relative imports resolved and
``from pkg import sub`` read as an import of the submodule. Importing ``a.b.c`` from outside
``a.b`` also runs ``a/b/__init__.py``, so that is an arrow too. Imports under ``if
TYPE_CHECKING:`` never run and are left out (they only name types for annotations).

A *unit* is a top-level subpackage or module of ``soulmem_torch`` (``soulmem_torch.bank``,
``soulmem_torch.api``, …). A module may import a private module (``_x.py``) or a private name
(``_x``) only from inside its own unit; the root's own private modules (``soulmem_torch._x``)
are the whole package's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import soulmem_torch

ROOT = Path(soulmem_torch.__file__).parent
PACKAGE = "soulmem_torch"


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a module of the package
    name: str | None  # the name taken from it (None: the module itself)
    line: int
    typing_only: bool  # under ``if TYPE_CHECKING:``


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _from_target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from … import`` in ``module`` reads (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return hidden


def _imports(modules: dict[str, tuple[Path, bool]]) -> Iterator[Import]:
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            typing_only = id(node) in hidden
            if typing_only and is_package:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE:
                        yield Import(module, alias.name, None, node.lineno, typing_only)
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(module, is_package, node)
                if target.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        yield Import(module, sub, None, node.lineno, typing_only)
                    else:
                        yield Import(module, target, alias.name, node.lineno, typing_only)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules importing it runs (see the module docstring)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in _imports(modules):
        parts = imp.target.split(".")
        first = len(parts) if imp.typing_only else 2
        for i in range(first, len(parts) + 1):  # the target and the packages above it
            step = ".".join(parts[:i])
            if step in modules and step != imp.importer and not _inside(imp.importer, step):
                graph[imp.importer].add(step)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _private(segment: str) -> bool:
    return segment.startswith("_") and not segment.startswith("__")


def private_imports() -> list[str]:
    """Imports of another unit's private module or private name (see the module docstring)."""
    bad: list[str] = []
    for imp in _imports(_modules()):
        parts = imp.target.split(".")
        for i in range(2, len(parts)):  # a private module below a unit: that unit's own
            if _private(parts[i]) and not _inside(imp.importer, ".".join(parts[:i])):
                found = f"{imp.importer}:{imp.line} imports the private module {imp.target}"
                if found not in bad:
                    bad.append(found)
                break
        if imp.name and _private(imp.name) and not _inside(imp.importer, _unit(imp.target)):
            bad.append(f"{imp.importer}:{imp.line} imports {imp.target}.{imp.name}")
    return bad


def private_attributes() -> list[str]:
    """Uses of a private name of another unit through an imported module (``import a.b as m``,
    ``from a import b`` where ``b`` is a module, then ``m._x``)."""
    modules = _modules()
    bad = []
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for imp, node in _bound_modules(tree, module, is_package, modules):
            aliases[node] = imp
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                target = aliases[node.value.id]
                if not _inside(module, _unit(target)):
                    bad.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
    return bad


def _bound_modules(
    tree: ast.AST, module: str, is_package: bool, modules: dict[str, tuple[Path, bool]]
) -> Iterator[tuple[str, str]]:
    """``(module imported, the local name it is bound to)`` for every module-binding import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    yield alias.name, alias.asname
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(module, is_package, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    yield sub, alias.asname or alias.name


def test_the_graph_is_read():
    graph = import_graph()
    assert "soulmem_torch.bank.bank" in graph
    assert "soulmem_torch.api" in graph["soulmem_torch.bank.bank"]
    assert "soulmem_torch.retrieve" in graph["soulmem_torch.api"]  # the package's face runs
    assert "soulmem_torch.retrieve.config" in graph["soulmem_torch.retrieve"]


def test_cycles_are_found():
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(toy) == [["a", "b", "c"]]


def test_no_import_circle():
    graph = import_graph()
    circles = strongly_connected(graph)
    described = [
        " ; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in circles
    ]
    assert not circles, "import circles:\n" + "\n".join(described)


def test_no_private_name_across_packages():
    bad = private_imports()
    assert not bad, "\n".join(bad)


def test_no_private_attribute_across_packages():
    bad = private_attributes()
    assert not bad, "\n".join(bad)
