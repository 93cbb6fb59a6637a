"""The agent's guard of the shared Redis: a job that holds more than its share is stopped.

Redis has no per-user memory quota, and a full server (``maxmemory`` with
``noeviction``) refuses everyone's writes, the portal's too.  On each
heartbeat an agent asks how full the server is (``memory_pressure``); past
``PRESSURE_TO_MEASURE`` it measures each job whose user it made
(``job_footprint``) against a share of the server (``JobBudget``), and stops
each one over it: its user goes with its connections and its keys are freed
(``stop_job_user``).  The agent then reports the job failed with the reason
and never makes its user again on this node.  A server without a
``maxmemory`` is not guarded (nothing to take a share of).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from workers.agent.redis_acl import (
    JobBudget,
    JobFootprint,
    job_footprint,
    memory_pressure,
    stop_job_user,
)

PRESSURE_TO_MEASURE = 0.5
"""How full the server must be before jobs are measured (a SCAN of the keyspace each)."""


@dataclass(frozen=True)
class Stopped:
    """A job the guard stopped, and why (what its failure says)."""

    job: str
    reason: str


def over_share(
    client: redis.Redis,
    owners: Iterable[str],
    measure: Callable[[redis.Redis, str], JobFootprint],
    pressure_to_measure: float = PRESSURE_TO_MEASURE,
) -> list[tuple[str, str]]:
    """Those of ``owners`` (jobs, or nodes' agents) that hold more than a job's share of a
    server under pressure, each with why (``JobBudget.refusal``); ``measure`` is
    ``job_footprint`` or ``agent_footprint``.  Nothing when the server is not under
    pressure or has no ``maxmemory`` (nothing to share out)."""
    owners = sorted(owners)
    if not owners or memory_pressure(client) <= pressure_to_measure:
        return []
    try:
        budget = JobBudget.of_server(client)
    except ValueError:  # no maxmemory: unbounded, nothing to share out
        return []
    found = []
    for owner in owners:
        refusal = budget.refusal(measure(client, owner))
        if refusal is not None:
            found.append((owner, refusal))
    return found


def guard(
    client: redis.Redis, jobs: Iterable[str], pressure_to_measure: float = PRESSURE_TO_MEASURE
) -> list[Stopped]:
    """Stop those of ``jobs`` that hold more than their share of a server under pressure."""
    stopped = []
    for job, refusal in over_share(client, jobs, job_footprint, pressure_to_measure):
        stop_job_user(client, job)
        reason = f"{refusal}: stopped to keep the shared Redis writable for everyone"
        stopped.append(Stopped(job, reason))
    return stopped
