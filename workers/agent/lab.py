"""The labs this agent serves: one relay per running session worker of rank 0.

``Labs.sync`` runs on each supervision pass (``Agent.tick``) with the process table's
records: a session's lab worker that runs gets a ``LabRelay`` (its token read from the
agent's own keys, ``LabTokens``), one that has gone loses it.  Each relay's reading of
Jupyter's status becomes a ``LabActivity`` report.

Tokens live in ``agent:<node>:lab-tokens`` (the agent's own key space, which no job's
Redis user reaches): made at the lab's start (``LabTokens.issue``), read again by an agent
that restarted and adopted the lab, dropped when the lab goes.  They never leave the node.

A lab's persistent home (``workers.agent.homes``) is restored before Jupyter starts
(``LabHomes.restore``, which keeps a ``HomeRecord`` in ``agent:<node>:lab-homes``) and
synced back by ``HomeSyncs``, one sync at a time in a thread of its own, so that hashing
and uploading a large home never holds up the supervision pass::

    Agent.tick ── HomeSyncs.schedule(running labs)  every SESSION_HOME_SYNC_SECONDS: periodic
              └─ Labs._end (the lab has gone) ─ HomeSyncs.final     drops its queued periodic
    Agent.restore / Agent.clean ─ HomeSyncs.sync_left_behind        a record with no lab:
                                                                    final, or forgotten if
                                                                    its folder has gone
    thread "home-sync":  queue (FIFO) ─> LabHomes.sync ─> periodic: the record's base moves on
                                                       └> final: the record is dropped

A final sync runs after any sync of its home already in flight, and none runs after it,
so the stored home ends as the session left it; the agent reports the job stopped only
once it is done (``HomeSyncs.jobs``), and its folder is not cleaned up before.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import redis

from workers.agent import homes
from workers.agent.config import AgentConfig
from workers.agent.home_plan import DEFAULT_LIMITS, Base, HomeLimits
from workers.agent.lab_launch import new_token
from workers.agent.lab_relay import LabRelay, LabStatus
from workers.agent.store import WorkerRecord
from workers.artifacts import ArtifactStore
from workers.clock import Clock
from workers.elastic.redis_client import connect
from workers.lab_protocol import ACTIVITY_EVERY_S, base_url_of
from workers.protocol import LabActivity, Program, ProtocolError, Report, check_name

log = logging.getLogger(__name__)

SESSION = "session"
MIB = 1024 * 1024


def is_lab(record: WorkerRecord) -> bool:
    """Whether ``record`` is the worker that runs a session's JupyterLab (its rank 0)."""
    return record.launcher == SESSION and (record.rank or 0) == 0


