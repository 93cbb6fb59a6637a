"""An import graph of the project's own packages, read from source with ``ast``.

Every import counts, wherever it sits: at the top of a module, inside a
function (a "lazy" import), or under ``if TYPE_CHECKING``; a cycle dodged by
importing late is still a cycle.  Two rules follow from the rings of
``docs/architecture.md``:

    client       portalctl                            (no Django; speaks HTTP only)
    cores        fabric ← scheduler ← workers         (no Django)
    Django apps  utilities ← audit ← tenancy ← inventory ← jobs ← control ← notifications ← shells ← portal

1. a package imports only packages at its own ring position or below
   (no upward import);
2. no cycle, neither between top-level packages nor between modules;
3. no package of ours and no benchmark (``bench/``) imports a test module
   (``tests``, ``workers.tests``, ...): what both need lives in ``devtools``,
   the top ring, which no other package may import by rule 1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

#: Bottom first: each package may import only those before it in this list.
LAYERS: tuple[str, ...] = (
    "portalctl",  # the API's client: imports no package of ours
    "fabric",
    "scheduler",
    "workers",
    "edl",
    "utilities",
    "audit",
    "tenancy",
    "inventory",
    "bundles",
    "jobs",
    "control",
    "notifications",
    "shells",
    "portal",
    "devtools",  # harnesses of the tests and bench/: nothing of ours imports it
)


@dataclass(frozen=True)
class Import:
    """One import statement: which module imports which, and where."""

    source: str  # importing module, dotted
    target: str  # imported module, dotted (resolved to a module of ours)
    line: int


def module_name(root: Path, path: Path) -> str:
    """Dotted module name of ``path`` under ``root`` (packages by their ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, tests and migrations excluded."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).parts
            if "tests" in rel or "migrations" in rel:
                continue
            found[module_name(root, path)] = path
    return found


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _absolute(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(source: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """The imports of one module that land on our own modules."""
    found: list[Import] = []
    for lineno, name in imported_names(source, path):
        target = _resolve(name, modules)
        if target is not None and target != source:
            found.append(Import(source, target, lineno))
    return found


def imported_names(source: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in module ``source`` at ``path``, late
    ones too; ``from a import b`` names ``a.b`` (a module or a name in ``a``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(source, path.name == "__init__.py", node)
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            out += [(node.lineno, name) for name in names]
    return out


def import_graph(root: Path, packages: Sequence[str] = LAYERS) -> tuple[nx.DiGraph, list[Import]]:
    """The module graph of ``packages`` and the list of imports behind its edges."""
    modules = project_modules(root, packages)
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(modules)
    edges: list[Import] = []
    for name, path in modules.items():
        for imp in imports_of(name, path, modules):
            edges.append(imp)
            graph.add_edge(imp.source, imp.target)
    return graph, edges


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def upward_imports(edges: Iterable[Import], layers: Sequence[str] = LAYERS) -> list[str]:
    """Imports of a package from a package above it, as readable lines."""
    rank = {name: i for i, name in enumerate(layers)}
    lines = (
        f"{e.source}:{e.line} imports {e.target} ({_package(e.target)} is above "
        f"{_package(e.source)})"
        for e in edges
        if rank[_package(e.target)] > rank[_package(e.source)]
    )
    return list(dict.fromkeys(lines))


#: Code that runs the product without being part of it: it must not import the tests either.
BENCHMARKS = "bench"


def imports_of_tests(root: Path, packages: Sequence[str] = (*LAYERS, BENCHMARKS)) -> list[str]:
    """Imports of a test module (a ``tests`` package anywhere in the name) from outside the tests.

    Every import counts, late ones too (``bench/`` imported its harnesses inside
    functions); the tests themselves may import anything.
    """
    lines: list[str] = []
    for source, path in project_modules(root, packages).items():
        lines += [
            f"{source}:{lineno} imports {name}"
            for lineno, name in imported_names(source, path)
            if "tests" in name.split(".")
        ]
    return list(dict.fromkeys(lines))


def module_cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop."""
    return sorted(
        sorted(component)
        for component in nx.strongly_connected_components(graph)
        if len(component) > 1
    )


def package_cycles(edges: Iterable[Import]) -> list[list[str]]:
    """Groups of top-level packages that import each other."""
    graph: nx.DiGraph = nx.DiGraph()
    for e in edges:
        if _package(e.source) != _package(e.target):
            graph.add_edge(_package(e.source), _package(e.target))
    return module_cycles(graph)
