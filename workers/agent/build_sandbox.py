"""An environment build in the job's sandbox, with the operator's index as its only network.

Building a job's environment runs code the job chose: a source package's
build backend or ``setup.py`` runs while uv resolves and installs it.  So
each uv command of a build (``workers.agent.environments``) runs as the
job's programs do (``workers.agent.sandbox``): under bubblewrap, as the
job's own uid under a root agent, with the sandbox's rlimits, cgroups and
system-call filter, the host read-only and the portal's data, the
repository, other bundles and every environment hidden.  What it may write
is its build's ``site`` and ``work`` directories, and its ``/tmp``.

Its network is a namespace of its own with loopback only.  When the
operator's index is remote, the agent opens an ``IndexProxy`` on a Unix
socket bound into the sandbox, and ``workers/build_relay.py`` (the sandbox's
first process) listens on ``127.0.0.1:3128`` for uv and carries each
connection to it: the proxy reaches the index's hosts and nothing else (not
the portal, not loopback services, not the metadata address).  A local
index (``ENVIRONMENT_NO_INDEX`` with a wheel directory) needs no network.

When the build ends, every process of it has ended (its pid namespace and
cgroups), and the agent takes its directories back (``reclaim``: owner
changed without following a link, set-id bits dropped) before it reads or
writes anything there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from workers.agent import limits, seccomp
from workers.agent.config import REPO_ROOT, AgentConfig
from workers.agent.environments import BuildTimeout
from workers.agent.index_proxy import IndexProxy, allowed_hosts
from workers.agent.programs import confined
from workers.agent.sandbox import (
    BUILDER_ENV,
    Identity,
    args_payload,
    bwrap_argv,
    bwrap_binary,
    env_args,
    hand_over,
    job_identity,
    memory_file,
)

log = logging.getLogger(__name__)

RELAY_PORT = 3128
"""Where uv finds its proxy inside the build's network namespace (its own loopback)."""
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
RELAY = REPO_ROOT / "workers" / "build_relay.py"


