"""Tenants' own Python dependencies on a node: resolved against the base, built once with uv, cached.

A job's request (``workers.environment``: its ``environment`` field and what
its bundle declares) becomes a directory of installed packages that its
programs see before the node's own (``PYTHONPATH``; console scripts on
``PATH``).  The node's interpreter and its packages (torch, the ``edl``
SDK) are the **base layer**: never copied, never replaced unless the job
says so.  On disk::

    <root>/                         ENVIRONMENT_CACHE_DIR (default <data_dir>/envs)
        <key>/site/                 the installed packages, read-only; site/bin: their scripts
        <key>/manifest.json         what was asked, what was installed, the build's seconds
        .build-<key>-<nonce>/       a build under way: never used; a failed one is removed
        .locks/<key>                flock: one build of a key at a time, across agents sharing root
        .failed/<key>.json          why a key does not build: a retry is told at once, not rebuilt
        .used/<key>                 touched at each use (least recently used go first)

How a key is built (``EnvironmentCache.ensure``):

1. ``uv pip install --dry-run`` of the request against the node's own
   interpreter: uv's plan says what would be installed beyond the base, and
   which base packages would change.  A change of a base package the job
   did not list in ``replace`` fails the build, naming it and both versions
   (``plan_of``, ``replaced``), so a dependency that would quietly swap the
   node's torch or numpy is caught, not only a direct pin.
2. ``uv pip install --target <build>/site --no-deps`` of exactly that plan.
3. The manifest is written, the tree made read-only, the directory renamed
   to ``<key>`` (atomic): a crash leaves a ``.build-`` directory, never a
   half-built key.

**Built like tenant code, because it is.**  Resolving a source distribution
runs its build backend (``setup.py``...).  Both uv runs go through a
``BuildRunner``: on a sandboxed node ``workers.agent.build_sandbox``, which
runs uv in the job's sandbox (its uid, its limits, a network namespace whose
only way out is a proxy to the operator's index); ``HostBuilds`` (plain
``subprocess``) only where the operator turned the sandbox off.  What the
build may write is ``<build>/site`` and ``<build>/work`` (its uv cache and
HOME, private to this build, removed after it): never the agent's manifest,
never another key.  The index and its credentials are the operator's
(``EnvironmentSettings``), never the job's: uv runs with an environment the
agent makes, ignores configuration files, and never downloads an
interpreter.  A failure is remembered for ``failure_memory_s`` (a retry of
the job is told at once, not rebuilt; after that a new try builds, in case
the index was down).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from packaging.utils import canonicalize_name

from workers.agent.quota import measure
from workers.bundle import remove_tree
from workers.environment import (
    BUNDLE_FILES,
    MAX_FILE_BYTES,
    EnvironmentSpec,
    base_conflicts,
    bundle_requirements,
    check_environment,
    environment_key,
)
from workers.program import ProgramError
from workers.protocol import EnvironmentUsed

log = logging.getLogger(__name__)

TAIL_LINES = 20
KEY_PATTERN = re.compile(r"[0-9a-f]{32}")
"""What an environment key looks like (``environment_key``): anything else names no entry."""
"""How many of uv's last lines a failed build's reason keeps."""


@dataclass(frozen=True)
class EnvironmentSettings:
    """Where environments are built and from which index (the operator's, never a job's).

    ``ENVIRONMENT_CACHE_DIR`` (default ``<data_dir>/envs``; may be shared by
    nodes), ``ENVIRONMENT_CACHE_MAX_GB`` (50), ``ENVIRONMENT_INDEX_URL`` (uv's
    default index, PyPI, when unset), ``ENVIRONMENT_EXTRA_INDEX_URLS``
    (space-separated), ``ENVIRONMENT_FIND_LINKS`` (a local wheel directory),
    ``ENVIRONMENT_BUILD_TIMEOUT_SECONDS`` (900), ``ENVIRONMENT_NETWORK_ALLOW``
    (space-separated ``host[:port]``).
    """

    root: Path
    max_bytes: int = 50 * 2**30
    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()
    find_links: str = ""
    no_index: bool = False
    timeout_s: float = 900.0
    network_allow: tuple[str, ...] = ()
    """``ENVIRONMENT_NETWORK_ALLOW``: more ``host[:port]`` a build may reach (an index's
    file host), beyond the hosts of the index URLs."""
    failure_memory_s: float = 3600.0
    """How long a key that did not build is refused without a new build."""
    allow_job_index: bool = False
    """``ENVIRONMENT_ALLOW_JOB_INDEX``: whether a job's own ``indexes`` are used on this node
    (after the operator's, before the default index; their hosts must resolve to public
    addresses); otherwise such a job fails, saying so."""


@dataclass(frozen=True)
class BaseLayer:
    """The node's interpreter and its installed packages, which every environment builds on."""

    python: str
    """``major.minor`` of the interpreter programs run on."""
    executable: str
    packages: Mapping[str, str] = field(default_factory=dict)
    """Canonical name → installed version."""

    @property
    def fingerprint(self) -> str:
        """What a build depends on of the base: interpreter, machine, every package's version."""
        listing = "\n".join(f"{name}=={self.packages[name]}" for name in sorted(self.packages))
        text = f"{self.python} {platform.machine()}\n{listing}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def running(cls) -> BaseLayer:
        """The base layer of this interpreter (the agent's, which programs run on)."""
        packages: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                packages[str(canonicalize_name(name))] = dist.version
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        return cls(python=python, executable=sys.executable, packages=packages)


