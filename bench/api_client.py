"""The portal's REST API as a tenant's token sees it, for benchmarks that drive a live stack."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

log = logging.getLogger("bench")


class ApiClient:
    """JSON requests with ``Authorization: Token``; a read that times out is tried again.

    A write (a body given) is sent once: a submission must never be sent twice.
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 60.0, read_tries: int = 5):
        self.url, self.token = url, token
        self.timeout_s, self.read_tries = timeout_s, read_tries

    def call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """GET ``path`` (POST ``body`` when given) and return the decoded JSON answer."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        tries = 1 if body is not None else self.read_tries
        for attempt in range(tries):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except TimeoutError:
                if attempt == tries - 1:
                    raise
                log.warning("%s timed out, again", path)
        raise AssertionError("unreachable")

    def events(self, job: int) -> list[dict[str, Any]]:
        """The job's history, oldest first (its first 200 events)."""
        return list(self.call(f"/api/v1/jobs/{job}/events/?page_size=200")["results"])
