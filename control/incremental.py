"""The tick's view of the cluster, kept in the scheduler process and brought up to date.

A full rebuild (``control.state``: ``read_cluster`` → ``load_allocator`` →
``build_snapshot``) reads every job, every held GPU and every allocation on every
tick; at 1,000 jobs that is most of a tick.  The kept state reads only what changed::

    tick n                                     tick n+1
    ──────                                     ────────
    KeptState (module-level, this process)     refresh():
      rows      job id -> JobRow                 1. fabric row, server rows (small)
      tokens    job id -> xmin:ctid              2. the job rows written since the last
      horizon   where the next read starts          refresh's snapshot (``row_txid`` index),
      holdings  job id -> GPUs                      with their JobGpu rows and last state
      allocator VClosAllocator (bound state)        change, in one statement
      gpu views, curves, since, ends-soon           → changed = token differs, left the
      job views (fixed epoch), speed tables           snapshot's states, or marked by the
      marks (start/last report), deadlines            tick (its own writes)
                                                 4. allocator: release + reserve those jobs;
                                                    availability only for changed servers
                                                 5. their views and curves dropped: the
                                                    next snapshot makes them again

Which rows were written: every job row carries the transaction that last wrote
it (``Job.row_txid``, set by a PostgreSQL trigger on every insert and update,
whoever makes it: a report, another replica's tick, an admin), so no writer has
to remember to announce its change.  A refresh reads, through that column's
index, the rows written by a transaction that was open at the previous
refresh's snapshot or began after it (:class:`Horizon`: every other one had
ended, and what it wrote was read then): the rows that changed, not a version
of every active job (at 10,000 jobs that read was about 9 ms of each tick).  A
row's ``xmin:ctid`` (PostgreSQL's system columns: the transaction that wrote
this version and where it lies) tells a row read again only because its
transaction was still open from one that changed.
What the feed cannot see: a table other than the job's changed alone (a
``JobGpu`` row deleted without its job being saved) and a job row deleted
(nothing deletes jobs; an admin's SQL could), which the verify pass catches.

The policy's core is kept too (``source.policy(name)``, a
:class:`scheduler.policies.kept_typed.KeptTypedPolicy`): the core restored from the
last snapshot, to which each pass applies only the jobs whose views changed (an
unchanged job keeps its view object here, so finding them is an identity check); on a
typed cluster one such core per GPU-type pool (``scheduler.gpu_types``).

Verify: every ``TICK_VERIFY_EVERY`` ticks, before its own transaction, the tick
refreshes the kept state and rebuilds everything from the database, both in one
read-only ``REPEATABLE READ`` transaction (one snapshot: a write committed
between the two reads is not a mismatch), and compares, the kept policy core's
decisions on the kept snapshot with a fresh core's among them; a mismatch is logged,
counted (``portal_tick_state_mismatches_total``) and repaired by rebuilding the
kept state.  Any error in a tick drops the kept state (the transaction rolled back,
the state may describe writes that never happened), so the next tick starts
from a full read; so does a new process.  ``TICK_INCREMENTAL=0`` or a database
other than PostgreSQL uses the full rebuild on every tick.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Field, Model

from control.assembly import Assembly, JobRow, KeptAside, PolicyInput, TenantRow
from control.gpu_speeds import gpu_type_speeds
from control.policy import live_policy
from control.state import (
    JOB_ROW_FIELDS,
    SNAPSHOT_STATES,
    TENANT_ROW_FIELDS,
    ClusterState,
    ServerRow,
    blocked_gpus,
    build_snapshot,
    down_gpus,
    finishing,
    gpu_view,
    growing_jobs,
    held_allocation,
    job_row,
    label_pairs,
    last_state_changes,
    load_allocator,
    read_cluster,
    server_layout,
    timed_jobs,
    unusable_gpus,
)
from control.tick_stats import TICK_STATS_KEY
from fabric.allocator import Allocation, VClosAllocator
from fabric.topology import FabricSpec
from inventory.models import Fabric, Gpu, Server
from jobs.agent_commands import GpuHome, runtime_job_name
from jobs.choices import ACTIVE_STATES
from jobs.models import Job, JobEvent, JobGpu
from scheduler.curves import SpeedTables
from scheduler.placement import CountPlacement
from scheduler.policies import Policy
from scheduler.policies.kept import KeptPolicy
from scheduler.policies.kept_typed import KeptTypedPolicy
from scheduler.types import Gpu as GpuView
from scheduler.types import JobView, ServerCapacity, Snapshot
from tenancy.models import Tenant

__all__ = [
    "ClusterSource",
    "FullRebuild",
    "KeptState",
    "Prepared",
    "compare",
    "compare_policies",
    "forget",
    "has_kept_state",
    "kept_state",
    "rebuild",
    "source_for_tick",
]

log = logging.getLogger(__name__)
MISMATCH_FIELD = "mismatches"  # in tick_stats' Redis hash: every process adds to one count
_PROGRESS_FIELDS = ("workload", "args", "batch_size", "step", "samples_per_s")
_CLOCK_FIELDS = ("started_at", "last_service_at", "max_runtime_s")  # reconcile's and limits'


@dataclass(frozen=True)
class Prepared:
    """What the tick's policy step works on: the cluster, the allocator, the policy's view."""

    cluster: ClusterState
    allocator: VClosAllocator
    view: PolicyInput


def rebuild(now: datetime, *, epoch: float | None = None) -> Prepared | None:
    """Everything read from the database in full (the reference the kept state must equal).

    ``epoch``: the snapshot's time base (``state.assemble_snapshot``; the kept
    state's, to compare with it).
    """
    cluster = read_cluster()
    if cluster is None:
        return None
    return Prepared(cluster, load_allocator(cluster), build_snapshot(cluster, now, epoch=epoch))


class ClusterSource(Protocol):
    """Where a tick gets its view of the cluster: a full rebuild or the kept state."""

    def cluster(self) -> ClusterState | None:
        """The cluster as the database has it now (inside the tick's transaction)."""

    def allocator(self, cluster: ClusterState) -> VClosAllocator:
        """The allocator for binding (it ends in the bound state)."""

    def policy_input(self, cluster: ClusterState, now: datetime) -> PolicyInput:
        """The policy's snapshot and what the tick needs next to it."""

    def touched(self, job_ids: Iterable[int]) -> None:
        """Jobs this tick bound or wrote: read again, whatever their tokens say."""

    def prepared(self, cluster: ClusterState, now: datetime) -> Prepared:
        """The allocator and the policy's view of ``cluster``."""

    def verify_if_due(self, now: datetime) -> None:
        """Compare what is kept with a full rebuild when one is due (before the tick's transaction)."""

    def speed_tables(self) -> SpeedTables | None:
        """The policy's speed-table memo for this tick's pass (None: none kept)."""

    def policy(self, name: str | None = None) -> Policy:
        """The control plane's policy ``name`` (``live_policy``) for this tick's pass."""


class FullRebuild:
    """Everything read from the database each time: the reference path."""

    def cluster(self) -> ClusterState | None:
        """:func:`control.state.read_cluster`."""
        return read_cluster()

    def allocator(self, cluster: ClusterState) -> VClosAllocator:
        """:func:`control.state.load_allocator`."""
        return load_allocator(cluster)

    def policy_input(self, cluster: ClusterState, now: datetime) -> PolicyInput:
        """:func:`control.state.build_snapshot`."""
        return build_snapshot(cluster, now)

    def touched(self, job_ids: Iterable[int]) -> None:
        """Nothing to remember."""

    def prepared(self, cluster: ClusterState, now: datetime) -> Prepared:
        """Read in full."""
        return Prepared(cluster, self.allocator(cluster), self.policy_input(cluster, now))

    def verify_if_due(self, now: datetime) -> None:
        """Nothing kept: nothing to verify."""

    def speed_tables(self) -> SpeedTables | None:
        """None: every pass makes its tables afresh."""
        return None

    def policy(self, name: str | None = None) -> Policy:
        """:func:`control.policy.live_policy`: a fresh core every pass."""
        return live_policy(name)


def _row_version(table: str = "") -> str:
    """A row's version in PostgreSQL's system columns, as text (the kept state's token);
    each column ``table.`` qualified when given."""
    prefix = table and f"{table}."
    return f"{prefix}xmin::text || ':' || {prefix}ctid::text"


@functools.cache
def _columns(
    model: type[Model],
    names: tuple[str, ...],
    as_text: frozenset[str] = frozenset(),
    table: str = "",
) -> str:
    """The select list of ``model``'s fields ``names``, quoted (those in ``as_text`` cast to
    text, for JSON the caller parses; each ``table.`` qualified when given): made once,
    each statement is then a constant."""
    columns = []
    for name in names:
        field = model._meta.get_field(name)
        assert isinstance(field, Field) and field.column  # every one a column
        column = (table and f"{table}.") + connection.ops.quote_name(field.column)
        columns.append(f"{column}::text" if name in as_text else column)
    return ", ".join(columns)


@dataclass(frozen=True, slots=True)
class Horizon:
    """Where the next read of written job rows starts: a snapshot's ``xmax`` and the
    transactions open in it (PostgreSQL's ``pg_current_snapshot()``).

    Every transaction below ``xmax`` and not open had ended when the snapshot was
    taken, and what it wrote that the read could see was read; a row written
    later was written by one of the ``open`` transactions or by one at or above
    ``xmax`` (``jobs.Job.row_txid``).  ``open`` holds the reading transaction's
    own id too (a snapshot leaves it out): what the tick writes after its read
    comes again at the next.  A long transaction elsewhere (a report, a session
    idle in one) costs only the rows it writes, not every row written meanwhile.
    """

    xmax: int
    open: tuple[int, ...]


_HORIZON = (
    "pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
    "ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) x) "
    "|| pg_current_xact_id_if_assigned()::text::bigint"
)
"""The statement's snapshot as :class:`Horizon` columns (its ``xmax``, then its open
transactions with this one's own id, NULL when it has none yet)."""


def _horizon_of(xmax: int, open_ids: Sequence[int | None]) -> Horizon:
    return Horizon(int(xmax), tuple(sorted({x for x in open_ids if x is not None})))


def _horizon() -> Horizon:
    """The current snapshot's :class:`Horizon`, taken before a full read."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_HORIZON}")
        row = cursor.fetchone()
    assert row is not None
    return _horizon_of(*row)


_JSON_FIELDS = frozenset(
    {"throughput_curve", "measured_curve", "args", "allocation", "gpu_types", "node_selector"}
)
_KEPT_FIELDS = (*JOB_ROW_FIELDS, *_PROGRESS_FIELDS, *_CLOCK_FIELDS, "allocation")


def _job_values(ids: list[int] | None) -> list[dict[str, Any]]:
    """What the kept state keeps of these queued/running/scaling jobs (all: ``None``),
    each as a dict of :data:`_KEPT_FIELDS` and its ``token``: the values ``values()``
    gives, JSON parsed, through one constant statement (the ORM compiled the query
    and converted each value again, every tick).  Jobs by id come with their
    ``held`` GPUs and last state change (``changed_at``, :func:`_extras`); all
    jobs (the first read) without: read apart, as two queries, not one per job.
    """
    table = connection.ops.quote_name(Job._meta.db_table)
    if ids is None:
        sql = (
            f"SELECT {_columns(Job, _KEPT_FIELDS, _JSON_FIELDS)}, {_row_version()} FROM {table} "
            "WHERE state = ANY(%s)"
        )
        params: list[Any] = [list(SNAPSHOT_STATES)]
    else:
        sql = (
            f"SELECT {_columns(Job, _KEPT_FIELDS, _JSON_FIELDS, 'w')}, "
            f"{_row_version('w')}, {_extras()} "
            f"FROM {table} w WHERE w.state = ANY(%s) AND w.id = ANY(%s)"
        )
        params = [list(SNAPSHOT_STATES), ids]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [_parsed(row) for row in cursor.fetchall()]


@functools.cache
def _extras() -> str:
    """Two more columns for each job row ``w`` a statement reads by id: the GPUs it holds
    in rank order (NULL for none), and when it last changed state (its latest event with
    a ``to_state``, as :func:`control.state.last_state_changes` reads it).

    Read with the rows, a tick's few changed jobs cost one statement, not three: a
    look-up in each table's index on the job per row read (set-based joins scanned
    both tables every tick, whatever was written: 20 ms at 10,000 jobs).
    """
    quote = connection.ops.quote_name
    job_gpu, gpu = quote(JobGpu._meta.db_table), quote(Gpu._meta.db_table)
    event = quote(JobEvent._meta.db_table)
    return (
        f'(SELECT array_agg(g."index" ORDER BY h.rank) FROM {job_gpu} h '
        f"JOIN {gpu} g ON g.id = h.gpu_id WHERE h.job_id = w.id), "
        f"(SELECT max(e.at) FROM {event} e WHERE e.job_id = w.id AND e.to_state <> '')"
    )


def _parsed(row: Sequence[Any]) -> dict[str, Any]:
    """One row of :data:`_KEPT_FIELDS`, its token, then its ``held`` GPUs and ``changed_at``
    when read (:func:`_extras`), as a dict, JSON parsed."""
    value = dict(zip(_KEPT_FIELDS, row, strict=False))
    for name in _JSON_FIELDS:
        if (text := value[name]) is not None:
            value[name] = json.loads(text)
    at = len(_KEPT_FIELDS)
    value["token"] = row[at]
    if len(row) > at + 1:
        value["held"], value["changed_at"] = row[at + 1] or [], row[at + 2]
    return value


@dataclass(frozen=True, slots=True)
class Written:
    """The job rows written since a horizon (:func:`_written_since`)."""

    horizon: Horizon
    """This read's horizon: the next read starts there."""
    fresh: list[dict[str, Any]]
    """Those in the snapshot's states, as :func:`_job_values` gives jobs by id."""
    left: dict[int, list[int]]
    """Those in no snapshot state: the GPUs each still holds, by id."""
    tenants: dict[int, TenantRow]
    """The tenants asked for, by id, as this read found them."""


