"""The messages between the control plane and the node agents.

Commands go from the control plane to one node's agent, as the Celery task
``AGENT_COMMAND_TASK`` on the queue ``agent.<node>``; reports go from agents
back to the control plane, as the Celery task ``REPORT_TASK`` on
``REPORTS_QUEUE``.  Both travel as plain JSON objects with a ``type`` key::

    {"type": "scale_in", "job": "j-42", "command_id": "c-7", "worker_ids": ["w3"]}

On the wire each message is the ``body`` of an envelope signed with the
node's key (``workers.signing``): the receiver checks the envelope first,
and only then parses the body with this module.

Every message is a frozen dataclass.  ``from_dict`` is strict: an unknown
type, an unknown or missing field, a value of the wrong type or out of range
raises ``ProtocolError`` with a message that names the field, and builds
nothing, so a bad message can change no state.  Constructing a dataclass
directly runs the same checks (JSON lists become tuples, ints become floats
where a float is expected).

Pure Python: no Django, Celery or torch, so the control plane, the agent and
tests share it freely.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from workers.catalog import WorkloadArgumentError, validate_args
from workers.environment import MAX_REQUIREMENT_CHARS, MAX_REQUIREMENTS, check_environment
from workers.outputs import (
    MAX_METRIC_POINTS,
    OutputError,
    check_job_path,
    check_sha256,
)
from workers.program import (
    Launcher,
    ProgramError,
    check_code_id,
    check_entrypoint,
    check_env,
    check_launcher,
)
from workers.runtime_events import (
    ARTIFACT_NAME_CHARS,
    SKIPPED_REASON_CHARS,
    RecoveryMode,
    event_types,
)
from workers.runtime_events import CurvePoint as CurvePoint  # part of the protocol's API
from workers.runtime_events import MetricPoint as MetricPoint  # part of the protocol's API
from workers.schema import Message, Record, at_least, check_id, check_ids, parse
from workers.schema import ProtocolError as ProtocolError  # part of the protocol's API
from workers.schema import check_name as check_name  # part of the protocol's API

AGENT_COMMAND_TASK = "agent.command"
"""Celery task name of a command; sent on ``agent_queue(node)``."""

ENVIRONMENT_KEY = re.compile(r"[0-9a-f]{32}")
MAX_BUILD_S = 86_400.0
MAX_ENVIRONMENT_PACKAGES = 1000
MAX_PACKAGE_CHARS = 200
"""Bounds of what ``Started.environment`` may say (``EnvironmentUsed``)."""

REPORT_TASK = "control.agent_report"
"""Celery task name of a report; the control plane implements it (``jobs`` app)."""

REPORTS_QUEUE = "reports"
"""Queue that reports are sent on.

Agents may push onto it, so the portal sends nothing else there, and its
workers run only ``REPORT_TASK`` from it (``portal.broker``): a taken-over
node that pushes another task's message there gets it dropped, not run.
"""

HEARTBEATS_QUEUE = "heartbeats"
"""Queue that heartbeats are sent on, beside ``REPORTS_QUEUE`` (reports only, likewise).

The report worker consumes both (``-Q heartbeats,reports,portal``), and the broker
serves a worker's queues in turn, so a heartbeat never waits behind a backlog
of progress and log reports. On one queue, a backlog longer than a
heartbeat's expiry (busy jobs on a loaded machine) let every heartbeat
expire unread, and the tick marked every live server down and requeued its
jobs.
"""

Recovery = RecoveryMode
DeviceKind = Literal["cpu", "cuda"]
ExitOutcome = Literal["clean", "stopped", "crashed", "lost"]
ArtifactKind = Literal["checkpoint", "final", "user", "log"]


def agent_queue(node: str) -> str:
    """Name of the Celery queue that the agent of ``node`` consumes."""
    return f"agent.{node}"


_REDIS_PASSWORD = re.compile(r"[0-9a-f]{64}")
"""A job's Redis password as ``workers.agent.redis_acl.derive_password`` makes it (HMAC-SHA256)."""


MAX_RANK_ORDER = 4096
"""Most workers a command's ``rank_order`` may name (a bound on what a message makes us check)."""


def check_rank_order(order: tuple[str, ...], path: str) -> None:
    """Refuse a malformed rank order: empty is "not given"; else distinct worker ids."""
    if not order:
        return
    if len(order) > MAX_RANK_ORDER:
        raise ProtocolError(f"{path} names more than {MAX_RANK_ORDER} workers")
    check_ids(order, path)


def check_outside_order(order: tuple[str, ...], workers: tuple[str, ...], path: str) -> None:
    """Refuse an order that still ranks a worker the command removes."""
    both = sorted(set(order) & set(workers))
    if both:
        raise ProtocolError(f"{path} ranks worker(s) that leave: {', '.join(both)}")


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, kw_only=True)
class WorkerSlot(Record):
    """One worker to start and the local slot (GPU index or CPU slot) it gets."""

    worker_id: str
    slot: int
    rank: int | None = None

    def validate(self) -> None:
        check_name(self.worker_id, "worker_id")
        at_least(self.slot, 0, "slot")
        at_least(self.rank, 0, "rank")