class LabTokens:
    """The labs' tokens on this node, kept in the agent's own Redis keys."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.client = client
        self.key = f"agent:{node}:lab-tokens"

    def issue(self, job: str, worker_id: str) -> str:
        """A new token for the lab of ``job``/``worker_id`` (replacing an older one)."""
        token = new_token()
        self.client.hset(self.key, f"{job}/{worker_id}", token)
        return token

    def get(self, job: str, worker_id: str) -> str | None:
        value = self.client.hget(self.key, f"{job}/{worker_id}")
        return value.decode() if isinstance(value, bytes) else value

    def drop(self, job: str, worker_id: str) -> None:
        self.client.hdel(self.key, f"{job}/{worker_id}")


@dataclass(frozen=True)
class HomeRecord:
    """What a lab's home sync needs, kept from its restore (across an agent restart);
    ``base`` moves on with each periodic sync that writes the home."""

    prefix: str
    quota_bytes: int
    owner: tuple[int, int] | None
    base: str

    def encode(self) -> str:
        return json.dumps(
            {
                "prefix": self.prefix,
                "quota": self.quota_bytes,
                "owner": self.owner,
                "base": self.base,
            }
        )

    @classmethod
    def decode(cls, text: str | bytes) -> HomeRecord:
        """The record ``encode`` wrote; ``ValueError`` for anything else."""
        try:
            raw = json.loads(text)
            owner = raw["owner"]
            return cls(
                prefix=str(raw["prefix"]),
                quota_bytes=int(raw["quota"]),
                owner=(int(owner[0]), int(owner[1])) if owner else None,
                base=str(raw["base"]),
            )
        except (ValueError, TypeError, KeyError, IndexError):
            raise ValueError(f"not a lab's home record: {str(text)[:100]!r}") from None


StoreOpener = Callable[[str], homes.HomeStore]
"""The artifact store at a URL (``ArtifactStore``; a test's slower one)."""


class LabHomes:
    """Each session's persistent home (``workers.agent.homes``): restored into the lab's
    HOME before Jupyter starts, synced back while it runs and once it has gone
    (``HomeSyncs`` calls ``sync``); what each needs is kept in the agent's own keys."""

    def __init__(
        self,
        client: redis.Redis,
        node: str,
        artifact_url: str,
        *,
        open_store: StoreOpener = ArtifactStore,
        limits: HomeLimits = DEFAULT_LIMITS,
    ) -> None:
        self.client = client
        self.key = f"agent:{node}:lab-homes"
        self.artifact_url = artifact_url
        self.open_store = open_store
        self.limits = limits

    def restore(
        self, job: str, worker_id: str, program: Program, home: Path, owner: tuple[int, int] | None
    ) -> str | None:
        """Fill ``home`` from ``program.home_prefix`` (within ``home_quota_mib``); what it
        did, in one line (None: the session has no persistent home here)."""
        if not (program.home_prefix and program.home_quota_mib > 0 and self.artifact_url):
            return None
        prefix = program.home_prefix.rstrip("/")
        quota = program.home_quota_mib * MIB
        store = self.open_store(self.artifact_url)
        result = homes.restore(store, prefix, home, quota, owner=owner, limits=self.limits)
        record = HomeRecord(prefix, quota, owner, result.base.encode())
        self.client.hset(self.key, f"{job}/{worker_id}", record.encode())
        log.info("lab of %s: %s", job, result.message)
        return result.message

    def record(self, job: str, worker_id: str) -> HomeRecord | None:
        """The home record of the lab of ``job``/``worker_id`` (None: it has no home here);
        ``ValueError`` if what is kept is not one."""
        raw = self.client.hget(self.key, f"{job}/{worker_id}")
        return None if raw is None else HomeRecord.decode(raw)

    def records(self) -> dict[tuple[str, str], HomeRecord | None]:
        """Every home record kept here, by (job, worker id); None for one that cannot be read."""
        out: dict[tuple[str, str], HomeRecord | None] = {}
        for raw_key, raw in self.client.hgetall(self.key).items():
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            job, _, worker_id = key.partition("/")
            try:
                out[(job, worker_id)] = HomeRecord.decode(raw)
            except ValueError:
                out[(job, worker_id)] = None
        return out

    def drop(self, job: str, worker_id: str) -> None:
        """Forget the home record of the lab of ``job``/``worker_id``."""
        self.client.hdel(self.key, f"{job}/{worker_id}")

    def sync(
        self, job: str, worker_id: str, home: Path, *, final: bool = True
    ) -> homes.SyncResult | None:
        """Store ``home`` back as the user's home (None: it has none here).  A written home
        moves the record's base on (``periodic``), or drops the record (``final``: the lab
        has gone); a sync that wrote nothing leaves it, for the next try."""
        record = self.record(job, worker_id)
        if record is None:
            return None
        result = homes.sync(
            self.open_store(self.artifact_url),
            record.prefix,
            home,
            record.quota_bytes,
            owner=record.owner,
            base=Base.decode(record.base),
            limits=self.limits,
        )
        if result.manifest_written and final:
            self.drop(job, worker_id)
        elif result.manifest_written and result.base is not None:
            moved = replace(record, base=result.base.encode())
            self.client.hset(self.key, f"{job}/{worker_id}", moved.encode())
        return result


@dataclass(frozen=True)
class LabHome:
    """A lab's HOME on this node: whose it is, and its folder."""

    job: str
    worker_id: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.job}/{self.worker_id}"