def _written_since(horizon: Horizon, tenants: Sequence[int] = ()) -> Written:
    """Every job row written since ``horizon`` (a previous read's), and the new horizon.

    One statement through the ``row_txid`` index, so a tick reads the rows that
    changed, not a version of every active job (at 10,000 jobs that read was
    about 9 ms of a tick, most of it the database making 10,000 strings), with
    their held GPUs and last state change.  The horizon comes from the same
    statement's snapshot (:class:`Horizon`): a row this read does not see was
    written by a transaction open then or begun after it, which the next read
    (from this horizon) sees.  Rows this transaction wrote before the read come
    again, unchanged: their tokens tell them apart.  The ``tenants`` (the kept
    jobs') come in the same statement, one snapshot with the jobs.
    """
    table = connection.ops.quote_name(Job._meta.db_table)
    tenant_table = connection.ops.quote_name(Tenant._meta.db_table)
    tenant_columns = _columns(Tenant, ("id", *TENANT_ROW_FIELDS))
    blanks = ", ".join(["NULL"] * (len(_KEPT_FIELDS) + 3))  # the horizon's row: no job
    sql = (
        f"SELECT {_HORIZON}, (SELECT json_agg(json_build_array({tenant_columns})) "
        f"FROM {tenant_table} WHERE id = ANY(%s)), NULL, {blanks} UNION ALL "
        f"SELECT NULL, NULL, NULL, w.state = ANY(%s), "
        f"{_columns(Job, _KEPT_FIELDS, _JSON_FIELDS, 'w')}, "
        f"{_row_version('w')}, {_extras()} "
        f"FROM {table} w WHERE w.row_txid >= %s OR w.row_txid = ANY(%s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [list(tenants), list(SNAPSHOT_STATES), horizon.xmax, list(horizon.open)]
        )
        rows = cursor.fetchall()
    fresh: list[dict[str, Any]] = []
    left: dict[int, list[int]] = {}
    for _, _, _, active, *row in rows[1:]:  # the first: horizon and tenants (one snapshot)
        if active:
            fresh.append(_parsed(row))
        else:
            left[row[0]] = row[-2] or []
    read_tenants = {pk: TenantRow(*values) for pk, *values in rows[0][2] or ()}
    return Written(_horizon_of(rows[0][0], rows[0][1]), fresh, left, read_tenants)