@dataclass(frozen=True, kw_only=True)
class Program(Record):
    """A tenant's program from a code bundle, and how to launch it (``workers.program``).

    ``code`` is the bundle's id (the sha256 of its archive) and ``code_path``
    the archive's path in the artifact store.  ``entrypoint`` is argv: a Python
    file of the bundle, then its arguments.  For ``launcher: torchrun``,
    ``generation`` counts the job's runs (a resize stops and starts it again),
    ``world_size`` and ``group_rank`` (this node's index) complete the torchrun
    contract, and rank 0's node answers on ``master_addr:master_port``;
    ``master_node`` names that node, whose agent gives it an address in the
    job's own network (``workers.agent.network``) where programs have one.
    ``environment`` is the job's own request (``workers.environment``: its
    requirements, Python, what it may replace; empty: the node's base layer),
    to which the agent adds what the bundle declares.
    """

    code: str
    code_path: str
    entrypoint: tuple[str, ...]
    launcher: Launcher
    env: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    world_size: int = 1
    group_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    master_node: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    home_prefix: str = ""
    """``launcher: session`` only: the store prefix of the user's persistent home
    (``jobs.sessions.home_prefix``: ``homes/<tenant slug>/<user id>/``), restored into the
    lab's HOME before it starts and synced back when it stops; empty: no persistent home."""
    home_quota_mib: int = 0
    """The most the persistent home keeps (the tenant's ``session_home_quota_mib``); 0: none."""

    def validate(self) -> None:
        try:
            check_code_id(self.code)
            check_entrypoint(self.entrypoint)
            check_launcher(self.launcher)
            object.__setattr__(self, "env", check_env(self.env))
            spec = check_environment(self.environment or None)
            object.__setattr__(self, "environment", spec.as_field())
        except ProgramError as exc:
            raise ProtocolError(f"program.{exc}") from None
        parts = self.code_path.split("/")
        if not self.code_path or self.code_path.startswith("/") or ".." in parts:
            raise ProtocolError("program.code_path must be a relative path in the store")
        at_least(self.generation, 0, "program.generation")
        at_least(self.world_size, 1, "program.world_size")
        at_least(self.group_rank, 0, "program.group_rank")
        if not 1 <= self.master_port <= 65535:
            raise ProtocolError("program.master_port must be a TCP port (1-65535)")
        check_name(self.master_addr, "program.master_addr")
        if self.master_node:
            check_name(self.master_node, "program.master_node")
        if self.home_prefix and not HOME_PREFIX.fullmatch(self.home_prefix):
            raise ProtocolError("program.home_prefix must be homes/<tenant slug>/<user id>/")
        at_least(self.home_quota_mib, 0, "program.home_quota_mib")


@dataclass(frozen=True, kw_only=True)
class Command(Message):
    """A command for one node's agent; ``command_id`` makes a replay a no-op."""

    job: str
    command_id: str

    def validate(self) -> None:
        check_name(self.job, f"{self.TYPE}.job")
        check_id(self.command_id, f"{self.TYPE}.command_id")

    @staticmethod
    def from_dict(data: Any) -> Command:
        """Parse and check a command; raise ``ProtocolError`` if it is not one."""
        command: Command = parse(data, _COMMANDS, "command")
        return command


_COMMANDS: dict[str, type[Command]] = {}
_REPORTS: dict[str, type[Report]] = {}


def _command(cls: type[Any]) -> Any:
    _COMMANDS[cls.TYPE] = cls
    return cls


def _report(cls: type[Any]) -> Any:
    _REPORTS[cls.TYPE] = cls
    return cls


HOME_PREFIX = re.compile(r"homes/[A-Za-z0-9][A-Za-z0-9_-]{0,99}/[1-9][0-9]{0,17}/")


@_command
@dataclass(frozen=True, kw_only=True)
class StartWorkers(Command):
    """Start training processes of ``job`` on this node, one per slot.

    With ``join=False`` the workers belong to the job's first generation of
    ``initial_world`` workers (possibly spread over several nodes); with
    ``join=True`` they join a running job (stop-free scale-out) and
    ``initial_world`` is not used.  Starting a worker id that already runs on
    this node does nothing.  ``checkpoint_every`` = 0 turns periodic
    checkpoints off.  ``store_prefix`` is the job's prefix in the artifact
    store (``tenants/<slug>/jobs/<pk>``): checkpoints and artifacts go there,
    so a job resumes on any node; without it (``checkpoint_dir`` unset too)
    they stay in the agent's ``<PORTAL_DATA_DIR>/checkpoints/<job>``.
    ``checkpoint_keep`` is how many periodic checkpoints are kept besides the
    final one.  ``sync_timeout_s`` is how long a
    worker waits for a peer's synchronisation before the peer counts as failed
    (the runtime's default when null).  ``rank_order`` is every worker of the
    job once this command is carried out, in the allocation's rank order (the
    runtime orders its next generation by it, survivors included); empty when
    the sender does not give it (older control planes): then only each
    started worker's ``rank`` orders the job.  ``redis_password`` is the password of
    the job's Redis user (``workers.agent.redis_acl.job_user``), which the control
    plane made: an agent logged in as its own Redis user cannot read the secret it
    derives from; absent (older control planes), an agent on the portal's user
    makes the user and derives the password itself.  Never in a log or repr.
    """

    TYPE: ClassVar[str] = "start_workers"

    workload: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    batch_size: int
    recovery: Recovery
    checkpoint_every: int
    workers: tuple[WorkerSlot, ...]
    initial_world: int | None = None
    join: bool = False
    checkpoint_dir: str | None = None
    checkpoint_minutes: float | None = None
    max_steps: int | None = None
    sync_timeout_s: float | None = None
    program: Program | None = None
    store_prefix: str | None = None
    checkpoint_keep: int = 2
    checkpoint_min_seconds: float = 0.0
    rank_order: tuple[str, ...] = ()
    redis_password: str | None = field(default=None, repr=False)

    def validate(self) -> None:
        super().validate()
        if self.redis_password is not None and not _REDIS_PASSWORD.fullmatch(self.redis_password):
            # The value is not quoted: a message may be logged.
            raise ProtocolError("start_workers.redis_password must be 64 hexadecimal digits")
        if self.program is not None:
            if self.workload or self.args:
                raise ProtocolError("start_workers: give either workload or program, not both")
        else:
            try:
                full_args = validate_args(self.workload, self.args)
            except WorkloadArgumentError as exc:
                raise ProtocolError(f"start_workers: {exc}") from None
            object.__setattr__(self, "args", dict(full_args))
        at_least(self.batch_size, 1, "start_workers.batch_size")
        at_least(self.checkpoint_every, 0, "start_workers.checkpoint_every")
        at_least(self.initial_world, 1, "start_workers.initial_world")
        at_least(self.max_steps, 1, "start_workers.max_steps")
        if self.checkpoint_minutes is not None and self.checkpoint_minutes <= 0:
            raise ProtocolError("start_workers.checkpoint_minutes must be positive")
        if self.sync_timeout_s is not None and self.sync_timeout_s <= 0:
            raise ProtocolError("start_workers.sync_timeout_s must be positive")
        if not self.workers:
            raise ProtocolError("start_workers.workers must not be empty")
        check_ids(tuple(w.worker_id for w in self.workers), "start_workers.workers.worker_id")
        slots = [w.slot for w in self.workers]
        if len(set(slots)) != len(slots):
            raise ProtocolError("start_workers.workers gives one slot to two workers")
        if not self.join and self.initial_world is None:
            raise ProtocolError("start_workers.initial_world is required unless join is true")
        if (
            self.initial_world is not None
            and not self.join
            and len(self.workers) > self.initial_world
        ):
            raise ProtocolError(
                f"start_workers: {len(self.workers)} workers do not fit an initial world "
                f"of {self.initial_world}"
            )
        if self.checkpoint_dir is not None and not self.checkpoint_dir.strip():
            raise ProtocolError("start_workers.checkpoint_dir must not be blank")
        at_least(self.checkpoint_keep, 1, "start_workers.checkpoint_keep")
        at_least(self.checkpoint_min_seconds, 0.0, "start_workers.checkpoint_min_seconds")
        if self.store_prefix is not None:
            parts = self.store_prefix.split("/")
            if len(parts) != 4 or parts[0] != "tenants" or parts[2] != "jobs":
                raise ProtocolError("start_workers.store_prefix must be tenants/<slug>/jobs/<id>")
            for part in (parts[1], parts[3]):
                check_name(part, "start_workers.store_prefix")
        self._check_rank_order()

    def _check_rank_order(self) -> None:
        order = self.rank_order
        check_rank_order(order, "start_workers.rank_order")
        if not order:
            return
        for w in self.workers:
            if w.worker_id not in order:
                raise ProtocolError(f"start_workers.rank_order does not rank worker {w.worker_id}")
            if w.rank is not None and order.index(w.worker_id) != w.rank:
                raise ProtocolError(
                    f"start_workers: worker {w.worker_id} has rank {w.rank} but place "
                    f"{order.index(w.worker_id)} in rank_order"
                )

    @property
    def worker_ids(self) -> tuple[str, ...]:
        """The ids of the workers to start, in order."""
        return tuple(w.worker_id for w in self.workers)


