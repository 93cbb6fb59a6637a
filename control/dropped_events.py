"""The job's history learns what its agents dropped from its event stream.

A job's program writes its own event stream; the agents drop what they
cannot believe (``workers.job_events``, ``workers.agent.events``) and send
the count in an ``events_dropped`` report.  The tenant sees it as one line of
the job's history ("3 malformed events dropped by node-2: ..."): a program
that writes its stream by hand learns why the portal ignored it.
"""

from __future__ import annotations

from control.report_time import report_time
from jobs.choices import EventKind
from jobs.lifecycle import record
from jobs.models import Job
from workers.protocol import EventsDropped


def events_dropped(job: Job, report: EventsDropped) -> str:
    """Record the count of dropped events, with the first one's reason."""
    noun = "event" if report.count == 1 else "events"
    record(
        job,
        EventKind.NOTE,
        report_time(report),
        reason=f"{report.count} malformed {noun} dropped by {report.node}: {report.reason}",
        data={
            "events_dropped": report.count,
            "first_event_id": report.first_event_id,
            "last_event_id": report.last_event_id,
        },
    )
    return "events dropped"