def _held_gpus() -> dict[int, list[int]]:
    """The GPUs each job holds, in rank order (the first read's; later reads take the
    changed jobs' with their rows, :func:`_extras`)."""
    quote = connection.ops.quote_name
    job_gpu, gpu = quote(JobGpu._meta.db_table), quote(Gpu._meta.db_table)
    sql = (
        f'SELECT h.job_id, g."index" FROM {job_gpu} h JOIN {gpu} g ON g.id = h.gpu_id '
        "ORDER BY h.job_id, h.rank"
    )
    held: dict[int, list[int]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql)
        for job_id, index in cursor.fetchall():
            held.setdefault(job_id, []).append(index)
    return held


def _tenant_rows(ids: list[int]) -> dict[int, TenantRow]:
    """What the snapshot needs of these tenants, by id: one constant statement through a
    plain cursor (the values ``values_list`` gives; the ORM compiled the query each tick)."""
    columns = _columns(Tenant, ("id", *TENANT_ROW_FIELDS))
    table = connection.ops.quote_name(Tenant._meta.db_table)
    sql = f"SELECT {columns} FROM {table} WHERE id = ANY(%s)"
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])
        return {pk: TenantRow(*values) for pk, *values in cursor.fetchall()}


@dataclass(frozen=True, slots=True)
class ServersCheck:
    """Whether the servers changed since a read (:func:`_servers_changed`)."""

    fabric: str | None
    """The fabric row's version (``xmin:ctid``); None when no topology is loaded."""
    changed: bool
    """A server or GPU row was written in what the tick reads, a server was added or
    removed, or a suspect mark lapsed, since the last check."""
    horizon: Horizon
    """This check's snapshot: the next one starts there."""
    at: datetime
    """The database's time at this check (the next looks for marks lapsed since)."""
    count: int
    """Servers now."""