@_command
@dataclass(frozen=True, kw_only=True)
class ScaleIn(Command):
    """Ask the job's workers ``worker_ids`` to leave at the next agreed step.

    ``rank_order``: the workers that stay, in the new allocation's rank order
    (empty: not given, the survivors keep their ranks).
    """

    TYPE: ClassVar[str] = "scale_in"

    worker_ids: tuple[str, ...]
    reason: str = ""
    rank_order: tuple[str, ...] = ()

    def validate(self) -> None:
        super().validate()
        check_ids(self.worker_ids, "scale_in.worker_ids")
        check_rank_order(self.rank_order, "scale_in.rank_order")
        check_outside_order(self.rank_order, self.worker_ids, "scale_in.rank_order")


@_command
@dataclass(frozen=True, kw_only=True)
class Migrate(Command):
    """Move the job from ``leaving`` to the newcomers of ``joining``, in one switch.

    Sent to the node that hosts the newcomers: it asks the job to migrate and
    starts them.  The leader waits for ``joiners`` newcomers (default: those of
    ``joining``; more when other nodes start the rest with a ``start_workers``
    of ``join: true``), then switches once.  The leavers (on any node) exit
    cleanly at the switch step; their agents report that as a clean exit.
    ``rank_order``: every worker after the switch in the new allocation's rank
    order (empty: not given); ``joining`` carries the same.
    """

    TYPE: ClassVar[str] = "migrate"

    leaving: tuple[str, ...]
    joining: StartWorkers
    joiners: int | None = None
    reason: str = ""
    rank_order: tuple[str, ...] = ()

    def validate(self) -> None:
        super().validate()
        check_ids(self.leaving, "migrate.leaving")
        if self.joining.job != self.job:
            raise ProtocolError("migrate.joining.job must be the migrating job")
        if not self.joining.join:
            raise ProtocolError("migrate.joining must start newcomers (join: true)")
        if self.joiners is not None and self.joiners < len(self.joining.workers):
            raise ProtocolError("migrate.joiners must count at least the workers of joining")
        both = sorted(set(self.leaving) & set(self.joining.worker_ids))
        if both:
            raise ProtocolError(f"migrate: worker(s) both leaving and joining: {', '.join(both)}")
        check_rank_order(self.rank_order, "migrate.rank_order")
        check_outside_order(self.rank_order, self.leaving, "migrate.rank_order")
        if self.rank_order and self.joining.rank_order not in ((), self.rank_order):
            raise ProtocolError("migrate.joining.rank_order differs from migrate.rank_order")
        if self.rank_order:
            missing = [w for w in self.joining.worker_ids if w not in self.rank_order]
            if missing:
                raise ProtocolError(f"migrate.rank_order does not rank {', '.join(missing)}")


@_command
@dataclass(frozen=True, kw_only=True)
class StopJob(Command):
    """Stop the job: ask it to stop, and end its local processes after ``grace_seconds``."""

    TYPE: ClassVar[str] = "stop_job"

    reason: str = ""
    grace_seconds: float = 20.0

    def validate(self) -> None:
        super().validate()
        at_least(self.grace_seconds, 0.0, "stop_job.grace_seconds")


@_command
@dataclass(frozen=True, kw_only=True)
class Profile(Command):
    """Measure the job's throughput from ``max_workers`` down to ``min_workers``."""

    TYPE: ClassVar[str] = "profile"

    min_workers: int
    max_workers: int
    batches_per_level: int = 20

    def validate(self) -> None:
        super().validate()
        at_least(self.min_workers, 1, "profile.min_workers")
        at_least(self.batches_per_level, 2, "profile.batches_per_level")
        if self.max_workers < self.min_workers:
            raise ProtocolError("profile.max_workers must be at least min_workers")


NODE_JOB = "node"
"""The ``job`` of a command about the node itself rather than a job (``EvictEnvironment``)."""


