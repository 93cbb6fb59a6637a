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
    store: Store,
    generation: int,
    rank: int,
    size: int,
    device: torch.device,
    timeout_s: float,
    backend: str | None = None,
) -> Any:
    """Construct (collectively, blocking) the process group of one generation.

    ``backend``: ``nccl`` or ``gloo`` (``cli.communicator_backend``); None
    means NCCL on a CUDA device, gloo otherwise.
    """
    prefixed = PrefixStore(f"gen{generation}/", store)
    timeout = timedelta(seconds=timeout_s)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("NCCL is not available in this build of torch (use --comm gloo)")
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
                # Done by now: either it failed (a peer's connection closed), and this
                # wait raises its error, or it finished just after the slice ran out,
                # and this wait returns.  Re-raising the slice's "Operation timed out!"
                # failed a healthy generation (bench run 2026-12-04 04:08, j02: a
                # recovery from step 0 that cost 33 s).
                work.wait()
                return
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


# -- point to point: the state goes only to the members that lack it ----------------------

TENSOR_KEY = "__edl_tensor__"
"""Marks, in a sent state's skeleton, which of the tensors that follow the header sits there."""

HEADER_TAGS = (0, 1)
"""Tags of the header's length and bytes; tensor ``i`` travels with tag ``FIRST_TENSOR_TAG + i``."""
FIRST_TENSOR_TAG = 2
WARM_UP_TAG = 2**30
"""Tag of ``warm_up``'s point-to-point token (no tensor of a state has that many before it)."""


def is_gloo(group: Any) -> bool:
    """Whether ``group`` is a gloo group (its waits block the host; CUDA tensors go via the host)."""
    return isinstance(group, dist.ProcessGroupGloo)


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by its place in ``tensors`` (appended in walk order)."""
    if isinstance(obj, torch.Tensor):
        mark = [str(obj.dtype).removeprefix("torch."), len(tensors), list(obj.shape)]
        tensors.append(obj.detach().contiguous())
        return {TENSOR_KEY: mark}
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _tensor_mark(obj: Any) -> tuple[torch.dtype, int, tuple[int, ...]] | None:
    """(dtype, index, shape) when a skeleton entry stands for a tensor; None for plain values."""
    if not (isinstance(obj, dict) and len(obj) == 1 and TENSOR_KEY in obj):
        return None
    dtype, index, shape = obj[TENSOR_KEY]
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"sent state: negative dimension in {dims}")
    return _dtype(dtype), int(index), dims


def _marks(obj: Any, into: list[tuple[torch.dtype, tuple[int, ...]]]) -> None:
    """The skeleton's tensors in walk order; ValueError unless they are numbered 0, 1, 2, ..."""
    mark = _tensor_mark(obj)
    if mark is not None:
        dtype, index, shape = mark
        if index != len(into):
            raise ValueError(f"sent state: tensor {index} where {len(into)} was due")
        into.append((dtype, shape))
    elif isinstance(obj, dict):
        for v in obj.values():
            _marks(v, into)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _marks(v, into)


def _join(obj: Any, tensors: list[torch.Tensor]) -> Any:
    mark = _tensor_mark(obj)
    if mark is not None:
        return tensors[mark[1]]
    if isinstance(obj, dict):
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_join(v, tensors) for v in obj)
    return obj