_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)  # before any suspect mark: the first check's "since"


def _servers_changed(horizon: Horizon | None, at: datetime | None, count: int) -> ServersCheck:
    """One statement: the fabric row's version and whether the servers need reading again.

    Server and GPU rows carry the transaction that last changed what the tick
    reads of them (``row_txid``, set by triggers: ``inventory`` migration 0003;
    a heartbeat leaves it alone); a look-up in its index per table says whether
    one was written since ``horizon`` (as for jobs, :class:`Horizon`).  What no
    write announces: a suspect mark lapsing (its time passed since ``at``) and a
    server deleted (the ``count`` differs).  A steady cluster's servers cost this
    one short row, not a hash of every server's row (4 ms a tick at 2,048).
    """
    quote = connection.ops.quote_name
    server, gpu = quote(Server._meta.db_table), quote(Gpu._meta.db_table)
    fabric = quote(Fabric._meta.db_table)
    sql = (
        f"SELECT {_HORIZON}, now(), (SELECT {_row_version()} FROM {fabric} WHERE id = 1), "
        f"(SELECT count(*) FROM {server}), "
        f"EXISTS (SELECT 1 FROM {server} WHERE row_txid >= %s OR row_txid = ANY(%s)) "
        f"OR EXISTS (SELECT 1 FROM {gpu} WHERE row_txid >= %s OR row_txid = ANY(%s)) "
        f"OR EXISTS (SELECT 1 FROM {gpu} WHERE suspect_until > %s AND suspect_until <= now())"
    )
    since = horizon or Horizon(0, ())
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [since.xmax, list(since.open), since.xmax, list(since.open), at or _LONG_AGO],
        )
        row = cursor.fetchone()
    assert row is not None
    xmax, open_ids, now, token, servers, written = row
    changed = written or horizon is None or servers != count
    return ServersCheck(token, changed, _horizon_of(xmax, open_ids), now, servers)