@_command
@dataclass(frozen=True, kw_only=True)
class EvictEnvironment(Command):
    """Remove one environment (``key``) from this node's cache: an admin's eviction.

    About the node, not a job: ``job`` is always ``NODE_JOB``.  The agent
    refuses a key that a worker on this node runs in; it answers with an
    ``EnvironmentEvicted`` report either way.
    """

    TYPE: ClassVar[str] = "evict_environment"

    job: str = NODE_JOB
    key: str

    def validate(self) -> None:
        super().validate()
        if self.job != NODE_JOB:
            raise ProtocolError(f"evict_environment.job must be {NODE_JOB!r}")
        if not ENVIRONMENT_KEY.fullmatch(self.key):
            raise ProtocolError("evict_environment.key must be 32 hexadecimal digits")


SHELL_ID = re.compile(r"[0-9a-f]{32}")
"""A shell's id: 32 hexadecimal digits, random (the portal's ``secrets.token_hex(16)``)."""
MAX_SHELL_ARGS = 64
MAX_SHELL_ARG_CHARS = 4096
MAX_SHELL_ROWS_COLS = 1000
MAX_SHELL_IDLE_S = 86_400.0
SHELL_TERM = re.compile(r"[A-Za-z0-9._+-]{1,64}")
MAX_SHELL_CHUNK = 64 * 1024
"""The most bytes one entry of a shell's stream carries, either way."""
SHELL_STREAM_MAXLEN = 1000
"""Entries a shell's stream keeps (older ones are trimmed: a reader that falls this far
behind loses output, not the agent's memory)."""
SHELL_STREAM_TTL_S = 3600
"""A shell's streams expire this long after their last entry (a shell nobody closed)."""


def shell_keys(node: str, shell_id: str) -> tuple[str, str]:
    """The Redis streams of one shell on ``node``: (input to the shell, output from it).

    Both lie under ``agent:<node>:``, the key space the node's own Redis user may
    use (``redis_acl.agent_rules``), so no other agent reaches them and no job's user
    does.  Entries of the input stream: ``d`` bytes to write, ``r`` ``"rows cols"``,
    ``e`` end of input, ``k`` close now.  Of the output stream: ``d`` bytes written,
    ``err`` why the shell did not open, ``x`` the exit status (the last entry).
    """
    base = f"agent:{node}:shell:{shell_id}"
    return f"{base}:in", f"{base}:out"


ShellEntry = tuple[str, dict[bytes, bytes]]
"""One entry of a shell's stream: its id and its fields, as bytes."""


def shell_entries(answer: Any) -> list[ShellEntry]:
    """The entries of an ``XREAD`` answer on a client that keeps bytes (in order)."""
    out: list[ShellEntry] = []
    for _stream, entries in answer or []:
        for entry_id, fields in entries:
            ident = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            out.append((ident, dict(fields)))
    return out


@_command
@dataclass(frozen=True, kw_only=True)
class OpenShell(Command):
    """Open an interactive shell with a PTY in the sandbox of ``worker_id`` of ``job``.

    ``argv`` empty: the login shell.  Bytes flow through ``shell_keys(node, shell_id)``;
    the shell ends after ``idle_seconds`` with no byte either way.
    """

    TYPE: ClassVar[str] = "open_shell"

    shell_id: str
    worker_id: str
    argv: tuple[str, ...] = ()
    term: str = "xterm-256color"
    rows: int = 24
    cols: int = 80
    idle_seconds: float = 900.0

    def validate(self) -> None:
        super().validate()
        if not SHELL_ID.fullmatch(self.shell_id):
            raise ProtocolError("open_shell.shell_id must be 32 hexadecimal digits")
        check_name(self.worker_id, "open_shell.worker_id")
        check_shell_argv(self.argv, "open_shell.argv")
        if not SHELL_TERM.fullmatch(self.term):
            raise ProtocolError("open_shell.term must be 1-64 letters, digits or ._+-")
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            check_window(value, f"open_shell.{name}")
        if not 1 <= self.idle_seconds <= MAX_SHELL_IDLE_S:
            raise ProtocolError(f"open_shell.idle_seconds must be within 1-{MAX_SHELL_IDLE_S:.0f}")


def check_shell_argv(argv: tuple[str, ...], path: str) -> None:
    """Refuse a shell command line that is too long or holds a NUL (no exec takes it)."""
    if len(argv) > MAX_SHELL_ARGS:
        raise ProtocolError(f"{path} has more than {MAX_SHELL_ARGS} arguments")
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or "\0" in arg or len(arg) > MAX_SHELL_ARG_CHARS:
            raise ProtocolError(
                f"{path}[{i}] must be text of at most {MAX_SHELL_ARG_CHARS} characters, no NUL"
            )


