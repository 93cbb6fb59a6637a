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

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from workers.agent.redis_acl import JobBudget, job_footprint, memory_pressure, stop_job_user

PRESSURE_TO_MEASURE = 0.5
"""How full the server must be before jobs are measured (a SCAN of the keyspace each)."""


@dataclass(frozen=True)
class Stopped:
    """A job the guard stopped, and why (what its failure says)."""

    job: str
    reason: str


def guard(
    client: redis.Redis, jobs: Iterable[str], pressure_to_measure: float = PRESSURE_TO_MEASURE
) -> list[Stopped]:
    """Stop those of ``jobs`` that hold more than their share of a server under pressure."""
    jobs = sorted(jobs)
    if not jobs or memory_pressure(client) <= pressure_to_measure:
        return []
    try:
        budget = JobBudget.of_server(client)
    except ValueError:  # no maxmemory: unbounded, nothing to share out
        return []
    stopped = []
    for job in jobs:
        refusal = budget.refusal(job_footprint(client, job))
        if refusal is not None:
            stop_job_user(client, job)
            reason = f"{refusal}: stopped to keep the shared Redis writable for everyone"
            stopped.append(Stopped(job, reason))
    return stopped
