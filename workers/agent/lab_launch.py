"""How a session's worker runs JupyterLab (launcher ``session``): its command line and
variables (pure; ``workers.agent.processes`` starts it like any program, in the sandbox).

Jupyter comes from the node's base layer: the agent's interpreter (``AgentConfig.python``)
has ``jupyterlab`` (a dependency of the project), so the server and the kernels it starts
(``sys.executable``) run on the same Python as any training program, with the job's
environment first on ``PYTHONPATH`` (``programs.with_environment``): ``import torch`` in a
cell finds the environment's torch if it brings one, else the node's.

The server listens on ``lab.sock`` in the worker's scratch folder (its HOME, where it runs)
and nowhere else; its token comes in ``JUPYTER_TOKEN`` (an environment variable, not the
command line: ``ps`` and the log's first line show command lines); the relay
(``workers.agent.lab_relay``) keeps it.  The rank-0 worker of a session runs the lab; a
session's other workers hold their GPUs with a process that waits (``hold_argv``).
"""

from __future__ import annotations

import secrets
from pathlib import Path

TOKEN_BYTES = 24


def new_token() -> str:
    """A fresh random token for one lab (48 hexadecimal digits)."""
    return secrets.token_hex(TOKEN_BYTES)


def lab_argv(python: str, base_url: str, home: Path) -> list[str]:
    """JupyterLab on ``lab.sock`` (relative: the worker runs in ``home``), rooted at ``home``,
    served under ``base_url``; no browser, no TCP port, no origin but none, no update check,
    no news feed (nodes may be offline)."""
    return [
        python, "-m", "jupyterlab",
        "--no-browser",
        "--allow-root",  # uid 0 inside a user namespace is no root of the node
        "--ServerApp.sock=lab.sock",
        "--ServerApp.sock_mode=0600",
        f"--ServerApp.root_dir={home}",
        f"--ServerApp.base_url={base_url}",
        "--ServerApp.allow_origin=",
        "--ServerApp.allow_remote_access=False",
        "--ServerApp.password=",
        "--ServerApp.quit_button=False",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=None",  # no news feed fetched, nor offered
    ]  # fmt: skip


def lab_env(home: Path, token: str) -> dict[str, str]:
    """Jupyter's own variables: its token, and every folder of its below ``home``."""
    return {
        "JUPYTER_TOKEN": token,
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / ".local" / "share" / "jupyter" / "runtime"),
        "IPYTHONDIR": str(home / ".ipython"),
    }


def hold_argv(python: str) -> list[str]:
    """What a session's worker other than rank 0 runs: nothing, until it is stopped."""
    return [python, "-I", "-S", "-c", "import signal\nwhile True: signal.pause()"]