def check_window(value: int, path: str) -> None:
    """Refuse a terminal size out of 1-``MAX_SHELL_ROWS_COLS``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{path} must be an integer")
    if not 1 <= value <= MAX_SHELL_ROWS_COLS:
        raise ProtocolError(f"{path} must be within 1-{MAX_SHELL_ROWS_COLS}")


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True, kw_only=True)
class Report(Message):
    """A report from the agent of ``node``; ``at`` is its Unix time of sending."""

    node: str
    at: float = field(default_factory=time.time)

    def validate(self) -> None:
        check_name(self.node, f"{self.TYPE}.node")

    @staticmethod
    def from_dict(data: Any) -> Report:
        """Parse and check a report; raise ``ProtocolError`` if it is not one."""
        report: Report = parse(data, _REPORTS, "report")
        return report


@dataclass(frozen=True, kw_only=True)
class JobReport(Report):
    """A report about one job."""

    job: str

    def validate(self) -> None:
        super().validate()
        check_name(self.job, f"{self.TYPE}.job")


@dataclass(frozen=True, kw_only=True)
class JobEventReport(JobReport):
    """A report forwarded from the job's runtime event stream.

    ``event_id`` is the stream entry's id: unique per job, so the receiver can
    drop a report it has already seen.  Which event becomes which report, and
    which of its fields become which of the report's, is the event's
    declaration (``workers.runtime_events``; ``EVENT_REPORTS``).
    """

    event_id: str

    def validate(self) -> None:
        super().validate()
        check_id(self.event_id, f"{self.TYPE}.event_id")


@dataclass(frozen=True, kw_only=True)
class RunningWorker(Record):
    """A training process that an agent runs."""

    job: str
    worker_id: str
    slot: int
    pid: int


@dataclass(frozen=True, kw_only=True)
class EnvironmentUsed(Record):
    """The environment started workers run in beyond the node's base layer
    (``workers.agent.environments``): its key, whether the cache had it or it was built
    now (``build_s``), and the ``name==version`` of what it installed."""

    key: str
    hit: bool
    build_s: float = 0.0
    packages: tuple[str, ...] = ()

    def validate(self) -> None:
        if not ENVIRONMENT_KEY.fullmatch(self.key):
            raise ProtocolError("environment.key must be 32 hexadecimal digits")
        if not math.isfinite(self.build_s) or not 0 <= self.build_s <= MAX_BUILD_S:
            raise ProtocolError(f"environment.build_s must be within 0-{MAX_BUILD_S:.0f}")
        if len(self.packages) > MAX_ENVIRONMENT_PACKAGES or any(
            len(p) > MAX_PACKAGE_CHARS for p in self.packages
        ):
            raise ProtocolError("environment.packages is too long")

    def describe(self) -> str:
        """One line for the job's history."""
        what = ", ".join(self.packages) if self.packages else "nothing beyond the node's base"
        if self.hit:
            return f"environment {self.key}: cache hit ({what})"
        return f"environment {self.key}: built in {self.build_s:.1f} s ({what})"


@_report
@dataclass(frozen=True, kw_only=True)
class Started(JobReport):
    """Processes of the job were started (``command_id`` is the command that did it);
    ``environment``: what they run in beyond the node's base layer (None: nothing)."""

    TYPE: ClassVar[str] = "started"

    command_id: str
    workers: tuple[RunningWorker, ...]
    environment: EnvironmentUsed | None = None


@_report
@dataclass(frozen=True, kw_only=True)
class Progress(JobEventReport):
    """Training progress of the job: global step and throughput of the whole job."""

    TYPE: ClassVar[str] = "progress"

    step: int
    samples_per_s: float
    world: int
    loss: float | None = None
    generation: int | None = None


@_report
@dataclass(frozen=True, kw_only=True)
class ScaleDone(JobEventReport):
    """A membership change (scale-out, scale-in, migration) took effect.

    ``workers`` are the members after the switch; ``pause_s`` is how long the
    reporting worker stood still for it.
    """

    TYPE: ClassVar[str] = "scale_done"

    world: int | None = None
    step: int | None = None
    generation: int | None = None
    workers: tuple[str, ...] = ()
    joiners: tuple[str, ...] = ()
    leavers: tuple[str, ...] = ()
    pause_s: float | None = None
    new_leader: str | None = None


@_report
@dataclass(frozen=True, kw_only=True)
class Straggler(JobEventReport):
    """A worker is persistently slower than the job's median (``ratio`` = its time / median)."""

    TYPE: ClassVar[str] = "straggler"

    worker_id: str
    ratio: float


@_report
@dataclass(frozen=True, kw_only=True)
class WorkerFailed(JobEventReport):
    """The runtime dropped a worker that missed a synchronisation."""

    TYPE: ClassVar[str] = "worker_failed"

    worker_id: str
    error: str = ""
    generation: int | None = None


@_report
@dataclass(frozen=True, kw_only=True)
class Recovered(JobEventReport):
    """The job recovered from a failure.

    ``mode`` is the recovery used; ``dead`` the workers dropped; training goes
    on from ``restored_step`` (the checkpoint's step under consistent recovery).
    """

    TYPE: ClassVar[str] = "recovered"

    mode: str = ""
    world: int | None = None
    step: int | None = None
    generation: int | None = None
    dead: tuple[str, ...] = ()
    restored_step: int | None = None


@_report
@dataclass(frozen=True, kw_only=True)
class ProfileDone(JobEventReport):
    """The job's throughput-vs-parallelism curve from a profile command."""

    TYPE: ClassVar[str] = "profile_done"

    curve: tuple[CurvePoint, ...]


@_report
@dataclass(frozen=True, kw_only=True)
class Finished(JobEventReport):
    """The job ended on its own terms: ``reason`` is ``finished`` or ``stopped``."""

    TYPE: ClassVar[str] = "finished"

    step: int | None = None
    reason: str = "finished"


@_report
@dataclass(frozen=True, kw_only=True)
class ArtifactStored(JobEventReport):
    """An object of the job was written to the artifact store.

    ``path`` is relative to the job's prefix (``checkpoints/...``,
    ``artifacts/...`` or ``logs/...``): a report can only ever name the job's
    own objects.  ``pruned`` are older checkpoints the writer deleted under the
    keep rule.  Reports that the agent makes itself (collecting a torchrun
    program's ``ARTIFACT_DIR``) carry an ``event_id`` of its own making.
    """

    TYPE: ClassVar[str] = "artifact_stored"

    kind: ArtifactKind
    path: str
    size: int
    sha256: str
    step: int | None = None
    name: str = ""
    pruned: tuple[str, ...] = ()

    def validate(self) -> None:
        super().validate()
        at_least(self.size, 0, "artifact_stored.size")
        at_least(self.step, 0, "artifact_stored.step")
        if len(self.name) > ARTIFACT_NAME_CHARS:
            raise ProtocolError(
                f"artifact_stored.name must be at most {ARTIFACT_NAME_CHARS} characters"
            )
        if len(self.pruned) > 100:
            raise ProtocolError("artifact_stored.pruned may name at most 100 paths")
        try:
            check_job_path(self.path, "artifact_stored.path")
            check_sha256(self.sha256, "artifact_stored.sha256")
            for i, old in enumerate(self.pruned):
                check_job_path(old, f"artifact_stored.pruned[{i}]")
        except OutputError as exc:
            raise ProtocolError(str(exc)) from None