def _read_servers() -> list[ServerRow]:
    """``state.read_servers`` in one statement: each server's suspect GPUs aggregated with
    it (the same rows as that function's two queries; the verify compares them)."""
    quote = connection.ops.quote_name
    server, gpu = quote(Server._meta.db_table), quote(Gpu._meta.db_table)
    sql = f"""
        SELECT s.node, s.leaf, s.slot, s.state, s.last_heartbeat IS NOT NULL, g.suspect,
            s.gpu_type, s.labels::text, s.cpu_cores, s.memory_mib
        FROM {server} s LEFT JOIN (
            SELECT server_id, array_agg("index" ORDER BY "index") AS suspect
            FROM {gpu} WHERE suspect_until > now() GROUP BY server_id
        ) g ON g.server_id = s.id
        ORDER BY s.leaf, s.slot
    """
    with connection.cursor() as cursor:
        cursor.execute(sql)
        rows = cursor.fetchall()
    return [
        ServerRow(
            node,
            leaf,
            slot,
            state,
            beating,
            tuple(suspect or ()),
            gpu_type,
            label_pairs(json.loads(labels) if labels else {}),
            cpu_cores,
            memory_mib,
        )
        for node, leaf, slot, state, beating, suspect, gpu_type, labels, cpu_cores, memory_mib in (
            rows
        )
    ]


