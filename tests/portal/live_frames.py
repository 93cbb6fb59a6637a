"""Reading the live socket's frames in tests: batches unpacked into their events."""

from __future__ import annotations

from typing import Any

from channels.testing import WebsocketCommunicator


async def next_event(comm: WebsocketCommunicator, kind: str, timeout: float = 5) -> Any:
    """The next event of type ``kind`` from the batches that arrive (other events skipped).

    A frame that is not a batch (a revocation, an error) fails the test: it came first.
    """
    while True:
        frame = await comm.receive_json_from(timeout=timeout)
        assert frame.get("type") == "batch", f"expected a batch of events, got {frame}"
        for event in frame["events"]:
            if event.get("type") == kind:
                return event