class SandboxedBuilds:
    """``BuildRunner`` that runs each uv command of a build in the job's sandbox."""

    sandboxed = True

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        settings = config.environment_settings()
        self.allowed = allowed_hosts(
            settings.index_url,
            settings.extra_index_urls,
            settings.find_links,
            settings.no_index,
            settings.network_allow,
        )
        """The hosts the proxy reaches (none: the build gets no network at all)."""
        self.upstream = _upstream_proxy(os.environ)

    def identity(self, job: str) -> Identity | None:
        """The job's uid under a root agent (the same its programs run as); None otherwise."""
        if os.geteuid() != 0:
            return None
        settings = self.config.sandbox
        return job_identity(job, settings.uid_base, settings.uid_count)

    def run(
        self,
        job: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: Path,
        writable: tuple[Path, ...],
        timeout_s: float,
        job_indexes: tuple[str, ...] = (),
    ) -> tuple[int, str]:
        """Run ``argv`` in ``job``'s sandbox (see the module docstring and
        ``BuildRunner.run``); the job's own indexes' hosts are reached only at public
        addresses."""
        identity = self.identity(job)
        env = {k: v for k, v in env.items() if k.upper() not in PROXY_VARIABLES}
        door = self._door_dir()
        try:
            if identity is not None:
                _hand_over_trees(writable, identity)
            public = allowed_hosts("", job_indexes, "", True) - self.allowed
            if not self.allowed and not public:
                return self._sandboxed(job, list(argv), env, cwd, writable, (), identity, timeout_s)
            socket_path = door / "proxy.sock"
            owner = (identity.uid, identity.gid) if identity is not None else None
            proxy_url = f"http://127.0.0.1:{RELAY_PORT}"
            env.update(dict.fromkeys(PROXY_VARIABLES[:3], proxy_url))
            relayed = [
                self.config.python,
                "-I",
                str(RELAY),
                str(socket_path),
                str(RELAY_PORT),
                "--",
            ]
            allowed = self.allowed | public
            with IndexProxy(socket_path, allowed, owner, self.upstream, public) as proxy:
                code, output = self._sandboxed(
                    job, [*relayed, *argv], env, cwd, writable, (door,), identity, timeout_s
                )
            if proxy.refused:
                output += "".join(f"refused by the build's proxy: {r}\n" for r in proxy.refused)
            return code, output
        finally:
            reclaim(writable)
            with contextlib.suppress(OSError):
                os.rmdir(door)

    def _local_index(self) -> list[Path]:
        """The operator's index directories on this host (a wheel directory, ``file://``
        URLs): bound back read-only where the sandbox would hide them."""
        settings = self.config.environment_settings()
        out = []
        for location in (settings.find_links, settings.index_url, *settings.extra_index_urls):
            path = location.removeprefix("file://")
            if path and "://" not in path and Path(path).is_dir():
                out.append(Path(path).resolve())
        return out

    def _door_dir(self) -> Path:
        """A fresh directory of the agent's for the proxy's socket, under the system's
        temporary directory: a Unix socket's path must stay short (108 bytes), whatever
        ``ENVIRONMENT_CACHE_DIR`` is; programs never see it (their ``/tmp`` is their own)."""
        door = Path(tempfile.mkdtemp(prefix="portal-build-"))
        os.chmod(door, 0o711)
        return door

    def _sandboxed(
        self,
        job: str,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        writable: tuple[Path, ...],
        read_only: tuple[Path, ...],
        identity: Identity | None,
        timeout_s: float,
    ) -> tuple[int, str]:
        config, settings = self.config, self.config.sandbox
        mounts = confined(
            config,
            cwd,
            writable,
            repo_root=REPO_ROOT,
            base_prefix=Path(sys.base_prefix),
            home=Path("/root"),
            devices=(),
            shm_dir=cwd,
        )
        local_index = tuple(self._local_index())
        mounts = replace(
            mounts, shm_dir=None, read_only=(*mounts.read_only, *read_only, *local_index)
        )
        name = f"portal-{config.node}-{job}-build-{uuid.uuid4().hex[:8]}"
        cgroups = limits.create_cgroups(settings, name)
        preexec = limits.preexec(settings, cgroups, address_space=config.device == "cpu")
        args_fd = memory_file("build-args", args_payload(env_args(env)))
        rules = seccomp.filter_for()
        seccomp_fd = memory_file("build-seccomp", rules) if rules is not None else None
        fds = (args_fd,) if seccomp_fd is None else (args_fd, seccomp_fd)
        full = bwrap_argv(
            settings.bwrap or bwrap_binary(),
            mounts,
            argv,
            cwd=cwd,
            die_with_parent=True,
            identity=identity,
            args_fd=args_fd,
            seccomp_fd=seccomp_fd,
            unshare_net=True,
        )
        try:
            popen = subprocess.Popen(
                full,
                env=dict(BUILDER_ENV),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        try:
            output, _ = popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BuildTimeout(job) from None
        finally:
            _end(popen, cgroups)
            for path in cgroups.values():
                limits.remove_cgroup(path)
        reason = limits.exit_reason(settings, popen.returncode, "", cgroups)
        text = output.decode("utf-8", errors="replace")
        return popen.returncode, text + (f"the build's sandbox: {reason}\n" if reason else "")


def _hand_over_trees(paths: Sequence[Path], identity: Identity) -> None:
    """Give the build's uid its directories and what an earlier command of the same build
    left in them (its uv cache), without following a link."""
    for root in paths:
        hand_over((root,), identity)
        for current, dirs, files in os.walk(root):
            hand_over([Path(current, name) for name in (*dirs, *files)], identity)


def reclaim(paths: Sequence[Path]) -> None:
    """Give ``paths`` and everything under them back to the agent: owner changed without
    following a link, set-id and write-by-others bits dropped (the build's uid owned them)."""
    me = (os.geteuid(), os.getegid())
    for root in paths:
        if not root.is_dir() or root.is_symlink():
            continue
        for current, dirs, files in os.walk(root):
            for name in (*dirs, *files, ""):
                path = os.path.join(current, name) if name else current
                info = os.lstat(path)
                if (info.st_uid, info.st_gid) != me:
                    os.chown(path, *me, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    os.chmod(path, stat.S_IMODE(info.st_mode) & 0o755 | 0o700)
                elif not stat.S_ISLNK(info.st_mode):
                    os.chmod(path, stat.S_IMODE(info.st_mode) & 0o755 | 0o600)


def _end(popen: subprocess.Popen[bytes], cgroups: Mapping[str, Path]) -> None:
    """Kill what is left of a build (its session, its cgroups' members) and reap it."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, 9)
    for pid in limits.members(cgroups.values()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    popen.wait()


def _upstream_proxy(environ: Mapping[str, str]) -> str | None:
    """The operator's own proxy (``HTTPS_PROXY``, ``http://host:port``), as the index
    proxy's ``upstream`` (``host:port``) for its tunnels."""
    value = environ.get("HTTPS_PROXY") or environ.get("https_proxy")
    if not value:
        return None
    return urlsplit(value if "//" in value else f"//{value}").netloc.rpartition("@")[2] or None