@dataclass(frozen=True)
class HomeSync:
    """One sync for ``HomeSyncs``' thread: ``final`` once the lab has gone (the record is
    dropped when the home is stored), else periodic while it runs; ``prefix`` is the
    user's home in the store (a restore of it waits for the sync, ``wait_for_prefix``)."""

    home: LabHome
    prefix: str
    final: bool


Gist = tuple[bool, tuple[str, ...]]
"""What is worth telling of a sync: whether it failed, and the files it left out."""


class HomeSyncs:
    """The labs' home syncs, one at a time, in a thread of their own (see the module).

    ``every_s``: the period of a running lab's syncs (0: only its final sync).  Methods
    are called from the supervision pass; the thread calls ``LabHomes.sync`` and nothing
    of the agent's, so a caller holding the agent's lock may wait for it.
    """

    def __init__(
        self, homes: LabHomes, clock: Clock, every_s: float, *, restore_wait_s: float = 10.0
    ) -> None:
        self.homes = homes
        self.clock = clock
        self.every_s = every_s
        self.restore_wait_s = restore_wait_s
        self._guard = threading.Condition()
        self._queue: deque[HomeSync] = deque()
        self._running: HomeSync | None = None
        self._serving = False
        """Whether a thread serves the queue (one at most; it ends when the queue is empty)."""
        self._due: dict[str, float] = {}
        """Each running lab's next periodic sync (``clock.monotonic``), by ``LabHome.key``."""
        self._told: dict[str, Gist] = {}
        """What the last periodic sync of each lab had worth telling (said once, not each
        period)."""

    # -------------------------------------------------------------- from the agent's pass
    def schedule(self, labs: Iterable[LabHome]) -> None:
        """Queue a periodic sync of each running lab (``labs``) whose period has passed since
        it was first seen or last queued; none while a sync of its home is queued or runs."""
        if self.every_s <= 0:
            return
        now = self.clock.monotonic()
        running = {lab.key: lab for lab in labs}
        due = []
        with self._guard:
            for key in [key for key in self._due if key not in running]:
                del self._due[key]
            busy = self._keys()
            for key, lab in running.items():
                if now < self._due.setdefault(key, now + self.every_s):
                    continue
                self._due[key] = now + self.every_s
                if key not in busy:
                    due.append(lab)
        for lab in due:
            try:
                record = self.homes.record(lab.job, lab.worker_id)
            except (redis.RedisError, ValueError) as exc:  # tried again at the next period
                log.warning("lab of %s: its home was not synced: %s", lab.job, exc)
                continue
            if record is not None:
                self._push(HomeSync(lab, record.prefix, final=False))

    def restore(
        self, job: str, worker_id: str, program: Program, home: Path, owner: tuple[int, int] | None
    ) -> str | None:
        """``LabHomes.restore``, once no sync of the same user's home is under way here (a
        user's next session must find what the last one stored), waiting up to
        ``restore_wait_s``; after that it restores what is stored (the late sync is merged
        by the next one of this session: see ``homes.sync``).  It runs under the agent's
        lock (the start of a command), so it waits seconds at most: a heartbeat waits too."""
        prefix = program.home_prefix.rstrip("/")
        if prefix and not self.wait_for_prefix(prefix, self.restore_wait_s):
            log.warning(
                "lab of %s: a sync of its home %s is still under way after %.0f s: restoring "
                "what is stored",
                job,
                prefix,
                self.restore_wait_s,
            )
        return self.homes.restore(job, worker_id, program, home, owner)

    def final(self, lab: LabHome) -> bool:
        """The lab has gone: queue its home's last sync, after any sync of it in flight and
        in place of a queued periodic one; False when it has no home here."""
        with self._guard:
            self._due.pop(lab.key, None)
            self._told.pop(lab.key, None)
            self._queue = deque(s for s in self._queue if s.home.key != lab.key or s.final)
            if any(s.final for s in self._queue if s.home.key == lab.key):
                return True
        record = self.homes.record(lab.job, lab.worker_id)
        if record is None:
            return False
        self._push(HomeSync(lab, record.prefix, final=True))
        return True

    def sync_left_behind(
        self, runs: Callable[[str, str], bool], home_of: Callable[[str, str], Path]
    ) -> list[str]:
        """Queue the final sync of each home record whose lab no longer runs here (``runs``)
        and whose home has no sync queued: a lab that ended while the agent was down, or
        whose final sync failed.  A record whose folder (``home_of``) has gone, or that
        cannot be read, is dropped and logged.  The keys of the homes queued."""
        queued = []
        with self._guard:
            busy = self._keys()
        for (job, worker_id), record in self.homes.records().items():
            key = f"{job}/{worker_id}"
            if key in busy or (_is_name(job) and _is_name(worker_id) and runs(job, worker_id)):
                continue
            if record is None or not (_is_name(job) and _is_name(worker_id)):
                log.warning("a lab's home record %r cannot be read: dropped", key)
                self.homes.drop(job, worker_id)
                continue
            lab = LabHome(job, worker_id, home_of(job, worker_id))
            if not _is_folder(lab.path):
                log.warning(
                    "lab of %s: its home (%s) has gone while its last sync was due: "
                    "nothing stored, its record dropped",
                    job,
                    lab.path,
                )
                self.homes.drop(job, worker_id)
                continue
            log.info("lab of %s: ended while its home was not synced; syncing it now", job)
            self._push(HomeSync(lab, record.prefix, final=True))
            queued.append(key)
        return queued

    def jobs(self) -> frozenset[str]:
        """The jobs whose homes have a sync queued or running (not settled, not cleaned)."""
        with self._guard:
            return frozenset(s.home.job for s in self._pending())

    def wait_for_prefix(self, prefix: str, timeout: float) -> bool:
        """Wait until no sync of the user's home at ``prefix`` is queued or runs (a session
        of the same user starting here must find what the last one stored); False if one
        still is after ``timeout`` seconds."""
        with self._guard:
            return self._guard.wait_for(
                lambda: all(s.prefix != prefix for s in self._pending()), timeout
            )

    def wait(self, timeout: float) -> bool:
        """Wait until every queued sync is done; False if some still is after ``timeout``."""
        with self._guard:
            return self._guard.wait_for(lambda: not self._pending(), timeout)

    def close(self, timeout: float) -> bool:
        """The agent stops: drop the queued periodic syncs and wait (up to ``timeout``) for
        the final ones; one left undone is found again at the next start."""
        with self._guard:
            self._queue = deque(s for s in self._queue if s.final)
            self._due.clear()
        return self.wait(timeout)

    # -------------------------------------------------------------- the thread
    def _pending(self) -> list[HomeSync]:
        return [*self._queue, *([self._running] if self._running is not None else [])]

    def _keys(self) -> set[str]:
        return {s.home.key for s in self._pending()}

    def _push(self, sync: HomeSync) -> None:
        with self._guard:
            self._queue.append(sync)
            if self._serving:
                return
            self._serving = True
        threading.Thread(target=self._serve, name="home-sync", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._guard:
                if not self._queue:
                    self._serving = False
                    self._guard.notify_all()
                    return
                sync = self._running = self._queue.popleft()
            try:
                self._run(sync)
            except Exception:  # a store or Redis that is down must not end the thread
                log.exception("lab of %s: its home was not synced", sync.home.job)
            finally:
                with self._guard:
                    self._running = None
                    self._guard.notify_all()

    def _run(self, sync: HomeSync) -> None:
        lab = sync.home
        result = self.homes.sync(lab.job, lab.worker_id, lab.path, final=sync.final)
        if result is None:
            return
        gist: Gist = (not result.manifest_written, tuple(path for path, _ in result.left_out))
        worth_telling = gist != (False, ())
        if sync.final:
            level = logging.WARNING if worth_telling else logging.INFO
            log.log(level, "lab of %s (at its end): %s", lab.job, result.message)
            return
        with self._guard:
            told = self._told.get(lab.key)
            self._told[lab.key] = gist
        if worth_telling and gist != told:
            level = logging.WARNING
        elif result.identical:
            level = logging.DEBUG  # an idle session: nothing to say every period
        else:
            level = logging.INFO
        log.log(level, "lab of %s: %s", lab.job, result.message)


def _is_name(value: str) -> bool:
    try:
        check_name(value, "a lab's home record")
    except ProtocolError:
        return False
    return True


def _is_folder(path: Path) -> bool:
    """Whether ``path`` is a folder itself (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


class Labs:
    """The relays of the session labs that run on this node."""

    def __init__(
        self,
        config: AgentConfig,
        send: Callable[[Report], object],
        *,
        activity_every_s: float = ACTIVITY_EVERY_S,
        on_gone: Callable[[WorkerRecord], object] = lambda record: None,
    ) -> None:
        self.config = config
        self._send = send
        self.activity_every_s = activity_every_s
        self.on_gone = on_gone
        """Called for a lab whose worker has gone, before the agent settles its job: its
        home's sync."""
        self.relays: dict[str, tuple[WorkerRecord, LabRelay]] = {}
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        """A client of the agent's Redis that keeps bytes as bytes (bodies are not text)."""
        if self._client is None:
            self._client = connect(self.config.redis_url, decode_responses=False)
        return self._client

    @property
    def tokens(self) -> LabTokens:
        return LabTokens(self.client, self.config.node)

    def sync(self, records: Iterable[WorkerRecord]) -> None:
        """A relay for every lab in ``records``, none for a lab that has gone."""
        running = {record.key: record for record in records if is_lab(record)}
        for key in list(self.relays):
            if key not in running:
                self._end(key)
        for key, record in running.items():
            if key not in self.relays:
                self._serve(record)

    def _serve(self, record: WorkerRecord) -> None:
        try:
            token = self.tokens.get(record.job, record.worker_id)
            base_url = base_url_of(record.job)
        except (redis.RedisError, ValueError) as exc:
            log.warning("lab of %s: not served: %s", record.job, exc)
            return
        if token is None:
            log.warning("lab of %s/%s has no token here: not served", record.job, record.worker_id)
            return
        relay = LabRelay(
            self.client,
            node=self.config.node,
            job=record.job,
            job_dir=Path(self.config.job_dir(record.job)),
            worker_id=record.worker_id,
            token=token,
            base_url=base_url,
            on_activity=functools.partial(self.report, record.job),
            activity_every_s=self.activity_every_s,
        )
        try:
            relay.start()
        except redis.RedisError as exc:  # tried again at the next pass
            log.warning("lab of %s: not served yet: %s", record.job, exc)
            return
        self.relays[record.key] = (record, relay)
        log.info("serving the lab of %s/%s", record.job, record.worker_id)

    def _end(self, key: str) -> None:
        record, relay = self.relays.pop(key)
        relay.stop()
        try:
            self.tokens.drop(record.job, record.worker_id)
        except redis.RedisError:
            log.exception("lab of %s: its token stays in Redis", record.job)
        try:
            self.on_gone(record)
        except Exception:  # a store that is down must not take the agent with it
            log.exception("lab of %s: its home was not synced", record.job)
        log.info("the lab of %s/%s has gone", record.job, record.worker_id)

    def report(self, job: str, status: LabStatus) -> None:
        """Tell the portal what the lab of ``job`` did last."""
        try:
            self._send(
                LabActivity(
                    node=self.config.node,
                    job=job,
                    last_activity=status.last_activity,
                    connections=status.connections,
                    kernels=status.kernels,
                )
            )
        except Exception:  # a report that cannot go now goes with the next poll
            log.exception("lab of %s: its activity was not reported", job)

    def close(self) -> None:
        """Stop every relay (the agent stops; the labs themselves run on)."""
        for _key, (_record, relay) in list(self.relays.items()):
            relay.stop()
        self.relays.clear()