@dataclass(frozen=True)
class Environment:
    """A built environment: where it is, and what a job's event says of it."""

    key: str
    path: Path
    packages: tuple[str, ...]
    """``name==version`` of what it installed beyond the base."""
    hit: bool
    build_s: float

    @property
    def site(self) -> Path:
        """What goes first on the program's ``PYTHONPATH``."""
        return self.path / "site"

    @property
    def scripts(self) -> Path:
        """Its packages' console scripts (first on the program's ``PATH``)."""
        return self.site / "bin"

    def used(self) -> EnvironmentUsed:
        """What ``Started`` says of it (and the job's history shows)."""
        return EnvironmentUsed(
            key=self.key,
            hit=self.hit,
            build_s=0.0 if self.hit else self.build_s,
            packages=self.packages,
        )


class _BuildDirs:
    """A build's directories: ``site`` (what it installs) and ``work`` (its uv cache, HOME,
    the request), both writable by the build; the directory itself stays the agent's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.site = path / "site"
        self.work = path / "work"
        for made in (self.site, self.work):
            made.mkdir(mode=0o755)


class EnvironmentFailed(RuntimeError):
    """A request that does not build; ``reason`` is what the job's failure says."""

    def __init__(self, key: str, reason: str, *, known: bool = False) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason
        self.known = known
        """Whether an earlier build of the same key had already failed (not rebuilt)."""


