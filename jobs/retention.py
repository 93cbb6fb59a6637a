"""How long a finished job's outputs are kept, as pure rules over plain values.

::

    policy_for(tenant overrides, cluster defaults)  → RetentionPolicy(artifact_days, log_days)
    is_expired(output, policy, now)                 a finished job's object, past its cutoff
    select_expired(outputs, policies, now, limit)   the oldest expired ones, at most ``limit``
    coordination_due(finished_at, now, delay)       a finished job's Redis keys may go

Checkpoints, final checkpoints and user artifacts follow ``artifact_days``;
the job's log (its ``log`` artifact and its stored lines) follows
``log_days``.  Only a job that ended counts: a running or queued job, or
one that ended less than its days ago, keeps everything.  The clock is
always passed in, so a test can move it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

LOG_KIND = "log"


@dataclass(frozen=True)
class RetentionPolicy:
    """Days a finished job's artifacts and its log are kept (one tenant's, or the cluster's)."""

    artifact_days: int
    log_days: int

    def artifact_cutoff(self, now: datetime) -> datetime:
        """Artifacts of jobs that ended before this instant have expired."""
        return now - timedelta(days=self.artifact_days)

    def log_cutoff(self, now: datetime) -> datetime:
        """Logs of jobs that ended before this instant have expired."""
        return now - timedelta(days=self.log_days)

    def cutoff(self, kind: str, now: datetime) -> datetime:
        """The cutoff that applies to an object of ``kind``."""
        return self.log_cutoff(now) if kind == LOG_KIND else self.artifact_cutoff(now)


def policy_for(
    artifact_override: int | None,
    log_override: int | None,
    *,
    artifact_default: int,
    log_default: int,
) -> RetentionPolicy:
    """A tenant's policy: its own days where it set them, the cluster's elsewhere."""
    return RetentionPolicy(
        artifact_days=artifact_default if artifact_override is None else artifact_override,
        log_days=log_default if log_override is None else log_override,
    )


@dataclass(frozen=True)
class StoredOutput:
    """One stored object of a job, with what retention needs to know about its job."""

    id: int
    tenant_id: int
    job_id: int
    kind: str
    size: int
    job_ended_at: datetime | None
    """When the job completed, failed or was cancelled; None while it has not ended."""


def is_expired(output: StoredOutput, policy: RetentionPolicy, now: datetime) -> bool:
    """Whether ``output``'s job ended longer ago than its kind is kept."""
    return output.job_ended_at is not None and output.job_ended_at < policy.cutoff(output.kind, now)


def select_expired(
    outputs: Iterable[StoredOutput],
    policies: Mapping[int, RetentionPolicy],
    default: RetentionPolicy,
    now: datetime,
    limit: int,
) -> list[StoredOutput]:
    """The expired outputs, those of the jobs that ended first first, at most ``limit``."""
    expired = [o for o in outputs if is_expired(o, policies.get(o.tenant_id, default), now)]
    expired.sort(key=lambda o: (o.job_ended_at or now, o.id))
    return expired[: max(limit, 0)]


def coordination_due(finished_at: datetime | None, now: datetime, delay: timedelta) -> bool:
    """Whether a job that ended at ``finished_at`` is done with its coordination keys.

    A little after the end, not at once: the agents still read the job's last
    events from its stream.
    """
    return finished_at is not None and finished_at <= now - delay