@_report
@dataclass(frozen=True, kw_only=True)
class CheckpointSkipped(JobEventReport):
    """A checkpoint failed its size or checksum on reading; an older one was used instead."""

    TYPE: ClassVar[str] = "checkpoint_skipped"

    step: int
    reason: str

    def validate(self) -> None:
        super().validate()
        at_least(self.step, 0, "checkpoint_skipped.step")
        if len(self.reason) > SKIPPED_REASON_CHARS:
            raise ProtocolError(
                f"checkpoint_skipped.reason must be at most {SKIPPED_REASON_CHARS} characters"
            )


@_report
@dataclass(frozen=True, kw_only=True)
class Metrics(JobEventReport):
    """Training metrics a program logged, in step order."""

    TYPE: ClassVar[str] = "metrics"

    points: tuple[MetricPoint, ...]

    def validate(self) -> None:
        super().validate()
        if not self.points:
            raise ProtocolError("metrics.points must not be empty")
        if len(self.points) > MAX_METRIC_POINTS:
            raise ProtocolError(f"metrics.points may hold at most {MAX_METRIC_POINTS} points")


EVENTS_DROPPED_REASON_CHARS = 300
"""The most characters of the reason an ``events_dropped`` report carries."""


@_report
@dataclass(frozen=True, kw_only=True)
class EventsDropped(JobReport):
    """Entries of the job's event stream that the agent dropped instead of forwarding.

    The stream is the tenant program's to write (``workers.job_events``):
    an entry that is malformed, over the job's rate, or that claims what the
    agent sees is false, is counted, and the count reaches the job's history.
    ``count`` entries since the agent's last such report, from
    ``first_event_id`` to ``last_event_id``; ``reason`` is the first one's.
    """

    TYPE: ClassVar[str] = "events_dropped"

    count: int
    reason: str
    first_event_id: str
    last_event_id: str

    def validate(self) -> None:
        super().validate()
        at_least(self.count, 1, "events_dropped.count")
        check_id(self.first_event_id, "events_dropped.first_event_id")
        check_id(self.last_event_id, "events_dropped.last_event_id")
        if len(self.reason) > EVENTS_DROPPED_REASON_CHARS:
            raise ProtocolError(
                f"events_dropped.reason must be at most {EVENTS_DROPPED_REASON_CHARS} characters"
            )


@_report
@dataclass(frozen=True, kw_only=True)
class Failed(JobReport):
    """The job failed; ``event_id`` is null when the agent, not the runtime, saw it."""

    TYPE: ClassVar[str] = "failed"

    error: str
    event_id: str | None = None
    final: bool = False
    """No retry can help (an environment that does not build): the job fails at once."""


@_report
@dataclass(frozen=True, kw_only=True)
class WorkerExited(JobReport):
    """A local training process ended, and its slot is free again.

    ``outcome``: ``clean`` (exit 0: finished, stopped on request, or left the
    job), ``stopped`` (signalled by the agent after a stop command's grace
    period), ``crashed`` (non-zero exit or killed by a signal; ``exit_code``
    is ``-signal`` then), ``lost`` (exit status unknown: the process ended
    while the agent was down, or was adopted by a restarted agent).
    ``generation`` is the program's run (``Program.generation``; null for a
    built-in workload); ``reason`` the agent's diagnosis of a crash, e.g. a
    sandbox limit that was reached.
    """

    TYPE: ClassVar[str] = "worker_exited"

    worker_id: str
    slot: int
    exit_code: int | None
    outcome: ExitOutcome
    log_tail: str = ""
    generation: int | None = None
    reason: str = ""


LOG_TEXT_MAX_CHARS = 65536
"""The most characters of output that one ``log_lines`` report carries."""


@_report
@dataclass(frozen=True, kw_only=True)
class LogLines(JobReport):
    """New output of one training process: bytes ``[offset, offset + size)`` of its log file.

    ``log_id`` names the file (a file created again gets a new id, and its
    offsets start over at 0).  ``text`` is those bytes decoded as UTF-8 with
    invalid bytes replaced, at most ``LOG_TEXT_MAX_CHARS`` characters; ``size``
    is how many bytes of the file they were (default: the UTF-8 length of
    ``text``), so offsets stay right even where a byte was replaced.  ``rank``
    and ``generation`` tag the process when the agent knows them.
    """

    TYPE: ClassVar[str] = "log_lines"

    worker_id: str
    log_id: str
    offset: int
    text: str
    size: int | None = None
    rank: int | None = None
    generation: int | None = None

    def validate(self) -> None:
        super().validate()
        check_name(self.worker_id, "log_lines.worker_id")
        check_id(self.log_id, "log_lines.log_id")
        at_least(self.offset, 0, "log_lines.offset")
        at_least(self.size, 0, "log_lines.size")
        at_least(self.rank, 0, "log_lines.rank")
        at_least(self.generation, 0, "log_lines.generation")
        if len(self.text) > LOG_TEXT_MAX_CHARS:
            raise ProtocolError(
                f"log_lines.text must be at most {LOG_TEXT_MAX_CHARS} characters, "
                f"not {len(self.text)}"
            )

    @property
    def byte_size(self) -> int:
        """How many bytes of the log file ``text`` covers."""
        return len(self.text.encode()) if self.size is None else self.size


@_report
@dataclass(frozen=True, kw_only=True)
class Stopped(JobReport):
    """Every local process of a job that was told to stop has ended."""

    TYPE: ClassVar[str] = "stopped"

    command_id: str


@_report
@dataclass(frozen=True, kw_only=True)
class LabActivity(JobReport):
    """What a session's Jupyter says of itself (its ``/api/status``, read by the agent's
    relay every ``workers.lab_protocol.ACTIVITY_EVERY_S``): its last activity (Unix time:
    a kernel busy, a request served), how many clients are connected, how many kernels run.

    The portal counts the session active at ``last_activity``, or at ``at`` while a client
    is connected (a connected browser keeps a session from being culled).
    """

    TYPE: ClassVar[str] = "lab_activity"

    last_activity: float
    connections: int = 0
    kernels: int = 0

    def validate(self) -> None:
        super().validate()
        _check_time(self.last_activity, "lab_activity.last_activity")
        at_least(self.connections, 0, "lab_activity.connections")
        at_least(self.kernels, 0, "lab_activity.kernels")

    @property
    def active_at(self) -> float:
        """When the session was last active, by this report (never after it was sent)."""
        return self.at if self.connections > 0 else min(self.last_activity, self.at)


