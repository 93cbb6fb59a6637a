"""Which ``do_*`` service functions write an audit row, read from source with ``ast``.

A function counts as audited when it calls ``audit.services.record`` itself,
or calls (directly or through other functions of its module) a function of its
module that does: ``do_issue_token`` is audited through ``do_create_token``,
``do_upload`` through ``_insert``.  The name ``record`` alone is not enough
(``jobs.lifecycle.record`` writes job events): the call must resolve, through
the module's imports, to ``audit.services.record``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

AUDIT_MODULE = "audit.services"
RECORD = "record"


@dataclass(frozen=True)
class ServiceFunction:
    """One public ``do_*`` function of a service module, and whether it is audited."""

    qualname: str  # e.g. "jobs.services.do_cancel_job"
    audited: bool


def _record_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Local names bound to ``record`` itself, and dotted names bound to ``audit.services``."""
    direct: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            for alias in node.names:
                if node.module == AUDIT_MODULE and alias.name == RECORD:
                    direct.add(alias.asname or alias.name)
                elif node.module == "audit" and alias.name == "services":
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == AUDIT_MODULE:
                    modules.add(alias.asname or AUDIT_MODULE)
    return direct, modules


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _calls(function: ast.AST) -> Iterable[str]:
    """The dotted names that ``function`` calls."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is not None:
                yield name


def service_functions(source: str, module: str) -> list[ServiceFunction]:
    """The public ``do_*`` functions of ``module`` (its source) and whether each is audited."""
    tree = ast.parse(source)
    direct, modules = _record_names(tree)
    record_calls = direct | {f"{m}.{RECORD}" for m in modules}
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    callees = {name: set(_calls(node)) for name, node in functions.items()}
    audited = {name for name, called in callees.items() if called & record_calls}
    grew = True
    while grew:  # through the module's own helpers, to a fixed point
        more = {name for name, called in callees.items() if called & audited} - audited
        audited |= more
        grew = bool(more)
    return [
        ServiceFunction(f"{module}.{name}", name in audited)
        for name in functions
        if name.startswith("do_")
    ]


def service_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every ``*services.py`` module of ``packages`` (tests and migrations excluded)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*services.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "tests" in parts or "migrations" in parts:
                continue
            found[".".join(parts)] = path
    return found
