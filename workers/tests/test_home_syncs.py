"""A running session's home synced every period, off the supervision pass; its final sync
after any in flight; a lab that ended while its agent was down synced at the next start.

Real Redis, the real artifact store (a directory) and real folders; the store of a test
that needs a sync held in flight is the real one whose blob uploads wait for the test to
let them go (``Recorded.held``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import redis

from workers.agent import service
from workers.agent.agent import Agent
from workers.agent.cleanup import CleanupSettings
from workers.agent.config import AgentConfig, AgentConfigError, AgentEnvironment
from workers.agent.home_plan import Base, HomeLimits, parse_manifest
from workers.agent.homes import MANIFEST, SyncResult, restore, sync
from workers.agent.lab import HomeSyncs, LabHome, LabHomes
from workers.agent.programs import JobDirs
from workers.agent.store import AgentStore, WorkerRecord
from workers.artifacts import ArtifactStore, StoredObject
from workers.clock import ManualClock
from workers.protocol import Program, Report, WorkerExited
from workers.signing import key_to_text, master_secret, node_key

PREFIX = "homes/acme/7"
PROGRAM = Program(
    code="a" * 64,
    code_path="code/bundle.tar.gz",
    entrypoint=("lab",),
    launcher="session",
    home_prefix=PREFIX + "/",
    home_quota_mib=1,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Recorded:
    """Opens the real store at a URL, recording every object written through it; while
    ``held`` is set up, each blob upload waits for it (a slow upload the test controls)."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.held: threading.Event | None = None
        self.uploading = threading.Event()
        """Set once an upload waits for ``held``."""

    def __call__(self, url: str) -> ArtifactStore:
        return _RecordingStore(url, self)

    def blobs(self) -> list[str]:
        return [rel.rpartition("/")[2] for rel in self.written if "/blobs/" in rel]


class _RecordingStore(ArtifactStore):
    def __init__(self, url: str, recorded: Recorded) -> None:
        super().__init__(url)
        self.recorded = recorded

    def put_bytes(self, rel: str, data: bytes) -> StoredObject:
        self.recorded.written.append(rel)
        return super().put_bytes(rel, data)

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        self.recorded.written.append(rel)
        held = self.recorded.held
        if held is not None and "/blobs/" in rel:
            self.recorded.uploading.set()
            assert held.wait(60), "the test never let the upload go"
        return super().put_stream(rel, chunks)


class Observed(LabHomes):
    """The agent's ``LabHomes``, keeping the order of the syncs it ran."""

    def __init__(self, client: redis.Redis, node: str, url: str, recorded: Recorded) -> None:
        super().__init__(client, node, url, open_store=recorded)
        self.runs: list[tuple[str, bool]] = []

    def sync(
        self, job: str, worker_id: str, home: Path, *, final: bool = True
    ) -> SyncResult | None:
        self.runs.append((f"{job}/{worker_id}", final))
        return super().sync(job, worker_id, home, final=final)


@pytest.fixture
def node(redis_url: str) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"agent:{name}:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    recorded = Recorded()
    yield recorded
    if recorded.held is not None:  # a failed test must not leave the sync thread waiting
        recorded.held.set()


@pytest.fixture
def homes(redis_url: str, node: str, store_url: str, recorded: Recorded) -> Iterator[Observed]:
    client = redis.Redis.from_url(redis_url)
    yield Observed(client, node, store_url, recorded)
    client.close()


def stored(store_url: str) -> dict[str, str]:
    """The stored home's files: path -> sha256."""
    with ArtifactStore(store_url).open_read(f"{PREFIX}/{MANIFEST}") as stream:
        return {f.path: f.sha256 for f in parse_manifest(stream.read()).files}


def manifest_bytes(store_url: str) -> bytes:
    with ArtifactStore(store_url).open_read(f"{PREFIX}/{MANIFEST}") as stream:
        return stream.read()


def started_lab(syncs: HomeSyncs, tmp_path: Path, job: str = "job-1") -> LabHome:
    """A lab whose home was restored (a record kept), as the agent does before Jupyter."""
    lab = LabHome(job, "w0", tmp_path / "jobs" / job / "scratch" / "w0")
    lab.path.parent.mkdir(parents=True)  # the agent's (``JobDirs.create``)
    assert syncs.restore(lab.job, lab.worker_id, PROGRAM, lab.path, None) is not None
    return lab