class KeptState:
    """The tick's inputs kept between ticks; :meth:`refresh` applies the database's changes.

    One owner: the tick, under its lock (ticks run one at a time).  ``reset``
    forgets everything; the next ``refresh`` then reads the whole database.
    """

    def __init__(self) -> None:
        self.reset(None)
        self.ticks_since_verify = 0
        self.verifications = 0  # compared with a full rebuild, since this process started
        self.mismatches = 0  # ... and found different

    def reset(self, spec: FabricSpec | None) -> None:
        """Forget everything (the next :meth:`refresh` reads it all)."""
        self.spec = spec
        self.fabric = ""  # the fabric row's version
        self.servers: list[ServerRow] | None = None
        # Where the next check of the servers starts (None: read them), the database's
        # time then (for lapsed suspect marks), and how many servers there were.
        self.servers_horizon: Horizon | None = None
        self.servers_at: datetime | None = None
        self.servers_count = 0
        self.homes: dict[int, GpuHome] = {}
        self.gpu_types: Mapping[int, str] = {}
        self.server_labels: Mapping[int, tuple[tuple[str, str], ...]] = {}
        self.server_capacity: Mapping[int, ServerCapacity] = {}
        self.schedulable: frozenset[int] = frozenset()
        self.draining: frozenset[int] = frozenset()
        self.suspect: frozenset[int] = frozenset()
        self.blocked: frozenset[int] = frozenset()
        self.down: frozenset[int] | None = None  # made with the servers (state.down_gpus)
        self.holders: dict[int, int] = {}
        self.holdings: dict[int, list[int]] = {}
        self.tokens: dict[int, str] = {}
        self.rows: dict[int, JobRow] = {}
        self.order: list[tuple[datetime, int]] = []  # (submitted_at, id), sorted
        self.ordered: list[JobRow] = []  # the rows in that order (the snapshot's)
        self.ending: set[int] = set()  # jobs whose row says they end soon (changes with it)
        self.tenant_jobs: dict[int, int] = {}  # kept rows by tenant id (the tenants read)
        self.marks: dict[int, datetime | None] = {}  # later of start and last report (rows)
        self.deadlines: dict[int, datetime] = {}  # first start + run-time limit (rows)
        self.since: dict[int, datetime] = {}
        self.curves: dict[int, tuple[int, Mapping[int, float]]] = {}
        self.views: dict[int, JobView] = {}
        # The snapshots' time base, fixed while the views are kept (set by the first snapshot).
        self.epoch: float | None = None
        self.gpu_views: list[GpuView] = []
        self.aside = KeptAside()  # the snapshot's GPU views with the left-out jobs' set aside
        self.assembly = Assembly()  # the snapshot's parts, made again for the changed jobs
        self.unassembled: set[int] = set()  # jobs changed since the last snapshot
        self.positions: dict[int, int] = {}
        self._allocator: VClosAllocator | None = VClosAllocator(spec) if spec else None
        self._speeds = SpeedTables()
        self.dirty: set[int] = set()
        self.horizon: Horizon | None = None  # where the next read of written rows starts
        self.tenants: dict[int, TenantRow] = {}  # the kept jobs' tenants, read with them
        # Kept policy cores by (name, class ageing): the views they hold are this state's.
        self.policies: dict[tuple[str, float | None], KeptTypedPolicy] = {}

    # --- ClusterSource ---------------------------------------------------------

    def cluster(self) -> ClusterState | None:
        """Apply the database's changes since the last call; the cluster as it is now."""
        check = _servers_changed(self.servers_horizon, self.servers_at, self.servers_count)
        if (check.fabric or "") != self.fabric:  # a topology (re)loaded: read everything again
            fabric = Fabric.objects.filter(pk=1).first()
            self.reset(fabric.spec() if fabric is not None and check.fabric is not None else None)
            self.fabric = check.fabric or ""
        if self.spec is None:
            return None
        state = self._state()
        servers = _read_servers() if check.changed or self.servers is None else None
        self.servers_horizon, self.servers_at = check.horizon, check.at
        self.servers_count = check.count
        servers_changed = servers is not None and servers != self.servers
        if servers is not None and servers_changed:
            layout = server_layout(self.spec, servers)
            self.servers = servers
            self.homes, self.schedulable, self.draining, self.suspect = (
                layout.homes,
                layout.schedulable,
                layout.draining,
                layout.suspect,
            )
            self.gpu_types, self.server_labels = layout.gpu_types, layout.server_labels
            self.server_capacity = layout.server_capacity
            self.down = unusable_gpus(self.spec, self.schedulable, self.draining)
            state = self._state()
        fresh, changed, left = self._changed_jobs()
        moved = self._apply_jobs(changed, fresh, left) if changed else set()
        self.unassembled |= changed
        if missing := self.tenant_jobs.keys() - self.tenants.keys():  # a first job, a first read
            self.tenants.update(_tenant_rows(list(missing)))
        state = self._state()
        if servers_changed:
            self._apply_servers(state)
        elif moved:
            for gpu in moved:
                if (position := self.positions.get(gpu)) is not None:
                    self.gpu_views[position] = gpu_view(state, gpu)
        return state

    def allocator(self, cluster: ClusterState) -> VClosAllocator:
        """The kept allocator (binding leaves it in the bound state; :meth:`touched` resyncs)."""
        assert self._allocator is not None
        return self._allocator

    def policy_input(self, cluster: ClusterState, now: datetime) -> PolicyInput:
        """The snapshot from the kept rows and tenants (read with the job rows)."""
        rows = self.ordered
        tenants = self.tenants
        # The growing jobs among those whose row says they end soon (a few), not the
        # ending ones among every growing job (a pass over every row).
        about_to_end = growing_jobs((self.rows[job] for job in self.ending), cluster.holdings)
        if self.epoch is None:
            self.epoch = now.timestamp()
        changed, self.unassembled = self.unassembled, set()
        return self.assembly.assemble(
            cluster,
            tuple(self.gpu_views),
            rows,
            tenants,
            about_to_end,
            self.since,
            now,
            changed=changed,
            by_id=self.rows,
            curves=self.curves,
            epoch=self.epoch,
            views=self.views,
            aside=self.aside,
            server_capacity=cluster.server_capacity,
            type_speeds=gpu_type_speeds(),
        )

    def touched(self, job_ids: Iterable[int]) -> None:
        """Read these jobs again on the next refresh, whatever their tokens say."""
        self.dirty.update(job_ids)

    def speed_tables(self) -> SpeedTables:
        """The policy's speed tables, kept with the curves they are made from.

        A changed job's curve is a new object (``curves`` is dropped with the
        job), so its table is made again; the tables of curves the previous
        pass did not use are swept here, once per tick.
        """
        self._speeds.sweep()
        return self._speeds

    def policy(self, name: str | None = None) -> KeptTypedPolicy:
        """The policy ``name`` (``live_policy``: the settings' class ageing) with its core kept.

        One per name and ageing period, kept with this state (a reset drops
        them): its passes apply only the jobs whose views changed since the
        previous one, and decide as a fresh core would.
        """
        fresh = live_policy(name)
        key = (name or settings.SCHEDULER_POLICY, fresh.class_ageing_s)
        kept = self.policies.get(key)
        if kept is None:
            kept = self.policies[key] = KeptTypedPolicy(fresh)
        return kept

    def prepared(self, cluster: ClusterState, now: datetime) -> Prepared:
        """The kept allocator and the policy's view from the kept rows."""
        return Prepared(cluster, self.allocator(cluster), self.policy_input(cluster, now))

    def verify_if_due(self, now: datetime) -> None:
        """Every ``TICK_VERIFY_EVERY`` ticks, compare the kept state with a full rebuild.

        Called before the tick's own transaction.  Both sides are read in one
        snapshot of the database (a read-only ``REPEATABLE READ`` transaction of
        their own): read at two moments of the tick's ``READ COMMITTED``
        transaction, a job submitted or a report applied in between made them
        differ with nothing wrong (three false mismatches in six minutes of a
        20-job live run, each counted and each paid for with a full rebuild).
        The kept policy cores decide on the kept snapshot and are compared with
        a fresh core's decisions (``compare_policies``).  A difference is logged
        and counted, and the kept state is dropped with its policy cores: the
        tick that follows reads everything again and restores fresh cores.
        """
        self.ticks_since_verify += 1
        if self.ticks_since_verify < settings.TICK_VERIFY_EVERY:
            return
        self.ticks_since_verify = 0
        self.verifications += 1
        with transaction.atomic():
            _read_one_snapshot()
            cluster = self.cluster()
            if cluster is None:
                return
            reference = rebuild(now, epoch=self.epoch)
            kept = self.prepared(cluster, now)
            differences = compare(kept, reference) if reference is not None else ["fabric"]
            differences += compare_policies(self.policies.values(), kept.view.snapshot)
        if not differences:
            return
        log.warning(
            "the tick's kept state differs from the database in %s: rebuilt",
            ", ".join(differences),
        )
        record_mismatch()
        self.mismatches += 1
        self.reset(self.spec)

    # --- internals -------------------------------------------------------------

    def _state(self) -> ClusterState:
        assert self.spec is not None
        return ClusterState(
            spec=self.spec,
            homes=self.homes,
            schedulable=self.schedulable,
            holders=self.holders,
            holdings=self.holdings,
            draining=self.draining,
            suspect=self.suspect,
            marks=self.marks,
            deadlines=self.deadlines,
            down=self.down,
            gpu_types=self.gpu_types,
            server_labels=self.server_labels,
            server_capacity=self.server_capacity,
        )

    def _changed_jobs(
        self,
    ) -> tuple[dict[int, dict[str, Any]], set[int], dict[int, list[int]] | None]:
        """The jobs to read again (written since the last read, or marked by the tick), the
        fresh values of those still queued, running or scaling, by id, and the GPUs the
        others hold (None: the first read, which reads every job's apart).

        The first read takes every job (from a horizon taken before it); later reads
        the rows written since (:func:`_written_since`): a row whose token is the kept
        one has not changed; one in no snapshot state has left the snapshot when it
        was in it.  Marked jobs not among them are read by id.
        """
        if self.horizon is None:
            self.horizon = _horizon()
            fresh = {value["id"]: value for value in _job_values(None)}
            return fresh, set(fresh) | self.tokens.keys(), None
        written = _written_since(self.horizon, list(self.tenant_jobs))
        self.horizon, self.tenants = written.horizon, written.tenants
        kept = self.tokens.get
        fresh = {v["id"]: v for v in written.fresh if kept(v["id"]) != v["token"]}
        left = {job: held for job, held in written.left.items() if job in self.tokens}
        changed = fresh.keys() | left.keys()
        if self.dirty:
            if unread := self.dirty - changed:
                fresh.update((value["id"], value) for value in _job_values(sorted(unread)))
                left.update((job, []) for job in unread - fresh.keys())
            changed |= self.dirty
            self.dirty = set()
        return fresh, changed, left

    def _apply_jobs(
        self,
        changed: set[int],
        fresh: Mapping[int, dict[str, Any]],
        others: Mapping[int, list[int]] | None,
    ) -> set[int]:
        """Apply the changed jobs (``fresh``: the values of those still in the snapshot's
        states; ``others``: the GPUs the others hold, None on the first read); return the
        GPUs whose holder changed."""
        if others is None:  # the first read: every job's GPUs, in one query
            held = _held_gpus()
        else:
            held = {job: gpus for job, gpus in others.items() if gpus}
            held.update((job, value["held"]) for job, value in fresh.items() if value["held"])
        moved: set[int] = set()
        for job_id in changed:  # every change's old GPUs go first: GPUs may pass between them
            for gpu in self.holdings.pop(job_id, ()):
                if self.holders.get(gpu) == job_id:
                    del self.holders[gpu]
                moved.add(gpu)
        for job_id, gpus in held.items():
            self.holdings[job_id] = gpus
            for gpu in gpus:
                self.holders[gpu] = job_id
            moved.update(gpus)
        assert self._allocator is not None
        current = self._allocator.allocations()
        for job_id in changed:
            name = runtime_job_name(job_id)
            if name in current:
                self._allocator.release(name)
            old = self.rows.pop(job_id, None)
            if old is not None:
                at = bisect.bisect_left(self.order, (old.submitted_at, job_id))
                del self.order[at], self.ordered[at]
                left = self.tenant_jobs.pop(old.tenant_id) - 1
                if left:
                    self.tenant_jobs[old.tenant_id] = left
            self.tokens.pop(job_id, None)
            self.ending.discard(job_id)
            self.marks.pop(job_id, None)
            self.deadlines.pop(job_id, None)
            self.since.pop(job_id, None)
            self.curves.pop(job_id, None)
            self.views.pop(job_id, None)
        state = self._state()
        for job_id, value in fresh.items():
            row = job_row(value)
            self.rows[job_id] = row
            self.tokens[job_id] = value["token"]
            at = bisect.bisect(self.order, (row.submitted_at, job_id))
            self.order.insert(at, (row.submitted_at, job_id))
            self.ordered.insert(at, row)
            progress = (value[name] for name in _PROGRESS_FIELDS)
            if finishing(*progress):
                self.ending.add(job_id)
            self.tenant_jobs[row.tenant_id] = self.tenant_jobs.get(row.tenant_id, 0) + 1
            started, served, limit = (value[name] for name in _CLOCK_FIELDS)
            self.marks[job_id] = max((t for t in (started, served) if t is not None), default=None)
            if started is not None and limit is not None:
                self.deadlines[job_id] = started + timedelta(seconds=limit)
            if row.state in ACTIVE_STATES:
                allocation = held_allocation(job_id, value["allocation"], state)
                if allocation is not None:
                    self._allocator.reserve(allocation)
        timed = timed_jobs(self.rows[job] for job in fresh)
        if others is None:
            self.since.update(last_state_changes(timed))
        else:
            self.since.update(
                (job, at) for job in timed if (at := fresh[job]["changed_at"]) is not None
            )
        return moved

    def _apply_servers(self, state: ClusterState) -> None:
        """Availability and GPU views after a server changed (state, heartbeat, name, slot)."""
        blocked = blocked_gpus(state)
        assert self._allocator is not None
        if freed := self.blocked - blocked:
            self._allocator.set_available(sorted(freed))
        if taken := blocked - self.blocked:
            self._allocator.set_unavailable(sorted(taken))
        self.blocked = blocked
        order = sorted(self.homes)
        self.positions = {gpu: position for position, gpu in enumerate(order)}
        self.gpu_views = [gpu_view(state, gpu) for gpu in order]


