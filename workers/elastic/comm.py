"""Communicators (process groups) per membership generation, and state broadcast.

Each generation ``g`` gets its own process group built directly on
``PrefixStore(f"gen{g}", store)`` (``ProcessGroupGloo`` on the CPU,
``ProcessGroupNCCL`` on CUDA), never through ``init_process_group``: the
default group cannot be replaced while it serves, but a directly built group
can be constructed in a background thread while the previous generation keeps
training, and dropped afterwards.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# torch.distributed re-exports these from here; its stub does not say so.
from torch._C._distributed_c10d import PrefixStore, Store

BUILD_TIMEOUT = timedelta(seconds=120)


def build_group(
    store: Store, generation: int, rank: int, size: int, device: torch.device, timeout_s: float
) -> Any:
    """Construct (collectively, blocking) the process group of one generation."""
    prefixed = PrefixStore(f"gen{generation}/", store)
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    # The rendezvous may wait for a newcomer that is still importing torch on a busy
    # machine: give it time, then hold collectives to the job's sync timeout.
    group = dist.ProcessGroupGloo(prefixed, rank, size, max(timeout, BUILD_TIMEOUT))
    group._set_default_timeout(timeout)
    return group


WATCH_EVERY_S = 0.5
"""How often a worker blocked in a collective asks ``watch`` whether a peer is lost."""


class PeerLost(RuntimeError):
    """A collective was abandoned because a member is known to be gone."""


def allreduce_sum(
    group: Any, tensor: torch.Tensor, watch: Callable[[], str | None] | None = None
) -> None:
    """In-place sum over the group; raises on a peer's failure or timeout.

    With ``watch`` (gloo only: an NCCL ``wait`` does not block the host), the
    wait is cut into ``WATCH_EVERY_S`` slices and ``watch`` is asked between
    them; once it names a lost peer the collective is abandoned with
    ``PeerLost`` instead of waiting out the group's timeout. A member not
    connected to the dead one (or blocked on a peer that is) learns of the death
    this way within the liveness key's lifetime, not the sync timeout.
    """
    work = group.allreduce([tensor])
    if watch is None:
        work.wait()
        return
    wait_watched(work, watch)


def release_later(group: Any, after_s: float) -> None:
    """Drop a failed group on a daemon thread ``after_s`` seconds from now.

    gloo's destructor joins the group's threads, and a thread still blocked in
    an abandoned collective (a peer frozen, not dead: its connections stay
    open) returns only at the group's timeout. Dropped on the main thread, the
    last reference would stall training that long after a quick recovery.
    """

    def hold(box: list[Any]) -> None:
        time.sleep(after_s)
        box.clear()

    threading.Thread(target=hold, args=([group],), daemon=True, name="edl-drop-group").start()


def wait_watched(work: Any, watch: Callable[[], str | None]) -> None:
    """Wait for ``work``; raise ``PeerLost`` as soon as ``watch`` names a lost peer."""
    slice_ = timedelta(seconds=WATCH_EVERY_S)
    while True:
        try:
            work.wait(slice_)
            return
        except RuntimeError:
            if work.is_completed():
                raise  # the collective itself failed (a peer's connection closed)
        lost = watch()
        if lost is not None:
            # The abandoned work stays on gloo's thread until the group's timeout; its
            # tensor is never read again (the step is redone in a new generation).
            raise PeerLost(f"peer {lost} lost its liveness key; collective abandoned")


def _bcast(group: Any, tensor: torch.Tensor, root: int, timeout_s: float | None) -> None:
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    group.broadcast(tensor, root, timeout).wait()


def broadcast_object(
    group: Any, obj: Any, root: int, device: torch.device, timeout_s: float | None = None
) -> Any:
    """Send ``obj`` (tensors in plain containers: dicts, lists, tuples, numbers, strings)
    from ``root`` to every member.

    Two collectives: the byte length, then the bytes as one uint8 tensor, so a
    model of any size costs one transfer.  Members read the bytes with
    ``weights_only=True``: a peer of the job (a tenant's program may be one)
    can send data, never code; anything else raises ``pickle.UnpicklingError``.
    """
    is_root = group.rank() == root
    if is_root:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    length = length.to(device)
    _bcast(group, length, root, timeout_s)
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    payload = payload.to(device)
    _bcast(group, payload, root, timeout_s)
    if is_root:
        return obj
    data = payload.cpu().numpy().tobytes()
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)


SLOT_KEY = "__edl_flat_tensor__"
"""Marks, in a broadcast state's skeleton, where a tensor sits in its dtype's flat buffer."""


@dataclass(frozen=True)
class _Slot:
    """Where a tensor of a broadcast state sits in the flat buffer of its dtype."""

    dtype: str
    offset: int
    shape: tuple[int, ...]

    def to_plain(self) -> dict[str, Any]:
        """The slot as plain data (what ``weights_only`` loading accepts)."""
        return {SLOT_KEY: [self.dtype, self.offset, list(self.shape)]}

    @staticmethod
    def from_plain(obj: Any) -> _Slot | None:
        """The slot a skeleton entry stands for; None when it is a plain value."""
        if not (isinstance(obj, dict) and len(obj) == 1 and SLOT_KEY in obj):
            return None
        dtype, offset, shape = obj[SLOT_KEY]
        _dtype(dtype)
        return _Slot(str(dtype), int(offset), tuple(int(d) for d in shape))


def _dtype(name: Any) -> torch.dtype:
    """The torch dtype a peer names (``float32``); ValueError for anything else."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"broadcast state: unknown dtype {name!r}")
    return dtype


def _strip(obj: Any, flats: dict[str, list[torch.Tensor]], sizes: dict[str, int]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = str(obj.dtype).removeprefix("torch.")
        slot = _Slot(key, sizes.get(key, 0), tuple(obj.shape))
        flats.setdefault(key, []).append(obj.detach().reshape(-1))
        sizes[key] = slot.offset + obj.numel()
        return slot.to_plain()
    if isinstance(obj, dict):
        return {k: _strip(v, flats, sizes) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_strip(v, flats, sizes) for v in obj)
    return obj


def _fill(obj: Any, buffers: dict[str, torch.Tensor]) -> Any:
    slot = _Slot.from_plain(obj)
    if slot is not None:
        n = 1
        for d in slot.shape:
            n *= d
        return buffers[slot.dtype][slot.offset : slot.offset + n].view(slot.shape).clone()
    if isinstance(obj, dict):
        return {k: _fill(v, buffers) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_fill(v, buffers) for v in obj)
    return obj


def broadcast_state(
    group: Any,
    state: Any,
    root: int,
    device: torch.device,
    want: bool = True,
    timeout_s: float | None = None,
    timings: dict[str, float] | None = None,
) -> Any:
    """Send a state (nested dicts/lists of tensors and plain values) from ``root`` to all.

    One small skeleton (plain data, loaded with ``weights_only``), then one
    flat buffer per dtype: the tensors travel without serialisation, which is
    most of a model's bytes. A member
    that already holds the state passes ``want=False`` and skips unpacking.
    ``timings`` (when given) receives the seconds of each part: ``skeleton``
    (strip and send it), ``pack`` (the root's concatenation), ``bulk`` (the
    flat buffers' broadcasts), ``unpack``.
    """
    marks = _Marks(timings)
    is_root = group.rank() == root
    flats: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}
    skeleton = _strip(state, flats, sizes) if is_root else None
    header = broadcast_object(
        group, (skeleton, sizes) if is_root else None, root, device, timeout_s
    )
    marks.lap("skeleton")
    if is_root:
        packed = {key: torch.cat(flats[key]).to(device) for key in sorted(sizes)}
        marks.lap("pack")
        for key in sorted(sizes):
            group.broadcast(packed[key], root).wait()
        marks.lap("bulk")
        return state
    skeleton, sizes = header
    buffers = {}
    for key in sorted(sizes):
        buffer = torch.empty(sizes[key], dtype=_dtype(key), device=device)
        group.broadcast(buffer, root).wait()
        buffers[key] = buffer
    marks.lap("bulk")
    result = _fill(skeleton, buffers) if want else None
    marks.lap("unpack")
    return result


class _Marks:
    """Lap times into an optional dict (``broadcast_state``'s profile)."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self.into = into
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.into[name] = now - self.t
            self.t = now
