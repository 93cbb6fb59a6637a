"""The gradient all-reduce's payload: the flat gradients, then the control vector.

::

    [ grad p0 | grad p1 | ... | plan seq | loss sum | sample count | t(rank 0) | ... | t(rank n-1) ]
                                └──────────── CTRL_FIXED ─────────┘ └── compute time per rank ──┘

Summed over the members, the control vector tells every member the same
latest plan number (only the leader writes it), the global loss and sample
count, and everyone's compute time (the leader's straggler input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workers.elastic.constants import CTRL_FIXED


@dataclass(frozen=True)
class Synced:
    """What a member learns from one all-reduce besides the gradients."""

    plan_seq: int
    mean_loss: float
    times: dict[str, float]


def pack(
    params: list[torch.nn.Parameter],
    *,
    plan_seq: int,
    loss_sum: float,
    count: int,
    rank: int,
    world: int,
    compute_s: float,
    device: torch.device,
) -> torch.Tensor:
    """The flat buffer to all-reduce for this member."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    ctrl = torch.zeros(CTRL_FIXED + world, dtype=grads[0].dtype, device=device)
    ctrl[0] = float(plan_seq)
    ctrl[1] = float(loss_sum)
    ctrl[2] = float(count)
    ctrl[CTRL_FIXED + rank] = compute_s
    return torch.cat([g.reshape(-1) for g in grads] + [ctrl])


def unpack(flat: torch.Tensor, params: list[torch.nn.Parameter], members: list[str]) -> Synced:
    """Set each parameter's gradient to the global mean; return the control vector's news."""
    n_ctrl = CTRL_FIXED + len(members)
    ctrl = flat[-n_ctrl:].cpu()
    total = float(ctrl[2])
    grads = flat[:-n_ctrl]
    if total > 0:
        grads.div_(total)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.copy_(grads[offset : offset + n].view_as(p))
        offset += n
    return Synced(
        plan_seq=round(float(ctrl[0])),
        mean_loss=float(ctrl[1]) / total if total > 0 else math.nan,
        times={w: float(ctrl[CTRL_FIXED + i]) for i, w in enumerate(members)},
    )
