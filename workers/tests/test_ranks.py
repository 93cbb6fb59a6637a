"""Ranks in the allocation's order: the pure ordering, and real workers started out of order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.elastic import JobRun
from fabric.allocator import VClosAllocator
from fabric.contention import analyze
from fabric.routing import LinkIds, SourceRouting
from fabric.topology import FabricSpec
from fabric.traffic import Step, ring_allreduce
from jobs.agent_commands import (
    GpuHome,
    JobLaunch,
    gpu_of_worker,
    membership_commands,
    runtime_job_name,
    worker_id,
)
from workers.agent.agent import Agent
from workers.agent.config import AgentConfig
from workers.agent.launch import worker_argv
from workers.agent.store import AgentStore
from workers.elastic.cli import WorkerArgumentError, parse_options
from workers.elastic.control import JobControl
from workers.elastic.messages import request_from_entry
from workers.elastic.ranks import order_by_rank, parse_ranks, ring_neighbours
from workers.elastic.redis_io import read_stream
from workers.protocol import Command, Migrate, ProtocolError, Report, ScaleIn, StartWorkers

# Two leaves of two GPUs; the allocator's rank order starts on leaf B.
HOMES = {0: GpuHome("leaf-a", 0), 1: GpuHome("leaf-a", 1), 8: GpuHome("leaf-b", 0),
         9: GpuHome("leaf-b", 1)}  # fmt: skip
ALLOCATION = [8, 9, 0, 1]
ARRIVAL = ["w0", "w8", "w1", "w9"]


def leaf_crossings(pair: frozenset[str]) -> int:
    """1 when a ring edge crosses between the leaves (through a spine), else 0."""
    return len({HOMES[int(w[1:])].node for w in pair}) - 1


def test_order_by_rank_puts_unranked_workers_last_in_their_order() -> None:
    assert order_by_rank(["w0", "x", "w8", "y", "w9"], {"w8": 0, "w9": 1, "w0": 2}) == (
        "w8", "w9", "w0", "x", "y",
    )  # fmt: skip
    assert order_by_rank(["b", "a"], {"a": 1, "b": 1}) == ("a", "b")  # a tie: by name
    assert ring_neighbours(["a"]) == set()
    assert ring_neighbours(["a", "b", "c"]) == {
        frozenset(p) for p in (("a", "b"), ("b", "c"), ("c", "a"))
    }


def test_a_malformed_rank_in_redis_leaves_that_worker_unranked() -> None:
    assert parse_ranks({"w0": "2", "w1": "-1", "w2": "x", "w3": "", "w4": "1e9"}) == {"w0": 2}


@pytest.mark.parametrize("rank", ["-1", "1000000", "x"])
def test_worker_command_line_refuses_a_bad_rank(rank: str) -> None:
    argv = ["--job", "j", "--worker", "w0", "--workload", "mlp-digits", "--batch-size", "8",
            "--store-url", "/tmp/x", "--redis-url", "redis://h/0", "--rank", rank]  # fmt: skip
    with pytest.raises((WorkerArgumentError, SystemExit)):
        parse_options(argv)


def start_commands() -> list[StartWorkers]:
    """The control plane's commands to start a job on ``ALLOCATION``, leaf B's node last."""
    launch = JobLaunch(
        job_id=7, workload="mlp-digits", args={}, batch_size=64, recovery="consistent",
        checkpoint_every=10,
    )  # fmt: skip
    pairs = membership_commands(launch, [], ALLOCATION, HOMES, reason="start")
    commands = [c for _node, c in pairs if isinstance(c, StartWorkers)]
    return sorted(commands, key=lambda c: c.workers[0].worker_id)  # leaf A's node first


def test_two_leaf_job_ring_follows_the_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks the agent passes make the runtime's ring the allocation's ring."""
    monkeypatch.setenv("REDIS_URL", "redis://edl-j:pw@h/0")  # a built-in's, from its environment
    config = AgentConfig(
        node="n", device="cpu", slots=2, redis_url="redis://h/0", data_dir=tmp_path
    )
    ranks = {}
    for command in start_commands():
        for slot in command.workers:
            options = parse_options(worker_argv(config, command, slot)[3:])
            assert options.rank is not None
            ranks[options.worker_id] = options.rank
    # The two nodes' agents start their workers at once: they register interleaved.
    members = order_by_rank(ARRIVAL, ranks)
    assert members == tuple(f"w{g}" for g in ALLOCATION)
    ring = ring_neighbours(members)
    assert ring == ring_neighbours([f"w{g}" for g in ALLOCATION])
    assert sum(leaf_crossings(pair) for pair in ring) == 2  # the fewest a two-leaf ring has
    assert sum(leaf_crossings(pair) for pair in ring_neighbours(ARRIVAL)) == 4  # before