@_report
@dataclass(frozen=True, kw_only=True)
class Rejected(Report):
    """A command was refused and changed nothing; ``error`` says why.

    ``command_type`` names the refused command's type when it parsed.  A
    start refused because a slot is taken names the slot and what holds it
    (``busy_slot``, ``busy_job``, ``busy_worker``: the agent's own process
    table), so the control plane can find the slot's true owner.
    """

    TYPE: ClassVar[str] = "rejected"

    error: str
    command_id: str | None = None
    job: str | None = None
    command_type: str | None = None
    busy_slot: int | None = None
    busy_job: str | None = None
    busy_worker: str | None = None

    def validate(self) -> None:
        super().validate()
        at_least(self.busy_slot, 0, "rejected.busy_slot")
        for name, value in (("busy_job", self.busy_job), ("busy_worker", self.busy_worker)):
            if value is not None:
                check_name(value, f"rejected.{name}")
        if self.command_type is not None and self.command_type not in _COMMANDS:
            raise ProtocolError(f"rejected.command_type {self.command_type!r} is no command")


MAX_CACHE_ENTRIES = 256
"""The most environments one ``environment_cache`` report lists (the most recently used)."""
MAX_CACHE_REPORT_CHARS = 256 * 1024
"""The most characters of package and requirement text one ``environment_cache`` report carries."""
MAX_CACHE_BYTES = 2**62
"""A bound on any size a cache report states (a number PostgreSQL's bigint holds)."""
MAX_EVICTION_DETAIL_CHARS = 300


def _check_bytes(value: int, path: str) -> None:
    if not 0 <= value <= MAX_CACHE_BYTES:
        raise ProtocolError(f"{path} must be within 0-{MAX_CACHE_BYTES}")


def _check_time(value: float | None, path: str) -> None:
    if value is not None and not 0 <= value <= 2**40:
        raise ProtocolError(f"{path} must be a Unix time")


@dataclass(frozen=True, kw_only=True)
class CachedEnvironment(Record):
    """One complete environment of a node's cache, as its manifest and the disk say.

    ``last_used`` and ``built_at`` are Unix times; ``packages`` the pinned
    ``name==version`` it installed, ``requirements`` what was asked;
    ``packages_omitted`` how many packages the report left out to stay within
    its bound; ``in_use``: a worker on the reporting node runs in it.
    """

    key: str
    size_bytes: int
    last_used: float
    in_use: bool = False
    packages: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()
    packages_omitted: int = 0
    built_at: float | None = None
    build_s: float | None = None

    def validate(self) -> None:
        if not ENVIRONMENT_KEY.fullmatch(self.key):
            raise ProtocolError("entry.key must be 32 hexadecimal digits")
        _check_bytes(self.size_bytes, "entry.size_bytes")
        _check_time(self.last_used, "entry.last_used")
        _check_time(self.built_at, "entry.built_at")
        at_least(self.packages_omitted, 0, "entry.packages_omitted")
        if self.build_s is not None and not 0 <= self.build_s <= MAX_BUILD_S:
            raise ProtocolError(f"entry.build_s must be within 0-{MAX_BUILD_S:.0f}")
        if len(self.packages) > MAX_ENVIRONMENT_PACKAGES or any(
            len(p) > MAX_PACKAGE_CHARS for p in self.packages
        ):
            raise ProtocolError("entry.packages is too long")
        if len(self.requirements) > MAX_REQUIREMENTS or any(
            len(r) > MAX_REQUIREMENT_CHARS for r in self.requirements
        ):
            raise ProtocolError("entry.requirements is too long")

    @property
    def text_chars(self) -> int:
        """How much of a report's text bound this entry spends."""
        return sum(map(len, self.packages)) + sum(map(len, self.requirements))


@_report
@dataclass(frozen=True, kw_only=True)
class EnvironmentCacheReport(Report):
    """What a node's environment cache holds (``workers.agent.environments``).

    ``entries``: at most ``MAX_CACHE_ENTRIES``, most recently used first, with
    at most ``MAX_CACHE_REPORT_CHARS`` of package text in all; ``omitted``
    counts the environments left out.  ``total_bytes`` is the whole cache's
    size (those left out included), ``max_bytes`` the size it is evicted down to.
    """

    TYPE: ClassVar[str] = "environment_cache"

    max_bytes: int
    total_bytes: int
    entries: tuple[CachedEnvironment, ...] = ()
    omitted: int = 0

    def validate(self) -> None:
        super().validate()
        _check_bytes(self.max_bytes, "environment_cache.max_bytes")
        _check_bytes(self.total_bytes, "environment_cache.total_bytes")
        at_least(self.omitted, 0, "environment_cache.omitted")
        if len(self.entries) > MAX_CACHE_ENTRIES:
            raise ProtocolError(
                f"environment_cache.entries may list at most {MAX_CACHE_ENTRIES} environments"
            )
        keys = [entry.key for entry in self.entries]
        if len(set(keys)) != len(keys):
            raise ProtocolError("environment_cache.entries names one key twice")
        if sum(entry.text_chars for entry in self.entries) > MAX_CACHE_REPORT_CHARS:
            raise ProtocolError(
                f"environment_cache.entries carry more than {MAX_CACHE_REPORT_CHARS} characters"
            )


EvictionOutcome = Literal["evicted", "in_use", "not_found", "failed"]


