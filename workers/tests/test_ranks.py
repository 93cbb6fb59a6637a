"""Ranks in the allocation's order: the pure ordering, and real workers started out of order."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.agent_commands import GpuHome, JobLaunch, membership_commands
from workers.agent.config import AgentConfig
from workers.agent.launch import worker_argv
from workers.elastic.cli import WorkerArgumentError, parse_options
from workers.elastic.ranks import order_by_rank, parse_ranks, ring_neighbours
from workers.elastic.testing import JobRun
from workers.protocol import StartWorkers

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


def test_two_leaf_job_ring_follows_the_allocation(tmp_path: Path) -> None:
    """The ranks the agent passes make the runtime's ring the allocation's ring."""
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