def _read_one_snapshot() -> None:
    """Have every statement of the transaction just begun read one snapshot of the database.

    PostgreSQL's ``REPEATABLE READ``, read-only (it never waits for or fails
    on a writer).  Only as the transaction's first statement: nested in
    another transaction (a test's), the outer one's isolation stands.
    """
    if connection.vendor != "postgresql" or len(connection.atomic_blocks) != 1:
        return
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def _allocation_key(allocation: Allocation) -> tuple[tuple[int, ...], ...]:
    return (allocation.gpus, tuple(allocation.leaves), tuple(allocation.uplinks))


VIEW_PARTS = (
    "snapshot", "ids", "held_back", "book", "profile_candidates", "switching", "blocked",
)  # fmt: skip
"""What of the policy's input a kept tick state must share with a full rebuild."""


CLUSTER_PARTS = (
    "spec", "homes", "schedulable", "holders", "holdings", "draining", "suspect",
    "gpu_types", "server_labels", "server_capacity",
)  # fmt: skip
"""What of the cluster a kept tick state must share with a full rebuild."""


def compare(kept: Prepared, rebuilt: Prepared) -> list[str]:
    """The parts in which the kept state differs from a full rebuild (empty: the same)."""
    cluster, allocator, view = kept.cluster, kept.allocator, kept.view
    ref_cluster, ref_allocator, ref_view = rebuilt.cluster, rebuilt.allocator, rebuilt.view
    differences = [
        name for name in CLUSTER_PARTS if getattr(cluster, name) != getattr(ref_cluster, name)
    ]
    if down_gpus(cluster) != down_gpus(ref_cluster):
        differences.append("down")
    allocations = {job: _allocation_key(a) for job, a in allocator.allocations().items()}
    reference = {job: _allocation_key(a) for job, a in ref_allocator.allocations().items()}
    if allocations != reference:
        differences.append("allocations")
    if allocator.unavailable_gpus() != ref_allocator.unavailable_gpus():
        differences.append("unavailable")
    differences += [name for name in VIEW_PARTS if getattr(view, name) != getattr(ref_view, name)]
    return differences


