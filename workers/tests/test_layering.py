"""The agent and the elastic runtime run on a GPU server without the Django project.

Each check runs in a fresh interpreter with no Django settings, where the
portal's packages (and Django itself) cannot be imported, as on a server that
has only ``workers/`` and its libraries installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FORBIDDEN = ("django", "portal", "jobs")

# Refuses the forbidden packages the way a missing package would (libraries that
# merely probe for Django, like kombu's JSON encoder, then carry on without it).
PROBE = """
import importlib, importlib.abc, sys
FORBIDDEN = {forbidden!r}

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
for module in {modules!r}:
    importlib.import_module(module)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
assert not leaked, leaked
sys.stdout.write("ok\\n")
"""

AGENT_MODULES = [
    "workers.agent.service",
    "workers.agent.client",
    "workers.agent.celery_app",
    "workers.protocol",
]
RUNTIME_MODULES = [
    "workers.elastic.worker",
    "workers.elastic.runtime",
    "workers.elastic.context",
    "workers.elastic.leader",
    "workers.elastic.control",
]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO")}
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    return env


@pytest.mark.parametrize("modules", [AGENT_MODULES, RUNTIME_MODULES], ids=["agent", "runtime"])
def test_imports_no_django_project_code(modules: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(forbidden=FORBIDDEN, modules=modules)],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_agent_command_line_runs_without_django_settings() -> None:
    """``python -m workers.agent`` parses and configures itself from REDIS_URL alone."""
    env = _clean_env()
    proc = subprocess.run(
        [sys.executable, "-m", "workers.agent", "--node", "bad node", "--cpu"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: --node must be")
    env.pop("REDIS_URL")
    env.pop("CELERY_BROKER_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "workers.agent", "--node", "n1", "--cpu", "--gpus", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: REDIS_URL is not set: the agent needs the job store"
