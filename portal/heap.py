"""A served process's start-up heap, set aside from the garbage collector's full passes.

Everything a web process loads before its first request (modules, the URL
configuration with every view, settings, templates' loaders) lives as long as
the process.  A full (generation 2) collection walks every tracked object all
the same: on the 10,000-job benchmark some 170,000 of them, 120 ms, which
landed inside whichever request happened to trigger it and made the p95 of
the usage page 2-4 times its median.  ``gc.freeze`` moves what exists now to
a permanent generation that collections skip; what requests allocate is
collected as before.
"""

from __future__ import annotations

import gc

from django.urls import get_resolver


def freeze_startup_heap() -> None:
    """Load every view now, then exclude all objects alive so far from collections."""
    get_resolver().url_patterns  # noqa: B018  (imports the URL configuration and its views)
    gc.collect()  # start-up garbage goes now, not frozen with the rest
    gc.freeze()
