"""Agent commands of a tenant's program: ranks, the torchrun contract, stop-resume."""

from __future__ import annotations

from typing import Any

from jobs.agent_commands import GpuHome, JobLaunch, ProgramLaunch, membership_commands
from jobs.outbox import rendezvous_port
from workers.protocol import Command, Migrate, StartWorkers, StopJob

CODE = "ab" * 32
HOMES = {
    0: GpuHome(node="n0", local=0, address="10.0.0.1"),
    1: GpuHome(node="n0", local=1, address="10.0.0.1"),
    4: GpuHome(node="n1", local=0, address="10.0.0.2"),
    5: GpuHome(node="n1", local=1, address="10.0.0.2"),
}


def launch(launcher: str, generation: int = 1) -> JobLaunch:
    return JobLaunch(
        job_id=7,
        workload="",
        args={},
        batch_size=64,
        recovery="consistent",
        checkpoint_every=50,
        program=ProgramLaunch(
            code=CODE,
            code_path=f"tenants/t/bundles/{CODE}.tar.gz",
            entrypoint=("train.py", "--epochs", "2"),
            launcher=launcher,
            env={"MY_FLAG": "1"},
            generation=generation,
            master_port=29507,
            grace_seconds=12.0,
        ),
    )


def round_trip(commands: list[tuple[str, Command]]) -> list[tuple[str, Command]]:
    """Every command survives the wire, as agents receive it."""
    return [(node, Command.from_dict(c.to_dict())) for node, c in commands]


def test_a_start_gives_ranks_in_allocation_order_and_the_torchrun_contract() -> None:
    commands = round_trip(
        membership_commands(launch("torchrun"), (), (4, 5, 0, 1), HOMES, reason="x")
    )
    by_node = dict(commands)
    assert set(by_node) == {"n0", "n1"}
    first, second = by_node["n1"], by_node["n0"]
    assert isinstance(first, StartWorkers) and isinstance(second, StartWorkers)
    assert [(w.worker_id, w.rank) for w in first.workers] == [("w4", 0), ("w5", 1)]
    assert [(w.worker_id, w.rank) for w in second.workers] == [("w0", 2), ("w1", 3)]
    assert first.program is not None and second.program is not None
    assert (first.program.group_rank, second.program.group_rank) == (0, 1)
    assert first.program.world_size == second.program.world_size == 4
    assert first.program.master_addr == second.program.master_addr == "10.0.0.2"  # rank 0's node
    assert first.program.master_port == 29507
    assert first.program.entrypoint == ("train.py", "--epochs", "2")
    assert first.workload == "" and first.args == {}


def test_a_torchrun_resize_stops_then_starts_the_next_run_at_the_new_size() -> None:
    commands = round_trip(
        membership_commands(launch("torchrun", 3), (0, 1), (0, 1, 4, 5), HOMES, reason="grow")
    )
    stops = [(n, c) for n, c in commands if isinstance(c, StopJob)]
    starts = [(n, c) for n, c in commands if isinstance(c, StartWorkers)]
    assert [n for n, _ in stops] == ["n0"]
    assert stops[0][1].grace_seconds == 12.0
    assert commands.index(stops[0]) < commands.index(starts[0])  # stop goes out first
    assert sorted(n for n, _ in starts) == ["n0", "n1"]
    for _node, start in starts:
        assert isinstance(start, StartWorkers) and not start.join
        assert start.initial_world == 4
        assert start.program is not None and start.program.generation == 3


def test_an_edl_program_scales_out_stop_free_and_carries_the_program() -> None:
    commands = round_trip(
        membership_commands(launch("edl"), (0, 1), (0, 1, 4), HOMES, reason="grow")
    )
    assert len(commands) == 1
    node, start = commands[0]
    assert node == "n1" and isinstance(start, StartWorkers) and start.join
    assert start.program is not None and start.program.launcher == "edl"


def test_an_edl_program_migration_carries_the_program_to_the_newcomers() -> None:
    commands = round_trip(membership_commands(launch("edl"), (0, 1), (4, 5), HOMES, reason="move"))
    ((node, migrate),) = commands
    assert node == "n1" and isinstance(migrate, Migrate)
    assert migrate.joining.program is not None


def test_a_program_stop_gives_the_torchrun_grace() -> None:
    commands = membership_commands(launch("torchrun"), (0, 4), (), HOMES, reason="cancel")
    assert sorted(n for n, _ in commands) == ["n0", "n1"]
    assert all(isinstance(c, StopJob) and c.grace_seconds == 12.0 for _, c in commands)


def test_an_edl_program_stops_with_the_runtime_s_default_grace() -> None:
    commands = membership_commands(launch("edl"), (0,), (), HOMES, reason="cancel")
    default = StopJob(job="job-7", command_id="c").grace_seconds
    assert [c.grace_seconds for _, c in commands if isinstance(c, StopJob)] == [default]


def test_the_rendezvous_port_is_fixed_within_a_run_and_not_guessable_from_the_job_id(
    settings: Any,
) -> None:
    """The attack: ``MASTER_PORT`` was 29500 + job id, so any job could find another's
    rendezvous store.  Now it is a keyed hash of (job, generation) under SECRET_KEY."""
    settings.TORCHRUN_PORT_BASE, settings.TORCHRUN_PORT_SPAN = 29500, 10000
    ports = [rendezvous_port(pk, 0) for pk in range(1, 201)]
    assert all(29500 <= port < 39500 for port in ports)
    assert sum(port == 29500 + pk for pk, port in enumerate(ports, start=1)) <= 1
    assert rendezvous_port(7, 3) == rendezvous_port(7, 3) != rendezvous_port(7, 4)
    settings.SECRET_KEY = "another-site"
    assert [rendezvous_port(pk, 0) for pk in range(1, 201)] != ports
