"""The rules of direction hold for the project, and the checker would catch a break."""

from __future__ import annotations

from pathlib import Path

from tests.architecture.imports import (
    LAYERS,
    import_graph,
    module_cycles,
    package_cycles,
    upward_imports,
)

ROOT = Path(__file__).resolve().parents[2]


def test_no_upward_imports() -> None:
    _, edges = import_graph(ROOT)
    assert upward_imports(edges) == []


def test_no_cycles_between_packages_or_modules() -> None:
    graph, edges = import_graph(ROOT)
    assert package_cycles(edges) == []
    assert module_cycles(graph) == []


def test_every_project_package_has_a_ring() -> None:
    """A new top-level package must be placed in LAYERS (and so in the rules)."""
    ours = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in {"tests", "bench"}
    }
    assert ours == set(LAYERS)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_cycle_is_found_even_through_a_late_import(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "jobs/__init__.py": "",
            "jobs/services.py": "from jobs.control import tick\n",
            "jobs/control/__init__.py": "",
            "jobs/control/tick.py": "def f():\n    from jobs.services import x  # late\n",
            "jobs/models.py": "",
        },
    )
    graph, edges = import_graph(tmp_path, ("jobs",))
    assert module_cycles(graph) == [["jobs.control.tick", "jobs.services"]]
    assert upward_imports(edges, ("jobs",)) == []


def test_a_planted_upward_import_and_package_cycle_are_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "tenancy/__init__.py": "",
            "tenancy/models.py": "from jobs.models import Job\n",
            "jobs/__init__.py": "",
            "jobs/models.py": "from tenancy import models\n",
        },
    )
    graph, edges = import_graph(tmp_path, ("tenancy", "jobs"))
    assert upward_imports(edges, ("tenancy", "jobs")) == [
        "tenancy.models:1 imports jobs.models (jobs is above tenancy)"
    ]
    assert package_cycles(edges) == [["jobs", "tenancy"]]
    assert module_cycles(graph) == [["jobs.models", "tenancy.models"]]


def test_relative_imports_resolve(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "fabric/__init__.py": "",
            "fabric/a.py": "from . import b\n",
            "fabric/b.py": "from .a import thing\n",
        },
    )
    graph, _ = import_graph(tmp_path, ("fabric",))
    assert module_cycles(graph) == [["fabric.a", "fabric.b"]]
