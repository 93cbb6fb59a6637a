"""Why a queued job waits when suspect GPUs are what keeps it out.

A GPU in a straggler's cool-down (``inventory.Gpu.suspect_until``) takes no new
placement: the policy counts it out, so a job that would fit with it simply
is not started, and no refusal explains the wait. The tenant saw a queued job
beside idle GPUs. This step names the cause::

    queued job J, not started this tick, needing n GPUs (its minimum)
      free (schedulable, not suspect, not held after this tick's binding) < n
      <= free + free suspect                  ─▶ "waiting: k GPUs are out of service ..."

A job that would not fit even with them, or that fits without them, gets no
note from here (its wait is the queue's, the policy's or the binding's).
``suspect_waits`` is the pure core; ``suspect_notes`` reads the tick's cluster,
snapshot and binding into it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from control.state import ClusterState
from scheduler.binding import Bound
from scheduler.types import Snapshot


def suspect_waits(needs: Mapping[int, int], free: int, free_suspect: int) -> dict[int, str]:
    """The note for each job of ``needs`` (id: GPUs it needs) that only suspect GPUs keep out."""
    if free_suspect <= 0:
        return {}
    reason = (
        f"{free_suspect} idle GPU{'s are' if free_suspect != 1 else ' is'} out of service "
        "for a straggler's cool-down (suspect); "
        f"{free} {'are' if free != 1 else 'is'} free for new work"
    )
    return {job: reason for job, n in needs.items() if free < n <= free + free_suspect}


def suspect_notes(
    cluster: ClusterState,
    snapshot: Snapshot,
    ids: Mapping[str, int],
    bound: Sequence[Bound],
) -> dict[int, str]:
    """Waiting notes for the snapshot's queued jobs that only suspect GPUs keep out."""
    if not cluster.suspect:
        return {}
    held = set(cluster.holders)
    started: set[str] = set()
    for item in bound:
        held.difference_update(item.old_gpus)
        held.update(item.new_gpus)
        started.add(item.job)
    free_suspect = len(cluster.suspect - held)
    if not free_suspect:
        return {}
    free = len(cluster.schedulable - cluster.suspect - held)
    needs = {
        ids[view.id]: max(1, view.min_gpus or view.requested_gpus)
        for view in snapshot.jobs
        if not view.running and view.id in ids and view.id not in started
    }
    return suspect_waits(needs, free, free_suspect)