def send_state(
    group: Any,
    state: Any,
    to: list[int],
    timings: dict[str, float] | None = None,
) -> None:
    """Send a state (nested dicts/lists of tensors and plain values) to the ranks ``to`` only.

    What a scale-out needs: the members that stay already hold the state, so
    only the newcomers receive it, point to point from one source. A small
    header first (the skeleton, plain data: loaded with ``weights_only``), then
    every tensor as it lies in memory, all sends posted at once: no
    concatenation on this side, no unpacking on the other. Returns once every
    receiver has everything (the state may change afterwards). ``timings``
    receives ``skeleton`` (the header) and ``bulk`` (the tensors) seconds.
    """
    marks = _Marks(timings)
    tensors: list[torch.Tensor] = []
    skeleton = _split(state, tensors)
    buffer = io.BytesIO()
    torch.save(skeleton, buffer)
    header = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([header.numel()], dtype=torch.int64)
    gloo = is_gloo(group)
    device = tensors[0].device if tensors else torch.device("cpu")
    # gloo moves CUDA tensors through the host; NCCL sends device memory itself.
    wire = [t.cpu() for t in tensors] if gloo and device.type == "cuda" else tensors
    if not gloo:
        length, header = length.to(device), header.to(device)
    works = []
    for dst in to:
        works.append(group.send([length], dst, HEADER_TAGS[0]))
        works.append(group.send([header], dst, HEADER_TAGS[1]))
    for work in works:
        work.wait()
    marks.lap("skeleton")
    works = [
        group.send([tensor], dst, FIRST_TENSOR_TAG + i)
        for dst in to
        for i, tensor in enumerate(wire)
        if tensor.numel() > 0
    ]
    for work in works:
        work.wait()
    marks.lap("bulk")


def receive_state(
    group: Any,
    source: int,
    device: torch.device,
    timeout_s: float | None = None,
    timings: dict[str, float] | None = None,
) -> Any:
    """Receive what ``send_state`` sends from ``source``; the tensors land on ``device``.

    ``timeout_s`` bounds the wait for the header (a newcomer waits for its
    switch step, possibly many mini-batches). The header is loaded with
    ``weights_only=True``: a peer sends data, never code.
    """
    marks = _Marks(timings)
    gloo = is_gloo(group)
    wire_device = torch.device("cpu") if gloo else device
    wait = None if timeout_s is None else timedelta(seconds=timeout_s)
    length = torch.zeros(1, dtype=torch.int64, device=wire_device)
    work = group.recv([length], source, HEADER_TAGS[0])
    if wait is None:
        work.wait()
    else:
        work.wait(wait)
    header = torch.empty(int(length.item()), dtype=torch.uint8, device=wire_device)
    group.recv([header], source, HEADER_TAGS[1]).wait()
    data = header.cpu().numpy().tobytes()
    skeleton = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    marks.lap("skeleton")
    shapes: list[tuple[torch.dtype, tuple[int, ...]]] = []
    _marks(skeleton, shapes)
    tensors = [torch.empty(shape, dtype=dtype, device=wire_device) for dtype, shape in shapes]
    works = [
        group.recv([tensor], source, FIRST_TENSOR_TAG + i)
        for i, tensor in enumerate(tensors)
        if tensor.numel() > 0
    ]
    for work in works:
        work.wait()
    if wire_device != device:
        tensors = [t.to(device) for t in tensors]
    marks.lap("bulk")
    return _join(skeleton, tensors)


def warm_up(group: Any, rank: int, source: int, joiners: list[int], device: torch.device) -> None:
    """Exercise a freshly built group before its switch, off the training thread.

    All members of the group call this, in the same order, before they say
    they are ready; the switch then pays for the state's bytes only. The
    source sends one small tensor to each joiner (NCCL opens its point-to-point
    channels at the first send; gloo proves the pair). Before that, on gloo,
    every member runs one small all-reduce; on NCCL the communicator is
    created instead (``eager_connect_single_device``: NCCL otherwise creates
    it at the group's first collective, seconds on some machines), because
    a collective of the new group here could run on the GPU alongside the old
    group's all-reduce in the training thread, in another order on another
    member: NCCL may then deadlock. A send to a joiner cannot (the joiner runs
    nothing else).
    """
    if is_gloo(group):
        token = torch.ones(1, device=device)
        group.allreduce([token]).wait()
        wire = token.cpu()
    else:
        group.eager_connect_single_device(device)
        wire = torch.ones(1, device=device)
    if rank == source:
        for work in [group.send([wire], dst, WARM_UP_TAG) for dst in joiners]:
            work.wait()
    elif rank in joiners:
        group.recv([wire], source, WARM_UP_TAG).wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
