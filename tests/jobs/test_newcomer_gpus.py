"""Which GPUs of a job that finished mid-switch hold newcomers to stop (pure)."""

from __future__ import annotations

from control.endings import newcomer_gpus
from jobs.agent_commands import GpuHome

HOMES = {g: GpuHome(node=f"node-{g // 2}", local=g % 2, address="127.0.0.1") for g in range(8)}


def test_a_scale_out_onto_another_node_stops_that_node_only() -> None:
    assert newcomer_gpus((0, 1, 2, 3), {0, 1}, HOMES) == (2, 3)


def test_a_node_that_also_hosts_a_member_is_left_alone() -> None:
    # 1 -> {1, 0, 2, 3}: GPU 0 is new but shares node-0 with the member on GPU 1
    assert newcomer_gpus((1, 0, 2, 3), {1}, HOMES) == (2, 3)


def test_a_migration_stops_every_new_node_and_a_shrink_nothing() -> None:
    assert newcomer_gpus((4, 5, 6, 7), {0, 1, 2, 3}, HOMES) == (4, 5, 6, 7)
    assert newcomer_gpus((0, 1), {0, 1, 2, 3}, HOMES) == ()


def test_a_gpu_with_no_known_home_is_left_out() -> None:
    assert newcomer_gpus((0, 1, 9), {0, 1}, HOMES) == ()