def requested(environment: Mapping[str, object], code_dir: Path) -> EnvironmentSpec:
    """What a program asks for: its bundle's declared requirements, then its job's own.

    The bundle's files are tenant content: read without following a link, at
    most ``MAX_FILE_BYTES`` each.  A bad request raises EnvironmentFailed.
    """
    files = {}
    for name in BUNDLE_FILES:
        try:
            fd = os.open(code_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise EnvironmentFailed("", f"{name}: cannot be read ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise EnvironmentFailed("", f"{name}: not a regular file")
            files[name] = handle.read(MAX_FILE_BYTES + 1)
    try:
        return check_environment(environment or None).with_bundle(bundle_requirements(files))
    except ProgramError as exc:
        raise EnvironmentFailed("", str(exc)) from None


# --------------------------------------------------------------------------- uv's plan

PLAN_LINE = re.compile(r"^ ([+\-~]) ([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+)$")
WOULD = re.compile(r"^Would (install|uninstall) (\d+) packages?$")


@dataclass(frozen=True)
class Plan:
    """What ``uv pip install --dry-run`` would do to the base: install and remove."""

    install: tuple[tuple[str, str], ...] = ()
    remove: tuple[tuple[str, str], ...] = ()


def plan_of(output: str) -> Plan:
    """Parse uv's dry-run output (`` + name==version`` / `` - name==version`` lines).

    Raises ValueError when the counts uv announces do not match the lines read
    (an output this parser does not understand is never taken for "nothing").
    """
    install: list[tuple[str, str]] = []
    remove: list[tuple[str, str]] = []
    announced = {"install": 0, "uninstall": 0}
    for line in output.splitlines():
        if match := WOULD.match(line.strip()):
            announced[match.group(1)] = int(match.group(2))
        elif match := PLAN_LINE.match(line.rstrip()):
            sign, name, version = match.groups()
            (remove if sign == "-" else install).append((str(canonicalize_name(name)), version))
    if (len(install), len(remove)) != (announced["install"], announced["uninstall"]):
        raise ValueError(f"uv's plan could not be read:\n{output}")
    return Plan(tuple(install), tuple(remove))


def replaced(plan: Plan, spec: EnvironmentSpec) -> list[str]:
    """Why each base package the plan would change, and the job did not allow, is refused."""
    new = dict(plan.install)
    return [
        f"the requirements would replace the node's {name} {old} with {new.get(name, 'nothing')}: "
        f"jobs build on the node's {name}; pin a compatible version, or list {name!r} in "
        "environment.replace to install another"
        for name, old in plan.remove
        if name not in spec.replace
    ]


# --------------------------------------------------------------------------- where uv runs


class BuildTimeout(RuntimeError):
    """A build ran past its time and was ended."""


class BuildRunner(Protocol):
    """Runs one uv command of a job's build (``workers.agent.build_sandbox``: in its sandbox)."""

    sandboxed: bool
    """Whether what it runs is confined: only then may a build run a package's own code
    (a source distribution's build backend); otherwise wheels only."""

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
        """Run ``argv`` for ``job`` with ``env``, writing only ``writable``; its exit status
        and output (stdout and stderr).  Raises BuildTimeout past ``timeout_s``.  When it
        returns, ``writable`` and all in it belong to the agent again.  ``job_indexes``:
        the job's own index URLs, which its build may reach too."""
        ...


class HostBuilds:
    """uv as a plain child of the agent, where the operator turned the sandbox off: wheels
    only (installing a wheel runs none of its code), so no package's code runs unconfined."""

    sandboxed = False

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
        """``argv`` under ``subprocess`` (see ``BuildRunner.run``)."""
        try:
            done = subprocess.run(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BuildTimeout(job) from None
        return done.returncode, done.stdout


# --------------------------------------------------------------------------- the cache


class EnvironmentCache:
    """Build, find and evict environments under ``settings.root`` (see the module docstring)."""

    def __init__(
        self,
        settings: EnvironmentSettings,
        base: BaseLayer | None = None,
        runner: BuildRunner | None = None,
    ) -> None:
        self.settings = settings
        self.root = settings.root
        self._base = base
        self.runner: BuildRunner = runner or HostBuilds()
        """Where uv runs (``workers.agent.build_sandbox.SandboxedBuilds`` on a sandboxed node)."""
        self._sizes: dict[str, tuple[tuple[int, int], int]] = {}
        """Each complete environment's bytes, by key, with the (inode, change time) of its
        directory when measured: a complete environment is read-only and never changes, so
        it is walked once, not on every report or eviction (``entries``)."""

    @functools.cached_property
    def base(self) -> BaseLayer:
        """The node's base layer (read once, when a job first asks for an environment)."""
        return self._base or BaseLayer.running()

    def key(self, spec: EnvironmentSpec) -> str:
        """The key ``spec`` builds under on this node's base."""
        return environment_key(spec, self.base.fingerprint)

    def ready(self, key: str) -> Path | None:
        """The environment of ``key`` if it is complete (its manifest is the last thing written)."""
        path = self.root / key
        return path if (path / "manifest.json").is_file() else None

    def ensure(
        self, spec: EnvironmentSpec, out: IO[str] | None = None, *, job: str = ""
    ) -> Environment:
        """The environment of ``spec``: from the cache, or built now for ``job`` (in its
        sandbox, its output to ``out``).

        Raises EnvironmentFailed with the reason when it does not build (and
        at once, without building, when that key failed before).
        """
        key = self.key(spec)
        found = self._found(key)
        if found is not None:
            return found
        with self._locked(key):  # a build of this key by another thread or agent ends first
            found = self._found(key)
            if found is not None:
                return found
            return self._build(key, spec, out, job)

    def _found(self, key: str) -> Environment | None:
        failed = self.root / ".failed" / f"{key}.json"
        if failed.is_file():
            remembered = json.loads(failed.read_text())
            if time.time() - remembered["at"] < self.settings.failure_memory_s:
                raise EnvironmentFailed(key, remembered["reason"], known=True)
            failed.unlink(missing_ok=True)  # long ago: the index may have been down; build again
        path = self.ready(key)
        if path is None:
            return None
        manifest = json.loads((path / "manifest.json").read_text())
        self._touch(key)
        return Environment(key, path, tuple(manifest["packages"]), True, manifest["build_s"])

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / key, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _build(self, key: str, spec: EnvironmentSpec, out: IO[str] | None, job: str) -> Environment:
        started = time.monotonic()
        build = self.root / f".build-{key}-{uuid.uuid4().hex[:8]}"
        build.mkdir(parents=True)
        os.chmod(build, 0o755)
        try:
            packages = self._install(key, spec, _BuildDirs(build), out, job)
            remove_tree(build / "work")
            build_s = round(time.monotonic() - started, 3)
            manifest = {
                "key": key,
                "requirements": list(spec.requirements),
                "replace": list(spec.replace),
                "packages": list(packages),
                "base": self.base.fingerprint,
                "python": self.base.python,
                "build_s": build_s,
                "built_at": time.time(),
            }
            (build / "manifest.json").write_text(json.dumps(manifest, indent=1))
            _read_only(build)
            build.rename(self.root / key)
        except EnvironmentFailed as failed:
            self._remember_failure(key, failed.reason)
            raise
        finally:
            if build.exists():
                remove_tree(build)
        self._touch(key)
        return Environment(key, self.root / key, packages, False, build_s)

    def _install(
        self, key: str, spec: EnvironmentSpec, build: _BuildDirs, out: IO[str] | None, job: str
    ) -> tuple[str, ...]:
        if spec.python is not None and spec.python != self.base.python:
            raise EnvironmentFailed(
                key, f"the job asks for Python {spec.python}; this node runs {self.base.python}"
            )
        problems = base_conflicts(spec, self.base.packages)
        if problems:
            raise EnvironmentFailed(key, "; ".join(problems))
        if spec.indexes and not self.settings.allow_job_index:
            raise EnvironmentFailed(
                key,
                "this node does not use a job's own package index "
                "(its operator has not set ENVIRONMENT_ALLOW_JOB_INDEX)",
            )
        if spec.indexes and self.settings.no_index:
            raise EnvironmentFailed(key, "this node installs from its local wheels only")
        requested = build.work / "requirements.in"
        requested.write_text("\n".join(spec.requirements) + "\n")
        dry = self._uv(key, ["install", "--dry-run", "-r", str(requested)], spec, build, out, job)
        try:
            plan = plan_of(dry)
        except ValueError as exc:
            raise EnvironmentFailed(key, str(exc)) from None
        problems = replaced(plan, spec)
        if problems:
            raise EnvironmentFailed(key, "; ".join(problems))
        pins = [f"{name}=={version}" for name, version in plan.install]
        if pins:
            target = ["--target", str(build.site), "--no-deps"]
            self._uv(key, ["install", *target, *pins], spec, build, out, job)
        return tuple(pins)

    def _uv(
        self,
        key: str,
        args: list[str],
        spec: EnvironmentSpec,
        build: _BuildDirs,
        out: IO[str] | None,
        job: str,
    ) -> str:
        """Run ``uv pip ARGS`` against the base interpreter through the runner (the job's
        sandbox); its output (also to ``out``)."""
        indexes = self._index_args(spec.indexes)
        argv = [_uv_binary(), "pip", *args, *indexes, "--python", self.base.executable]
        argv.append("--no-progress")
        if not self.runner.sandboxed:
            argv += ["--only-binary", ":all:"]
        try:
            code, output = self.runner.run(
                job,
                argv,
                self._uv_env(build.work),
                cwd=build.work,
                writable=(build.site, build.work),
                timeout_s=self.settings.timeout_s,
                job_indexes=spec.indexes,
            )
        except BuildTimeout:
            raise EnvironmentFailed(
                key, f"the build took longer than {self.settings.timeout_s:.0f} s"
            ) from None
        if out is not None:
            for line in output.splitlines():
                out.write(f"[environment] {line}\n")
            out.flush()
        if code != 0:
            tail = "\n".join(output.strip().splitlines()[-TAIL_LINES:])
            raise EnvironmentFailed(key, f"the environment did not build:\n{tail}")
        return output

    def _index_args(self, job_indexes: tuple[str, ...] = ()) -> list[str]:
        """uv's index options: the operator's extra indexes first, then the job's (uv asks
        them in this order), the default index last."""
        args = ["--no-index"] if self.settings.no_index else []
        if self.settings.index_url:
            args += ["--default-index", self.settings.index_url]
        for url in (*self.settings.extra_index_urls, *job_indexes):
            args += ["--index", url]
        if self.settings.find_links:
            args += ["--find-links", self.settings.find_links]
        return args

    def _uv_env(self, work: Path) -> dict[str, str]:
        """uv's whole environment: nothing of a job's; HOME and uv's cache private to this
        build (``work``); the operator's proxy and certificates (the sandbox's runner puts
        its own proxy in their place)."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(work),
            "UV_CACHE_DIR": str(work / "uv-cache"),
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
        }
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        return env

    def _remember_failure(self, key: str, reason: str) -> None:
        failed = self.root / ".failed"
        failed.mkdir(parents=True, exist_ok=True)
        scratch = failed / f".{key}.{uuid.uuid4().hex[:8]}"
        scratch.write_text(json.dumps({"key": key, "reason": reason, "at": time.time()}))
        scratch.rename(failed / f"{key}.json")

    def _touch(self, key: str) -> None:
        used = self.root / ".used"
        used.mkdir(parents=True, exist_ok=True)
        (used / key).touch()

    # ------------------------------------------------------------------ eviction
    def entries(self) -> list[tuple[str, int, float]]:
        """Every complete environment: (key, bytes, last use), least recently used first."""
        out = []
        for path in self.root.iterdir() if self.root.is_dir() else ():
            if path.name.startswith(".") or self.ready(path.name) is None:
                continue
            used = self.root / ".used" / path.name
            made = path.stat()
            last = used.stat().st_mtime if used.exists() else made.st_mtime
            out.append((path.name, self._size(path, (made.st_ino, made.st_ctime_ns)), last))
        return sorted(out, key=lambda entry: entry[2])

    def _size(self, path: Path, stamp: tuple[int, int]) -> int:
        """The bytes of the complete environment ``path``, measured once per ``stamp``."""
        known = self._sizes.get(path.name)
        if known is not None and known[0] == stamp:
            return known[1]
        held = measure((path,), max_bytes=sys.maxsize, max_entries=sys.maxsize).bytes
        self._sizes[path.name] = (stamp, held)
        return held

    def evict(self, in_use: Iterable[str] = ()) -> list[str]:
        """Remove least recently used environments until the cache fits ``max_bytes``;
        never one in ``in_use``.  Returns the keys removed."""
        busy = {key for key in in_use if self.ready(key) is not None}
        for key in busy:  # in use here: recently used, for agents that share the cache too
            self._touch(key)
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for key, size, _ in entries:
            if total <= self.settings.max_bytes:
                break
            if key in busy:
                continue
            self.remove(key)
            total -= size
            removed.append(key)
        return removed

    def remove(self, key: str) -> bool:
        """Remove the environment of ``key`` (an admin's eviction, or the LRU's) and
        forget that it failed; False when there was nothing under that key.  A build
        of the key under way ends first (the lock).  The caller keeps keys in use."""
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"not an environment key: {key!r}")
        with self._locked(key):
            path = self.root / key
            found = path.is_dir() and not path.is_symlink()
            if found:
                remove_tree(path)
            failed = self.root / ".failed" / f"{key}.json"
            found = found or failed.is_file()
            failed.unlink(missing_ok=True)
        (self.root / ".used" / key).unlink(missing_ok=True)
        return found


def _uv_binary() -> str:
    from uv import find_uv_bin  # the uv wheel, a dependency of the project

    return str(find_uv_bin())


def _read_only(root: Path) -> None:
    """Make a built tree read-only for everyone but keep it readable and walkable."""
    for current, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(current, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o555 if mode & 0o111 else 0o444)
        os.chmod(current, 0o555)
