"""A stalled report pipeline is not every agent dying.

Found by the fault suite: SIGKILL of the Celery worker that applies agent
reports stopped every heartbeat from arriving while it restarted; the tick
(on its own worker) then marked every live server down and requeued jobs that
were still training, so two runs of one job overlapped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from inventory.models import Server
from inventory.services import (
    do_heartbeat,
    do_load_topology,
    do_mark_silent_servers_down,
    silence_cutoff,
)

DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("newest", "cutoff"),
    [
        (None, s(20)),  # no heartbeat ever: measured up to now
        (s(0), s(20)),  # heartbeats arriving: one silent agent is caught after 20 s
        (s(60), s(80)),  # nothing arrived for a minute: the pipeline stalled, nobody is silent
        (s(199), s(219)),  # still within 10 intervals
        (s(200), s(20)),  # 10 intervals with no heartbeat at all: the agents really are gone
        (NOW + timedelta(seconds=5), s(20)),  # a heartbeat from the future never moves it later
    ],
)
def test_silence_is_measured_up_to_the_newest_heartbeat(
    newest: datetime | None, cutoff: datetime
) -> None:
    assert silence_cutoff(now=NOW, newest=newest, after_seconds=20, stall_factor=10) == cutoff


@pytest.mark.django_db
def test_a_stall_marks_nobody_down_but_one_dead_agent_among_live_ones_is_caught() -> None:
    do_load_topology(DEMO)
    now = timezone.now()
    nodes = list(Server.objects.order_by("node").values_list("node", flat=True))
    for node in nodes:  # the last heartbeats before the report worker died
        do_heartbeat(node=node, info={}, at=now - timedelta(seconds=45))
    assert do_mark_silent_servers_down(now=now, after_seconds=20) == []
    assert set(Server.objects.values_list("state", flat=True)) == {"up"}
    # the worker is back: the live agents' heartbeats arrive, node-3's does not
    for node in nodes[:-1]:
        do_heartbeat(node=node, info={}, at=now)
    assert do_mark_silent_servers_down(now=now, after_seconds=20) == [nodes[-1]]
    # and a whole cluster silent for 10 intervals is down after all
    later = now + timedelta(seconds=300)
    assert sorted(do_mark_silent_servers_down(now=later, after_seconds=20)) == nodes[:-1]
