"""The rules of direction hold for the project, and the checker would catch a break."""

from __future__ import annotations

from pathlib import Path

from tests.architecture.imports import (
    LAYERS,
    import_graph,
    imports_of_tests,
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


def test_no_package_and_no_benchmark_imports_the_tests() -> None:
    assert imports_of_tests(ROOT) == []


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
            "jobs/services.py": "from jobs.live import snapshots\n",
            "jobs/live/__init__.py": "",
            "jobs/live/snapshots.py": "def f():\n    from jobs.services import x  # late\n",
            "jobs/models.py": "",
        },
    )
    graph, edges = import_graph(tmp_path, ("jobs",))
    assert module_cycles(graph) == [["jobs.live.snapshots", "jobs.services"]]
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


def test_planted_imports_of_the_tests_are_found_late_relative_or_nested(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/live.py": "def f():\n    from tests.browser.harness import Server  # late\n",
            "workers/__init__.py": "",
            "workers/elastic/__init__.py": "",
            "workers/elastic/run.py": "from ..tests import s3_server\nimport workers.tests.bundles\n",
            "workers/tests/__init__.py": "",
            "workers/tests/test_x.py": "from tests.conftest import job_body\n",  # a test may
            "devtools/__init__.py": "from tests import conftest\n",
        },
    )
    assert imports_of_tests(tmp_path, ("workers", "devtools", "bench")) == [
        "workers.elastic.run:1 imports workers.tests.s3_server",
        "workers.elastic.run:2 imports workers.tests.bundles",
        "devtools:1 imports tests.conftest",
        "bench.live:2 imports tests.browser.harness.Server",
    ]


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
