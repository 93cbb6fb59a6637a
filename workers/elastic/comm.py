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
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def build_group(
    store: dist.Store, generation: int, rank: int, size: int, device: torch.device, timeout_s: float
) -> Any:
    """Construct (collectively, blocking) the process group of one generation."""
    prefixed = dist.PrefixStore(f"gen{generation}/", store)
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def allreduce_sum(group: Any, tensor: torch.Tensor) -> None:
    """In-place sum over the group; raises on a peer's failure or timeout."""
    group.allreduce([tensor]).wait()


def broadcast_object(group: Any, obj: Any, root: int, device: torch.device) -> Any:
    """Send ``obj`` (anything ``torch.save`` takes) from ``root`` to every member.

    Two collectives: the byte length, then the bytes as one uint8 tensor, so a
    model of any size costs one transfer.
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
    group.broadcast(length, root).wait()
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    payload = payload.to(device)
    group.broadcast(payload, root).wait()
    if is_root:
        return obj
    data = payload.cpu().numpy().tobytes()
    return torch.load(io.BytesIO(data), map_location=device, weights_only=False)