@pytest.fixture
def job(redis_url: str, tmp_path: Path) -> Iterator[JobRun]:
    run = JobRun(redis_url, f"t{uuid.uuid4().hex[:8]}", tmp_path)
    yield run
    run.terminate()
    run.control.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_workers_take_their_rank_from_the_allocation(job: JobRun) -> None:
    """Started interleaved, the workers train in the allocation's order; a newcomer too."""
    ranked = {f"w{g}": r for r, g in enumerate(ALLOCATION)}
    for worker in ARRIVAL:
        job.start(worker, len(ranked), ["--rank", str(ranked[worker])])
    job.wait_step(5)
    job.start("w2", extra=["--rank", "2"])  # between w9 (1) and w0 (2): a tie, by name
    grown = job.wait_event("scale_done", 90)
    assert list(grown["members"]) == ["w8", "w9", "w0", "w2", "w1"]
    job.wait_step(grown["step"] + 3)
    job.stop_and_wait()
    records = job.step_records_raw()
    gen0 = {r["worker"]: r["rank"] for r in records if r["gen"] == 0}
    assert gen0 == ranked
    gen1 = {r["worker"]: r["rank"] for r in records if r["gen"] == grown["generation"]}
    assert gen1 == {"w8": 0, "w9": 1, "w0": 2, "w2": 3, "w1": 4}


# -- the whole new order with every membership command (a re-plan orders the survivors too) --
REPLAN_HOMES = {g: GpuHome(f"leaf-{g // 8}", g % 8) for g in (0, 1, 8, 9, 16, 17)}
LAUNCH = JobLaunch(
    job_id=7, workload="mlp-digits", args={}, batch_size=64, recovery="consistent",
    checkpoint_every=10,
)  # fmt: skip


def test_every_membership_command_carries_the_new_plans_whole_order() -> None:
    moved = membership_commands(LAUNCH, [0, 1, 8, 9], [8, 9, 16, 17], REPLAN_HOMES, reason="m")
    [(node, migrate)] = moved
    assert node == "leaf-2" and isinstance(migrate, Migrate)
    assert migrate.rank_order == ("w8", "w9", "w16", "w17")
    assert migrate.joining.rank_order == migrate.rank_order
    assert [w.rank for w in migrate.joining.workers] == [2, 3]
    [(_, shrink)] = membership_commands(LAUNCH, [0, 1, 8, 9], [8, 9], REPLAN_HOMES, reason="s")
    assert isinstance(shrink, ScaleIn) and shrink.rank_order == ("w8", "w9")
    grown = membership_commands(LAUNCH, [8, 9], [16, 17, 8, 9], REPLAN_HOMES, reason="g")
    assert [c.rank_order for _, c in grown if isinstance(c, StartWorkers)] == [
        ("w16", "w17", "w8", "w9")
    ]


