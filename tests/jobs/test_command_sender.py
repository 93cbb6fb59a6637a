"""Committed agent commands published by the process's sender thread: in order, and whatever fails."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.test import override_settings

from jobs import agent_trust, command_sender, outbox
from jobs.command_sender import Batch, CommandSender
from jobs.outbox import Outbox
from tests.jobs.control_helpers import demo_cluster, drain_queue
from workers.protocol import StopJob, agent_queue

pytestmark = pytest.mark.django_db(transaction=True)


def stops(job: str, count: int) -> list[StopJob]:
    return [StopJob(job=job, command_id=f"{job}-stop-{n}", reason=f"n={n}") for n in range(count)]


def commit_commands(node: str, commands: list[StopJob]) -> None:
    """One transaction that queues ``commands`` for ``node`` in an outbox, as a tick does."""
    with transaction.atomic():
        outbox = Outbox()
        outbox.extend((node, command) for command in commands)
        outbox.send_on_commit()


def test_batches_of_several_transactions_arrive_in_commit_order() -> None:
    node = demo_cluster()[0]
    first, second = stops("job-1", 3), stops("job-2", 2)
    commit_commands(node, first)
    commit_commands(node, second)
    sent = drain_queue(node)  # waits for the sender
    assert [c["command_id"] for c in sent] == [c.command_id for c in first + second]


def test_the_committing_thread_does_not_wait_for_the_broker() -> None:
    """The hand-over returns while the sender is still busy; the commands follow, in order."""
    node = demo_cluster()[0]
    release = threading.Event()
    command_sender.sender().submit(lambda batch: release.wait(10) and None, [])
    try:
        commit_commands(node, stops("job-3", 2))
        length = redis.Redis.from_url(settings.REDIS_URL).llen(agent_queue(node))
        assert length == 0  # committed, not yet published: the sender is busy
        assert not command_sender.wait_sent(timeout=0.2)
    finally:
        release.set()
    assert [c["command_id"] for c in drain_queue(node)] == ["job-3-stop-0", "job-3-stop-1"]


def test_hosts_are_remembered_by_the_sender_before_it_publishes(monkeypatch: Any) -> None:
    """The committing thread neither publishes nor writes the cache; the sender remembers
    the hosts first, so a report answering a command always finds its node a host."""
    node = demo_cluster()[0]
    agent_trust.forget_hosted(node, ["job-6"])
    seen_at_publish: list[bool] = []
    publish = outbox.publish

    def checking(commands: Batch, app: Any = None) -> None:
        seen_at_publish.append(cache.get(f"agent-hosted:{node}:job-6") is not None)
        publish(commands, app=app)

    monkeypatch.setattr(outbox, "publish", checking)
    release = threading.Event()
    command_sender.sender().submit(lambda batch: release.wait(10) and None, [])
    try:
        commit_commands(node, stops("job-6", 1))
        assert cache.get(f"agent-hosted:{node}:job-6") is None  # handed over, not remembered
    finally:
        release.set()
    assert [c["command_id"] for c in drain_queue(node)] == ["job-6-stop-0"]
    assert seen_at_publish == [True]
    agent_trust.forget_hosted(node, ["job-6"])


@override_settings(AGENT_SEND_IN_BACKGROUND=False)
def test_with_background_sending_off_the_commit_publishes_at_once() -> None:
    node = demo_cluster()[0]
    commit_commands(node, stops("job-4", 2))
    assert redis.Redis.from_url(settings.REDIS_URL).llen(agent_queue(node)) == 2
    assert len(drain_queue(node)) == 2


def test_a_failing_batch_is_counted_and_the_next_one_still_goes() -> None:
    seen: list[int] = []

    def send(batch: Batch) -> None:
        if not batch:
            raise RuntimeError("broker gone")
        seen.append(len(batch))

    sender = CommandSender()
    sender.submit(send, [])
    sender.submit(send, [("node-0", stops("job-5", 1)[0])])
    assert sender.wait_idle(timeout=5)
    assert (sender.failed_batches, sender.sent_batches, seen) == (1, 1, [1])


def test_a_forked_process_gets_its_own_sender() -> None:
    """Threads do not survive a fork: a child that found its parent's sender makes a new one."""
    parent = command_sender.sender()
    parent.pid = -1  # as the parent's object looks from a forked child
    child = command_sender.sender()
    assert child is not parent and child.thread.is_alive()
    assert command_sender.sender() is child


def test_work_submitted_while_held_starts_after_the_hold_in_the_order_it_came() -> None:
    """The tick holds the sender from its commit to its lock's release: nothing is
    published meanwhile, from any thread, and everything goes after, in order."""
    worker = CommandSender()
    ran: list[str] = []

    def note(batch: Batch) -> None:
        ran.append(batch[0][0])

    with worker.held():
        worker.submit(note, [("a", stops("job-1", 1)[0])])
        other = threading.Thread(target=worker.submit, args=(note, [("b", stops("job-2", 1)[0])]))
        other.start()
        other.join()
        with worker.held():  # nested: the outer block decides
            worker.submit(note, [("c", stops("job-3", 1)[0])])
        assert not worker.wait_idle(timeout=0.2) and ran == []
    assert worker.wait_idle(timeout=5)
    assert ran == ["a", "b", "c"]
    worker.submit(note, [("d", stops("job-4", 1)[0])])  # not held: at once
    assert worker.wait_idle(timeout=5) and ran[-1] == "d"