def compare_policies(policies: Iterable[KeptPolicy], snapshot: Snapshot) -> list[str]:
    """``policy NAME`` for each kept policy whose decisions on ``snapshot`` differ from a
    fresh core's (its wrapped policy's own ``schedule``); empty: all the same."""
    return [
        f"policy {kept.name}"
        for kept in policies
        if kept.schedule(snapshot, placement=CountPlacement())
        != kept.policy.schedule(snapshot, placement=CountPlacement())
    ]


def record_mismatch() -> None:
    """Count one mismatch where ``/metrics`` reads it (every process adds to one count)."""
    try:
        redis.Redis.from_url(settings.REDIS_URL).hincrby(TICK_STATS_KEY, MISMATCH_FIELD, 1)
    except redis.RedisError:
        log.warning("could not count a tick state mismatch in Redis")


_kept: KeptState | None = None


def kept_state() -> KeptState:
    """This process's kept state (created empty: its first refresh reads everything).

    Refused on any database but PostgreSQL: its queries read PostgreSQL's row
    versions (``xmin``, ``ctid``); ``source_for_tick`` rebuilds in full there.
    """
    if connection.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"the kept tick state needs PostgreSQL (this database: {connection.vendor})"
        )
    global _kept
    if _kept is None:
        _kept = KeptState()
    return _kept


def has_kept_state() -> bool:
    """Whether this process keeps a state now (False after an error, and in a new process)."""
    return _kept is not None


def forget() -> None:
    """Drop the kept state: after an error, or in tests (the next tick reads everything)."""
    global _kept
    _kept = None


def source_for_tick() -> ClusterSource:
    """The kept state when ``TICK_INCREMENTAL`` and PostgreSQL, else the full rebuild."""
    if settings.TICK_INCREMENTAL and connection.vendor == "postgresql":
        return kept_state()
    return FullRebuild()
