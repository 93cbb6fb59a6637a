"""The fields a sweep submission has beyond a job's (``POST /api/v1/sweeps/``).

One list for both ends: the server (``jobs.sweeps``, ``jobs.api.sweeps``) splits
a submission's search from the trials' job fields with it, and the client
(``portalctl.sweep``) splits a sweep file the same way.  It lives here, in the
bottom ring, because the client imports no package of ours (no Django) while
the server may import the client's plain modules; this one imports nothing.
"""

from __future__ import annotations

SWEEP_FIELDS = (
    "search_space",
    "metric",
    "mode",
    "strategy",
    "eta",
    "min_steps",
    "max_steps",
    "max_trials",
    "max_gpu_hours",
    "max_running",
    "seed",
)
"""A sweep's own fields; every other field of a submission is its trials' job's."""