def test_a_command_without_an_order_still_parses_and_a_bad_order_request_is_refused() -> None:
    old = Command.from_dict(
        {"type": "scale_in", "job": "job-7", "command_id": "c1", "worker_ids": ["w0"]}
    )
    assert isinstance(old, ScaleIn) and old.rank_order == ()
    assert request_from_entry({"kind": "rank_order", "payload": '{"workers": ["w1", "w0"]}'})
    for payload in ('{"workers": []}', '{"workers": ["w1", "w1"]}', '{"workers": "w1"}'):
        with pytest.raises(ProtocolError):
            request_from_entry({"kind": "rank_order", "payload": payload})


def test_the_agent_hands_the_order_to_the_job_before_the_scale_in(
    redis_url: str, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    node = f"test-{uuid.uuid4().hex[:8]}"
    config = AgentConfig(node=node, device="cpu", slots=2, redis_url=redis_url, data_dir=tmp_path)
    agent = Agent(config, AgentStore.from_url(redis_url, node), send=lambda report: None)
    control = JobControl(redis_url, job)
    try:
        command = ScaleIn(job=job, command_id="s1", worker_ids=("w0",), rank_order=("w9", "w8"))
        assert agent.receive(command.to_dict()) == "applied"
        entries = [request_from_entry(f) for _id, f in read_stream(
            control.redis, control.keys.control, "0", 10)]  # fmt: skip
        assert [e.to_dict() for e in entries] == [
            {"kind": "rank_order", "workers": ["w9", "w8"]},
            {"kind": "scale_in", "workers": ["w0"], "reason": ""},
        ]
    finally:
        control.cleanup()
        for key in control.redis.scan_iter(match=f"agent:{node}:*"):
            control.redis.delete(key)


def test_the_link_analysis_finds_the_shared_link_of_a_ring_out_of_the_plans_order() -> None:
    """Why the order matters: a three-leaf vClos ring in another order shares a cable.

    (Two leaves cannot show it: under source routing any order of a two-leaf
    job stays on its own cables, with only more spine crossings.)
    """
    spec = FabricSpec(leaves=3, spines=2, servers_per_leaf=1, gpus_per_server=2)
    allocator = VClosAllocator(spec)
    job = allocator.allocate("j", 6)
    router = SourceRouting(spec, allocator.allocations())
    planned = analyze(spec, ring_allreduce(job.gpus, 1e6), router)
    assert not planned.any_contention
    arrival = [0, 2, 1, 4, 3, 5]  # as two nodes' workers might register, interleaved
    assert analyze(spec, ring_allreduce(arrival, 1e6), router).any_contention


def live_agents(
    redis_url: str, tmp_path: Path, nodes: list[str]
) -> dict[str, tuple[Agent, list[Report]]]:
    """One in-process agent per node (two slots each), its reports kept in a list."""
    agents = {}
    for node in nodes:
        config = AgentConfig(
            node=node, device="cpu", slots=2, redis_url=redis_url, data_dir=tmp_path / node
        )
        sent: list[Report] = []
        agent = Agent(config, AgentStore.from_url(redis_url, node), send=sent.append)
        agent.start()
        agents[node] = (agent, sent)
    return agents


def wait_for(job: JobControl, kind: str, where: Any, timeout: float) -> dict[str, Any]:
    """The first event of ``kind`` matching ``where`` (read from the start of the stream)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _id, event in job.read_events("0"):
            if event["kind"] == kind and where(event):
                return event
            if event["kind"] == "failed":
                raise AssertionError(f"a worker failed: {event}")
        time.sleep(0.2)
    raise TimeoutError(f"no {kind} event within {timeout}s")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_after_a_replan_the_live_ring_is_the_new_allocations_ring(
    redis_url: str, tmp_path: Path
) -> None:
    """A two-leaf job moved by one leaf: the survivors take the new plan's ranks too.

    Three leaves of two GPUs, one agent each. The job starts on leaves 0-1
    (GPUs 0-3); the re-plan moves it to leaves 1-2 (GPUs 2-5) with a migration.
    Survivors w2, w3 were ranks 2, 3 of the first plan, joiners w4, w5 are
    ranks 2, 3 of the new one: by those ranks the ring would be w2 w4 w3 w5,
    four spine crossings; the new plan's order is w2 w3 w4 w5, two.
    """
    spec = FabricSpec(leaves=3, spines=2, servers_per_leaf=1, gpus_per_server=2)
    allocator = VClosAllocator(spec)
    nodes = [f"leaf{leaf}-{uuid.uuid4().hex[:6]}" for leaf in range(spec.leaves)]
    homes = {g: GpuHome(nodes[spec.leaf_of(g)], g % 2) for g in range(spec.total_gpus)}
    launch = JobLaunch(
        job_id=int(uuid.uuid4().int % 10**9), workload="mlp-digits",
        args={"epochs": 1000, "hidden": 32, "seed": 3}, batch_size=64, recovery="consistent",
        checkpoint_every=10,
    )  # fmt: skip
    control = JobControl(redis_url, runtime_job_name(launch.job_id))
    agents = live_agents(redis_url, tmp_path, nodes)

    def gpu(worker: str) -> int:
        number = gpu_of_worker(worker)
        assert number is not None, worker
        return number

    def send(commands: list[tuple[str, Command]]) -> None:
        for node, command in commands:
            assert agents[node][0].receive(command.to_dict()) == "applied"

    try:
        first = allocator.allocate("j", 4)
        assert first.gpus == (0, 1, 2, 3) and first.leaves == (0, 1)
        send(membership_commands(launch, (), first.gpus, homes, reason="start"))
        wait_for(control, "progress", lambda e: e["world"] == 4 and e["step"] >= 5, 120)

        allocator.release("j")
        other = allocator.allocate("other", 2)  # a job takes leaf 0 meanwhile
        moved = allocator.allocate("j", 4)
        assert other.gpus == (0, 1) and moved.gpus == (2, 3, 4, 5) and moved.leaves == (1, 2)
        send(membership_commands(launch, first.gpus, moved.gpus, homes, reason="re-plan"))
        done = wait_for(control, "scale_done", lambda e: e["joiners"], 120)
        live = tuple(done["members"])  # the new generation, in its rank order

        planned = tuple(worker_id(g) for g in moved.gpus)
        assert live == planned == ("w2", "w3", "w4", "w5")
        assert ring_neighbours(live) == ring_neighbours(planned)
        stale = order_by_rank(["w2", "w3", "w4", "w5"], {"w2": 2, "w3": 3, "w4": 2, "w5": 3})

        def crossings(ring: tuple[str, ...]) -> int:
            return sum(
                len({spec.leaf_of(gpu(w)) for w in pair}) - 1 for pair in ring_neighbours(ring)
            )

        assert (crossings(live), crossings(stale)) == (2, 4)
        # The fabric's link analysis of the live ring's traffic, with the other job's at once:
        ring = ring_allreduce([gpu(w) for w in live], 1e6)
        router = SourceRouting(spec, allocator.allocations())
        ids = LinkIds(spec)
        used = set(analyze(spec, ring, router).steps[0].flows_per_link)
        reserved = {ids.up(leaf, u) for leaf in moved.leaves for u in moved.uplinks}
        reserved |= {ids.down(leaf, u) for leaf in moved.leaves for u in moved.uplinks}
        assert {link for link in used if ids.is_fabric_link(link)} <= reserved
        both = [Step(ring[0].flows + ring_allreduce(other.gpus, 1e6)[0].flows)]
        report = analyze(spec, both, router)
        assert not report.any_contention, [ids.describe(k) for k in report.steps[0].contended]
        send(membership_commands(launch, moved.gpus, (), homes, reason="done"))
        wait_for(control, "finished", lambda e: True, 120)
    finally:
        for agent, _sent in agents.values():
            agent.close(stop_children=True)
        control.cleanup()
        for node in nodes:
            for key in control.redis.scan_iter(match=f"agent:{node}:*"):
                control.redis.delete(key)