@_report
@dataclass(frozen=True, kw_only=True)
class EnvironmentEvicted(Report):
    """The answer to an ``evict_environment`` command (``command_id``).

    ``outcome``: ``evicted`` (removed), ``in_use`` (refused: a worker on this
    node runs in it; ``detail`` names which), ``not_found`` (nothing under
    that key here), ``failed`` (the removal raised; ``detail`` says what).
    """

    TYPE: ClassVar[str] = "environment_evicted"

    command_id: str
    key: str
    outcome: EvictionOutcome
    detail: str = ""

    def validate(self) -> None:
        super().validate()
        check_id(self.command_id, "environment_evicted.command_id")
        if not ENVIRONMENT_KEY.fullmatch(self.key):
            raise ProtocolError("environment_evicted.key must be 32 hexadecimal digits")
        if len(self.detail) > MAX_EVICTION_DETAIL_CHARS:
            raise ProtocolError(
                f"environment_evicted.detail must be at most {MAX_EVICTION_DETAIL_CHARS} characters"
            )


MAX_REPORTED_GPUS = 64
MAX_GPU_MODEL_CHARS = 96
MAX_GPU_UUID_CHARS = 96
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024
MAX_HOST_CPU_CORES = 4096
MAX_HOST_MEMORY_MIB = 1 << 40
MAX_GPU_TEMPERATURE_C = 1000.0
MAX_ECC_ERRORS = 2**62
MAX_XID = 2**31
HardwareSource = Literal["nvml", "torch", "none"]
"""Where the agent read its GPUs: NVML, ``torch.cuda``, or nowhere (none seen, none reported)."""


def _within(value: float | None, top: float, path: str) -> None:
    """Refuse a reported figure below 0 or above ``top`` (None: not reported)."""
    if value is not None and not 0 <= value <= top:
        raise ProtocolError(f"{path} must be within 0-{top:g}")


@dataclass(frozen=True, kw_only=True)
class GpuHealth(Record):
    """One GPU's health as NVML reads it; None: NVML did not say (never a made-up figure)."""

    temperature_c: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    xid: int | None = None
    """The last XID event the driver raised on it since the agent started, if any."""

    def validate(self) -> None:
        _within(self.temperature_c, MAX_GPU_TEMPERATURE_C, "gpu.health.temperature_c")
        _within(self.utilization_pct, 100.0, "gpu.health.utilization_pct")
        _within(self.memory_used_mib, MAX_GPU_MEMORY_MIB, "gpu.health.memory_used_mib")
        _within(self.ecc_uncorrected, MAX_ECC_ERRORS, "gpu.health.ecc_uncorrected")
        _within(self.ecc_corrected, MAX_ECC_ERRORS, "gpu.health.ecc_corrected")
        _within(self.xid, MAX_XID, "gpu.health.xid")


@dataclass(frozen=True, kw_only=True)
class GpuHardware(Record):
    """One GPU the agent sees: its model, memory, UUID and (with NVML) its health."""

    model: str
    memory_mib: int
    uuid: str = ""
    health: GpuHealth | None = None

    def validate(self) -> None:
        if len(self.model) > MAX_GPU_MODEL_CHARS or not self.model.isprintable():
            raise ProtocolError(f"gpu.model must be printable, at most {MAX_GPU_MODEL_CHARS}")
        if len(self.uuid) > MAX_GPU_UUID_CHARS or not self.uuid.isprintable():
            raise ProtocolError(f"gpu.uuid must be printable, at most {MAX_GPU_UUID_CHARS}")
        _within(self.memory_mib, MAX_GPU_MEMORY_MIB, "gpu.memory_mib")


@dataclass(frozen=True, kw_only=True)
class Hardware(Record):
    """What a node is, as its agent reads it (``workers.agent.hardware``).

    ``source`` says where the GPUs were read (``none``: no NVML and no CUDA, so
    ``gpus`` says nothing); ``health`` is ``nvml`` when each GPU's health was
    read, ``none`` when it is not reported.  0 CPU cores or memory: not read.
    """

    source: HardwareSource
    gpus: tuple[GpuHardware, ...] = ()
    health: Literal["nvml", "none"] = "none"
    cpu_cores: int = 0
    memory_mib: int = 0

    def validate(self) -> None:
        if len(self.gpus) > MAX_REPORTED_GPUS:
            raise ProtocolError(f"hardware.gpus lists more than {MAX_REPORTED_GPUS} GPUs")
        if self.source == "none" and self.gpus:
            raise ProtocolError("hardware.gpus must be empty when hardware.source is none")
        _within(self.cpu_cores, MAX_HOST_CPU_CORES, "hardware.cpu_cores")
        _within(self.memory_mib, MAX_HOST_MEMORY_MIB, "hardware.memory_mib")


@_report
@dataclass(frozen=True, kw_only=True)
class Heartbeat(Report):
    """The agent is alive: its slots, free slots, and the processes it runs.

    ``hardware`` (when sent): what the node is and its GPUs' health; the
    control plane checks it against the inventory (``inventory.registration``).
    """

    TYPE: ClassVar[str] = "heartbeat"

    device: DeviceKind
    slots: int
    free_slots: tuple[int, ...]
    workers: tuple[RunningWorker, ...]
    address: str = "127.0.0.1"
    hardware: Hardware | None = None

    def validate(self) -> None:
        super().validate()
        at_least(self.slots, 0, "heartbeat.slots")
        check_name(self.address, "heartbeat.address")


def _event_reports() -> dict[str, type[JobReport]]:
    """The report type of each runtime event kind, as its declaration names it.

    A declared event (``workers.runtime_events``) whose ``REPORT`` is no job
    report with an ``event_id`` fails the import: every event reaches the portal.
    """
    out: dict[str, type[JobReport]] = {}
    for kind, event in event_types().items():
        report = _REPORTS.get(event.REPORT)
        if report is None or not issubclass(report, JobReport):
            raise TypeError(f"runtime event {kind!r} names no job report ({event.REPORT!r})")
        if "event_id" not in {f.name for f in dataclasses.fields(report)}:
            raise TypeError(f"report {event.REPORT!r} of runtime event {kind!r} has no event_id")
        out[kind] = report
    return out


EVENT_REPORTS: dict[str, type[JobReport]] = _event_reports()
"""The report each kind of runtime event becomes (``workers.agent.reports.report_from_event``)."""


def command_types() -> dict[str, type[Command]]:
    """Every command type by its ``type`` name."""
    return dict(_COMMANDS)


def report_types() -> dict[str, type[Report]]:
    """Every report type by its ``type`` name."""
    return dict(_REPORTS)
