"""State broadcasts carry data, never code: a peer's pickle is refused on loading.

Two ranks of a real gloo group in two threads of this process (an in-memory
``HashStore`` as the rendezvous), exactly the collectives the runtime uses.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# torch.distributed re-exports it from here; its stub does not say so.
from torch._C._distributed_c10d import HashStore

from workers.elastic import comm

CPU = torch.device("cpu")


def on_two_ranks(work: Callable[[Any, int], Any]) -> list[Any]:
    """Run ``work(group, rank)`` on ranks 0 and 1; each result, or the exception it raised."""
    store = HashStore()
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        group = comm.build_group(store, 0, rank, 2, CPU, timeout_s=30)
        try:
            results[rank] = work(group, rank)
        except Exception as exc:  # handed to the test, which asserts on it
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


class Payload:
    """Unpickling this runs ``exec``: what a hostile peer would broadcast."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _send_raw(group: Any, data: bytes) -> None:
    """Rank 0's half of ``broadcast_object``, with bytes of its own choosing."""
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    group.broadcast(torch.tensor([payload.numel()], dtype=torch.int64), 0).wait()
    group.broadcast(payload, 0).wait()


def test_a_malicious_pickle_broadcast_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"model": Payload(marker)}, buffer)

    def work(group: Any, rank: int) -> Any:
        if rank == 0:
            _send_raw(group, buffer.getvalue())
            return None
        return comm.broadcast_object(group, None, 0, CPU)

    _, received = on_two_ranks(work)
    assert isinstance(received, pickle.UnpicklingError), received
    assert not marker.exists()


def test_a_state_of_tensors_and_plain_values_still_travels() -> None:
    state: dict[str, Any] = {
        "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2)},
        "optimizer": {"step": 7, "lr": 0.1, "buffers": [torch.tensor([1, 2], dtype=torch.int64)]},
        "progress": (3, "epoch", None),
    }

    def work(group: Any, rank: int) -> Any:
        return comm.broadcast_state(group, state if rank == 0 else None, 0, CPU)

    _, received = on_two_ranks(work)
    assert torch.equal(received["model"]["w"], state["model"]["w"])
    assert torch.equal(received["optimizer"]["buffers"][0], torch.tensor([1, 2]))
    assert received["optimizer"]["step"] == 7 and received["progress"] == (3, "epoch", None)