# -- periodic syncs -----------------------------------------------------------------------


def test_each_period_uploads_what_changed_and_an_unchanged_home_writes_nothing(
    homes: Observed, recorded: Recorded, store_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    syncs = HomeSyncs(homes, clock, every_s=600)
    lab = started_lab(syncs, tmp_path)
    (lab.path / "a.ipynb").write_bytes(b"v1")
    (lab.path / "b.py").write_bytes(b"kept")
    syncs.schedule([lab])  # first seen: its first sync is one period away
    clock.advance(599)
    syncs.schedule([lab])
    assert syncs.wait(10) and homes.runs == [] and recorded.written == []

    clock.advance(1)
    syncs.schedule([lab])
    assert syncs.wait(30) and homes.runs == [("job-1/w0", False)]
    assert stored(store_url) == {"a.ipynb": sha(b"v1"), "b.py": sha(b"kept")}
    record = homes.record("job-1", "w0")  # kept (the lab runs on), its base moved on
    assert record is not None
    assert Base.decode(record.base) == Base(sha(manifest_bytes(store_url)))

    # One file changed: its content alone is uploaded.
    recorded.written.clear()
    (lab.path / "a.ipynb").write_bytes(b"v2")
    clock.advance(600)
    syncs.schedule([lab])
    assert syncs.wait(30)
    assert recorded.blobs() == [sha(b"v2")]
    assert stored(store_url) == {"a.ipynb": sha(b"v2"), "b.py": sha(b"kept")}

    # Nothing changed: the plan uploads nothing, and nothing at all is written.
    recorded.written.clear()
    before = manifest_bytes(store_url)
    clock.advance(600)
    syncs.schedule([lab])
    assert syncs.wait(30) and len(homes.runs) == 3
    assert recorded.written == [] and manifest_bytes(store_url) == before

    # A file deleted in the session goes from the home: each sync stands on the last one's
    # manifest (a stale base would merge the deleted file back).
    (lab.path / "b.py").unlink()
    clock.advance(600)
    syncs.schedule([lab])
    assert syncs.wait(30)
    assert stored(store_url) == {"a.ipynb": sha(b"v2")}


def test_an_unchanged_home_syncs_without_writing(store_url: str, tmp_path: Path) -> None:
    """``homes.sync`` itself: the second sync of the same files is ``identical``."""
    home = tmp_path / "home"
    (home / "nb").mkdir(parents=True)
    (home / "nb" / "x.ipynb").write_bytes(b"{}")
    recorded = Recorded()
    first = sync(recorded(store_url), PREFIX, home, 1 << 20)
    assert first.manifest_written and not first.identical and recorded.blobs() == [sha(b"{}")]
    recorded.written.clear()
    again = sync(recorded(store_url), PREFIX, home, 1 << 20, base=first.base)
    assert again.manifest_written and again.identical and recorded.written == []
    assert again.base == first.base and (again.files, again.unchanged) == (1, 1)
    assert "unchanged since it was stored" in again.message


def test_a_period_of_0_syncs_only_at_the_end(
    homes: Observed, store_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    syncs = HomeSyncs(homes, clock, every_s=0)
    lab = started_lab(syncs, tmp_path)
    (lab.path / "a.ipynb").write_bytes(b"v1")
    for _ in range(5):
        syncs.schedule([lab])
        clock.advance(3600)
    assert syncs.wait(10) and homes.runs == []
    assert syncs.final(lab)
    assert syncs.wait(30) and homes.runs == [("job-1/w0", True)]
    assert stored(store_url) == {"a.ipynb": sha(b"v1")}
    assert homes.record("job-1", "w0") is None  # the lab has gone: its record with it


def test_the_final_sync_runs_after_a_periodic_one_in_flight_and_wins(
    homes: Observed, recorded: Recorded, store_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    syncs = HomeSyncs(homes, clock, every_s=600)
    lab = started_lab(syncs, tmp_path)
    (lab.path / "a.ipynb").write_bytes(b"v1")
    (lab.path / "old.txt").write_bytes(b"old")
    recorded.held = threading.Event()
    syncs.schedule([lab])
    clock.advance(600)
    syncs.schedule([lab])  # returns at once: the sync runs in its own thread
    assert recorded.uploading.wait(30)
    assert syncs.jobs() == {"job-1"}
    # The session goes on while its periodic sync uploads: a file changes, one goes...
    (lab.path / "a.ipynb").write_bytes(b"v2")
    (lab.path / "old.txt").unlink()
    clock.advance(600)
    syncs.schedule([lab])  # ...no second sync of the same home meanwhile...
    assert syncs.final(lab)  # ...and its lab ends.
    recorded.held.set()
    assert syncs.wait(30)
    assert homes.runs == [("job-1/w0", False), ("job-1/w0", True)]
    assert stored(store_url) == {"a.ipynb": sha(b"v2")}  # as the session left it
    assert homes.record("job-1", "w0") is None and syncs.jobs() == frozenset()
    back = restore(ArtifactStore(store_url), PREFIX, tmp_path / "next", 1 << 20)
    assert back.restored == ("a.ipynb",) and (tmp_path / "next" / "a.ipynb").read_bytes() == b"v2"


def test_a_queued_periodic_sync_gives_way_to_the_final_one(
    homes: Observed, recorded: Recorded, store_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    syncs = HomeSyncs(homes, clock, every_s=600)
    one, two = started_lab(syncs, tmp_path, "job-1"), started_lab(syncs, tmp_path, "job-2")
    for lab in (one, two):
        (lab.path / f"{lab.job}.txt").write_bytes(lab.job.encode())
    recorded.held = threading.Event()
    syncs.schedule([one, two])
    clock.advance(600)
    syncs.schedule([one, two])  # one's sync uploads (held), two's waits in the queue
    assert recorded.uploading.wait(30)
    assert syncs.final(two)  # two's lab ends: its last sync takes its periodic one's place
    assert syncs.final(two)  # (said twice: still one)
    recorded.held.set()
    assert syncs.wait(30)
    assert homes.runs == [("job-1/w0", False), ("job-2/w0", True)]


def test_files_left_out_are_said_once_per_change_not_every_period(
    homes: Observed, store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Left out over the quota: a warning at the periodic sync that first leaves it out (or
    another), not at every period; the rest of the home is stored."""
    clock = ManualClock()
    syncs = HomeSyncs(homes, clock, every_s=600)
    lab = started_lab(syncs, tmp_path)
    (lab.path / "notes.md").write_bytes(b"small")
    (lab.path / "data.bin").write_bytes(b"x" * (2 << 20))  # over the 1 MiB quota
    syncs.schedule([lab])
    # Each period: what the session wrote before it (None: nothing), and its files.
    periods: list[tuple[str, bytes] | None] = [
        None,  # the first sync: data.bin left out, said
        None,  # nothing changed: not worth a line above debug
        ("notes.md", b"changed"),  # synced, the same file left out: said plainly
        ("more.bin", b"y" * (2 << 20)),  # another left out: said
        None,
    ]
    with caplog.at_level(logging.DEBUG, logger="workers.agent.lab"):
        for written in periods:
            if written is not None:
                (lab.path / written[0]).write_bytes(written[1])
            clock.advance(600)
            syncs.schedule([lab])
            assert syncs.wait(30)
    said = [r.levelno for r in caplog.records if "data.bin" in r.getMessage()]
    assert said == [logging.WARNING, logging.DEBUG, logging.INFO, logging.WARNING, logging.DEBUG]
    assert stored(store_url) == {"notes.md": sha(b"changed")}


# -- the setting --------------------------------------------------------------------------


def test_the_period_is_read_from_the_environment_and_junk_is_refused(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://x", "PORTAL_DATA_DIR": str(tmp_path)}
    assert AgentEnvironment.read(env).session_home_sync_s == 600.0
    assert AgentEnvironment.read({**env, "SESSION_HOME_SYNC_SECONDS": "0"}).session_home_sync_s == 0
    read = AgentEnvironment.read({**env, "SESSION_HOME_SYNC_SECONDS": " 90.5 "})
    assert read.session_home_sync_s == 90.5
    for junk in ("soon", "-1", "nan", "inf", "1e999", "10s"):
        with pytest.raises(AgentConfigError, match="SESSION_HOME_SYNC_SECONDS"):
            AgentEnvironment.read({**env, "SESSION_HOME_SYNC_SECONDS": junk})


# -- a lab that ended while its agent was down ------------------------------------------


class Reports:
    def __init__(self) -> None:
        self.sent: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.sent.append(report)


def make_agent(node: str, redis_url: str, tmp_path: Path, store_url: str) -> tuple[Agent, Reports]:
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=1,
        redis_url=redis_url,
        data_dir=tmp_path / "data",
        artifact_url=store_url,
        cleanup=CleanupSettings(keep_s=0.0),  # an ended job's folder goes at the first clean
    )
    sent = Reports()
    return Agent(config, AgentStore.from_url(redis_url, node), send=sent), sent


def lab_left_behind(agent: Agent, job: str) -> Path:
    """What an agent leaves of a lab that ends while it is down: the lab's worker record,
    its home's record, and its HOME with the session's files; the HOME."""
    home = JobDirs(agent.config.job_dir(job)).scratch("w0")
    home.parent.mkdir(parents=True)
    assert agent.homes.restore(job, "w0", PROGRAM, home, None) is not None
    (home / "work.ipynb").write_bytes(b"a day of work")
    log_path = agent.config.log_path(job, "w0")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    # pid 0 is never a lab's: this worker is gone when the next agent starts.
    record = WorkerRecord(job, "w0", 0, 0, str(log_path), 0.0, rank=0, launcher="session")
    agent.store.save_worker(record)
    return home


def test_a_lab_that_ended_while_its_agent_was_down_is_synced_before_its_folder_goes(
    node: str, redis_url: str, tmp_path: Path, store_url: str, recorded: Recorded
) -> None:
    before, _ = make_agent(node, redis_url, tmp_path, store_url)
    home = lab_left_behind(before, "job-9")

    agent, sent = make_agent(node, redis_url, tmp_path, store_url)  # its next process
    agent.homes.open_store = recorded
    recorded.held = threading.Event()
    agent.restore()
    assert recorded.uploading.wait(30)  # the home's upload is under way...
    assert [r.outcome for r in sent.sent if isinstance(r, WorkerExited)] == ["lost"]
    agent.tick()  # ...the pass goes on meanwhile; the job is not settled...
    assert "job-9" in agent.events.jobs
    agent.clean()  # ...and its folder stays
    assert (home / "work.ipynb").is_file()

    recorded.held.set()
    assert agent.home_syncs.wait(30)
    assert stored(store_url) == {"work.ipynb": sha(b"a day of work")}
    assert agent.homes.records() == {}
    agent.tick()
    assert "job-9" not in agent.events.jobs  # settled once its home was stored
    agent.clean()
    assert not agent.config.job_dir("job-9").exists()  # and only then cleaned

    # Synced once: the next start (and cleaning) finds nothing left to sync.
    recorded.written.clear()
    again, _ = make_agent(node, redis_url, tmp_path, store_url)
    again.homes.open_store = recorded
    again.restore()
    again.clean()
    assert again.home_syncs.wait(10) and recorded.written == []
    for each in (agent, again):
        each.close()


def test_a_home_record_whose_folder_has_gone_is_dropped(
    node: str,
    redis_url: str,
    tmp_path: Path,
    store_url: str,
    recorded: Recorded,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before, _ = make_agent(node, redis_url, tmp_path, store_url)
    home = lab_left_behind(before, "job-8")
    for path in sorted(home.parent.parent.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()  # the folder went (an operator)
    agent, _ = make_agent(node, redis_url, tmp_path, store_url)
    agent.homes.open_store = recorded
    with caplog.at_level(logging.WARNING, logger="workers.agent.lab"):
        agent.restore()
    assert agent.home_syncs.wait(10)
    assert agent.homes.records() == {} and recorded.written == []
    assert not (tmp_path / "store" / PREFIX / MANIFEST).exists()
    assert any("has gone" in r.getMessage() and "job-8" in r.getMessage() for r in caplog.records)
    agent.close()


def test_a_running_lab_s_home_is_not_taken_for_one_left_behind(
    node: str, redis_url: str, tmp_path: Path, store_url: str, recorded: Recorded
) -> None:
    """``sync_left_behind`` skips a home whose lab runs here, and one with a sync queued."""
    agent, _ = make_agent(node, redis_url, tmp_path, store_url)
    agent.homes.open_store = recorded
    lab_left_behind(agent, "job-7")

    def home_of(job: str, worker_id: str) -> Path:
        return JobDirs(agent.config.job_dir(job)).scratch(worker_id)

    queued = agent.home_syncs.sync_left_behind(lambda job, worker: job == "job-7", home_of)
    assert queued == [] and list(agent.homes.records()) == [("job-7", "w0")]
    recorded.held = threading.Event()
    queued = agent.home_syncs.sync_left_behind(lambda job, worker: False, home_of)
    assert queued == ["job-7/w0"] and recorded.uploading.wait(30)
    again = agent.home_syncs.sync_left_behind(lambda job, worker: False, home_of)
    assert again == []  # in flight already
    recorded.held.set()
    assert agent.home_syncs.wait(30) and agent.homes.records() == {}
    agent.close()


def node_config(tmp_path: Path, **settings: str) -> AgentConfig:
    """The config the agent service makes for node ``n1`` from an environment with
    ``settings`` (``service.config_from_options``, as a node starts it)."""
    key = key_to_text(node_key(master_secret("k", ""), "n1"))
    env = {"REDIS_URL": "redis://127.0.0.1:1/0", "PORTAL_DATA_DIR": str(tmp_path), "AGENT_KEY": key}
    options = service.build_parser().parse_args(["--node", "n1", "--cpu", "--gpus", "1"])
    return service.config_from_options(options, environ={**env, **settings})


def test_the_agent_service_carries_the_period_from_its_environment(tmp_path: Path) -> None:
    """``SESSION_HOME_SYNC_SECONDS`` reaches the agent a node runs (``service``), not only
    its environment's parse: 42 s as set, 600 s unset."""
    assert node_config(tmp_path, SESSION_HOME_SYNC_SECONDS="42").session_home_sync_s == 42
    assert node_config(tmp_path).session_home_sync_s == 600


def test_the_homes_limits_reach_the_agent_and_junk_stops_it(tmp_path: Path) -> None:
    """``SESSION_HOME_MAX_*`` (docs/artifacts.md) reach the agent a node runs; a bad value
    stops it at start, naming the variable."""
    limits = node_config(tmp_path, SESSION_HOME_MAX_FILES="7", SESSION_HOME_MAX_DEPTH="3")
    assert (limits.home_limits.max_files, limits.home_limits.max_depth) == (7, 3)
    with pytest.raises(AgentConfigError, match="SESSION_HOME_MAX_FILES"):
        node_config(tmp_path, SESSION_HOME_MAX_FILES="lots")


def test_the_agents_home_limits_bound_what_a_sync_keeps(
    redis_url: str, node: str, store_url: str, tmp_path: Path
) -> None:
    """``LabHomes`` syncs within the limits it was given (the agent's ``home_limits``): at
    most ``max_files`` files, no deeper than ``max_depth``."""
    client = redis.Redis.from_url(redis_url)
    try:
        limited = LabHomes(client, node, store_url, limits=HomeLimits(max_files=2, max_depth=1))
        syncs = HomeSyncs(limited, ManualClock(), every_s=0)
        lab = started_lab(syncs, tmp_path)
        for name in ("a.md", "b.md", "c.md"):
            (lab.path / name).write_bytes(name.encode() * 10)
        (lab.path / "deep" / "er").mkdir(parents=True)
        (lab.path / "deep" / "er" / "d.md").write_bytes(b"deep")
        result = limited.sync(lab.job, lab.worker_id, lab.path)
        assert result is not None and result.manifest_written
        kept = stored(store_url)
        assert len(kept) == 2 and "deep/er/d.md" not in kept
    finally:
        client.close()
