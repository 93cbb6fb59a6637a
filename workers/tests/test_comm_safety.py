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

import pytest
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


def on_ranks(size: int, work: Callable[[Any, int], Any]) -> list[Any]:
    """Run ``work(group, rank)`` on ``size`` ranks; each result, or the exception it raised."""
    store = HashStore()
    results: list[Any] = [None] * size

    def run(rank: int) -> None:
        group = comm.build_group(store, 0, rank, size, CPU, timeout_s=30)
        try:
            results[rank] = work(group, rank)
        except Exception as exc:  # handed to the test, which asserts on it
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def _send_header(group: Any, data: bytes, dst: int) -> None:
    """The source's header of ``send_state``, with bytes of its own choosing."""
    header = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    group.send([torch.tensor([header.numel()], dtype=torch.int64)], dst, comm.HEADER_TAGS[0]).wait()
    group.send([header], dst, comm.HEADER_TAGS[1]).wait()


def test_a_state_sent_point_to_point_reaches_only_the_joiners() -> None:
    """Rank 0 sends to rank 2; rank 1 (a member that holds the state) takes no part."""
    state: dict[str, Any] = {
        "model": {"w": torch.arange(6, dtype=torch.float64).reshape(2, 3), "n": torch.tensor(4)},
        "optimizer": {"state": {0: {"momentum": torch.ones(3)}}, "groups": [{"lr": 0.1}]},
        "empty": torch.zeros(0, 5),
        "step": 7,
        "actions": {12: [{"kind": "switch"}]},
    }

    def work(group: Any, rank: int) -> Any:
        timings: dict[str, float] = {}
        if rank == 0:
            comm.warm_up(group, rank, 0, [2], CPU)
            comm.send_state(group, state, [2], timings)
        elif rank == 1:
            comm.warm_up(group, rank, 0, [2], CPU)
            return "idle"
        else:
            comm.warm_up(group, rank, 0, [2], CPU)
            return comm.receive_state(group, 0, CPU, timeout_s=30, timings=timings), timings
        return timings

    sent, idle, (received, timings) = on_ranks(3, work)
    assert idle == "idle" and set(sent) == {"skeleton", "bulk"} and set(timings) == set(sent)
    assert torch.equal(received["model"]["w"], state["model"]["w"])
    assert received["model"]["w"].dtype == torch.float64
    assert int(received["model"]["n"]) == 4 and received["model"]["n"].dtype == torch.int64
    assert torch.equal(received["optimizer"]["state"][0]["momentum"], torch.ones(3))
    assert received["empty"].shape == (0, 5)
    assert received["step"] == 7 and received["actions"] == {12: [{"kind": "switch"}]}


def test_a_malicious_pickle_sent_point_to_point_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"model": Payload(marker)}, buffer)

    def work(group: Any, rank: int) -> Any:
        if rank == 0:
            _send_header(group, buffer.getvalue(), 1)
            return None
        return comm.receive_state(group, 0, CPU, timeout_s=30)

    _, received = on_two_ranks(work)
    assert isinstance(received, pickle.UnpicklingError), received
    assert not marker.exists()


def test_a_header_that_numbers_its_tensors_out_of_order_is_refused() -> None:
    """The receiver allocates only what a well-formed header describes, in order."""
    mark = comm.TENSOR_KEY
    skeleton = {"a": {mark: ["float32", 1, [2]]}, "b": {mark: ["float32", 0, [2]]}}
    buffer = io.BytesIO()
    torch.save(skeleton, buffer)

    def work(group: Any, rank: int) -> Any:
        if rank == 0:
            _send_header(group, buffer.getvalue(), 1)
            return None
        return comm.receive_state(group, 0, CPU, timeout_s=30)

    _, received = on_two_ranks(work)
    assert isinstance(received, ValueError) and "tensor 1 where 0 was due" in str(received)
    bad_dtype = {"a": {mark: ["os.system", 0, [2]]}}
    with pytest.raises(ValueError, match="unknown dtype"):
        comm._marks(bad_dtype, [])
    with pytest.raises(ValueError, match="negative dimension"):
        comm._marks({"a": {mark: ["float32", 0, [-1]]}}, [])


class JustLate:
    """A real gloo work whose first sliced wait runs out just before the result comes.

    It waits until the work is done, then raises what gloo raises when a slice ends
    first: the interleaving that failed a healthy generation in the 2026-12-04 04:08
    bench run (the slice's timeout, read after the sum had arrived).
    """

    def __init__(self, work: Any) -> None:
        self.work, self.slices = work, 0

    def wait(self, timeout: Any = None) -> bool:
        if timeout is not None and self.slices == 0:
            self.slices += 1
            while not self.work.is_completed():
                threading.Event().wait(0.005)
            raise RuntimeError("Operation timed out!")
        return bool(self.work.wait() if timeout is None else self.work.wait(timeout))

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


def test_a_collective_done_just_after_a_watch_slice_is_not_a_failure() -> None:
    def work(group: Any, rank: int) -> float:
        tensor = torch.tensor([float(rank + 1)])
        done = group.allreduce([tensor])
        comm.wait_watched(JustLate(done) if rank == 0 else done, lambda: None)
        return float(tensor.item())

    assert on_two_ranks(work) == [3.0, 3.0]
