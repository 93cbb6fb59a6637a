"""Every runtime event the agent forwards has a handler in the control plane.

The runtime's event kinds are declared once (``workers.runtime_events``) and
each names its report (``workers.protocol.EVENT_REPORTS``); a report with no
handler would be "noted" and dropped, so a new kind without its handler fails
here, not in production.
"""

from __future__ import annotations

from control.reports import _HANDLERS
from workers.protocol import EVENT_REPORTS


def test_every_declared_event_reaches_a_handler() -> None:
    missing = sorted(kind for kind, report in EVENT_REPORTS.items() if report not in _HANDLERS)
    assert not missing, f"runtime events whose report nothing handles: {missing}"
    assert len(EVENT_REPORTS) >= 12  # progress ... metrics: the runtime's kinds today
