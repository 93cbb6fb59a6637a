"""Who may write a job: ``jobs.lifecycle``, ``jobs.holdings``, ``jobs.services`` and the
writers of its outputs (``jobs.logs.store``, ``jobs.artifacts``, ``jobs.training_metrics``) only.

Two checks, because Django offers two kinds of writes:

* statically, no other module of our apps calls a write method (``create``,
  ``bulk_create``, ``update``, ``delete``, ...) on a job model's manager or
  queryset — these send no signals, so only the source can tell;
* at run time, every ``save()`` or ``delete()`` of a job model instance
  comes from one of the writer modules (a ``pre_save``/``pre_delete`` guard
  that the test suite installs for every test).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

WRITERS = frozenset(
    {
        "jobs.lifecycle",
        "jobs.holdings",
        "jobs.services",
        "jobs.logs.store",
        "jobs.artifacts",
        "jobs.training_metrics",
    }
)
JOB_MODELS = frozenset(
    {
        "Job",
        "JobEvent",
        "JobGpu",
        "JobCable",
        "JobMetric",
        "LogChunk",
        "LogStream",
        "Artifact",
        "TrainingMetric",
    }
)
WRITE_METHODS = frozenset(
    {
        "save",
        "delete",
        "create",
        "bulk_create",
        "bulk_update",
        "update",
        "get_or_create",
        "update_or_create",
    }
)
APP_PACKAGES = (
    "utilities",
    "audit",
    "tenancy",
    "inventory",
    "bundles",
    "jobs",
    "control",
    "notifications",
    "portal",
)
SETUP_PACKAGES = ("tests", "bench", "conftest")  # fixtures may build rows directly


class ForbiddenWrite(AssertionError):
    """A job model was written by a module that is not one of the writers."""


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def static_writes(source: str, module: str) -> list[str]:
    """Write calls on a job model's manager/queryset in ``source`` (module ``module``)."""
    if module in WRITERS:
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITE_METHODS
            and _root_name(node.func.value) in JOB_MODELS
        ):
            found.append(f"{module}:{node.lineno} {ast.unparse(node.func)}(...)")
    return found


def project_writes(root: Path, packages: Iterable[str] = APP_PACKAGES) -> list[str]:
    """Every forbidden static write in the apps' modules (migrations and tests excluded)."""
    found: list[str] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "tests" in parts or "migrations" in parts:
                continue
            module = ".".join(p for p in parts if p != "__init__")
            found += static_writes(path.read_text(), module)
    return found


def first_app_module(frame: FrameType | None) -> str | None:
    """The innermost calling module that belongs to our apps or to tests (None if none)."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.split(".", 1)[0] in (*APP_PACKAGES, *SETUP_PACKAGES):
            return name
        frame = frame.f_back
    return None


def guard(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Signal receiver: refuse a job model write that does not come from a writer module."""
    if sender.__name__ not in JOB_MODELS:
        return
    caller = first_app_module(sys._getframe(1))
    if caller is None or caller in WRITERS or caller.split(".", 1)[0] in SETUP_PACKAGES:
        return
    raise ForbiddenWrite(f"{caller} wrote a {sender.__name__}; only {sorted(WRITERS)} may")
