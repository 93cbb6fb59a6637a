"""A stalled report pipeline is not every agent dying.

Found by the fault suite: SIGKILL of the Celery worker that applies agent
reports stopped every heartbeat from arriving while it restarted; the tick
(on its own worker) then marked every live server down and requeued jobs that
were still training, so two runs of one job overlapped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from inventory.models import Server
from inventory.services import (
    do_heartbeat,
    do_load_topology,
    do_mark_silent_servers_down,
    read_beats,
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


@pytest.mark.django_db
def test_a_backlog_being_drained_marks_nobody_down() -> None:
    """Found by the fault suite: after the report worker restarted, the first heartbeats
    it applied were fresh arrivals while the other servers' were still queued behind
    them, and one to three live servers were marked down on every run."""
    do_load_topology(DEMO)
    now = timezone.now()
    nodes = list(Server.objects.order_by("node").values_list("node", flat=True))

    def beat(node: str, sent: float, arrived: float) -> None:
        info = {"at": (now - timedelta(seconds=sent)).timestamp()}
        do_heartbeat(node=node, info=info, at=now - timedelta(seconds=arrived))

    for node in nodes:  # the last heartbeats before the report worker died
        beat(node, sent=45, arrived=45)
    beat(nodes[0], sent=43, arrived=0)  # the worker is back: the first of its backlog
    assert do_mark_silent_servers_down(now=now, after_seconds=20) == []
    assert set(Server.objects.values_list("state", flat=True)) == {"up"}
    # the backlog drained: every live agent's heartbeats of now arrived, node-3's did not
    for node in nodes[:-1]:
        beat(node, sent=0, arrived=0)
    assert do_mark_silent_servers_down(now=now, after_seconds=20) == [nodes[-1]]


@pytest.mark.django_db
def test_an_agent_clock_cannot_keep_a_dead_server_up_or_mark_a_live_one_down() -> None:
    do_load_topology(DEMO)
    now = timezone.now()
    nodes = list(Server.objects.order_by("node").values_list("node", flat=True))
    ahead = (now + timedelta(hours=1)).timestamp()
    for node in nodes[:-1]:  # live agents, one with a clock an hour ahead
        do_heartbeat(node=node, info={"at": ahead if node == nodes[0] else now.timestamp()}, at=now)
    # the dead one's last heartbeat claims to be sent in the future: it counts as its arrival
    do_heartbeat(node=nodes[-1], info={"at": ahead}, at=now - timedelta(seconds=60))
    assert do_mark_silent_servers_down(now=now, after_seconds=20) == [nodes[-1]]
    assert Server.objects.filter(state="up").count() == len(nodes) - 1


@pytest.mark.django_db
def test_the_newest_beat_is_read_in_one_query_and_exactly_whatever_the_rows_hold(
    django_assert_num_queries: Any,
) -> None:
    """``read_beats`` compares the sent times as text: exact for what heartbeats write,
    and a row of another form (a hand edit) makes it parse every row instead."""
    assert read_beats().newest is None  # no server
    do_load_topology(DEMO)
    assert read_beats().newest is None  # servers that never beat
    nodes = list(Server.objects.order_by("node").values_list("node", flat=True))
    for offset, node in enumerate(nodes):
        # Sent times a second before arrival, some with microseconds, some without.
        info = {"at": (s(30 - offset) - timedelta(seconds=1, microseconds=offset)).timestamp()}
        do_heartbeat(node=node, info=info, at=s(30 - offset))
    with django_assert_num_queries(1):
        assert read_beats().newest == s(30 - len(nodes) + 1)  # the latest arrival
    # Sent times are clamped to arrival, so none is later; a hand edit can make one so.
    later = s(5)
    Server.objects.filter(node=nodes[0]).update(agent_info={"beat_at": later.isoformat()})
    with django_assert_num_queries(1):
        assert read_beats().newest == later
    # The latest sent time written in another offset: text order would miss it.
    other_offset = (NOW + timedelta(seconds=60)).astimezone(timezone.get_fixed_timezone(-120))
    Server.objects.filter(node=nodes[1]).update(agent_info={"beat_at": other_offset.isoformat()})
    assert read_beats().newest == NOW + timedelta(seconds=60)
    # Garbage that sorts last as text is skipped, as beat_at skips it.
    Server.objects.filter(node=nodes[1]).update(agent_info={"beat_at": "zzz"})
    assert read_beats().newest == later
