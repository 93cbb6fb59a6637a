"""``set_aside``: the held GPUs' views shown down, found by index or, with gaps, by a scan."""

from __future__ import annotations

import pytest

from control.assembly import set_aside
from scheduler.types import Gpu, GpuState


def views(indices: list[int]) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(id=i, server=i // 4, leaf=i // 8, state=GpuState.BUSY, job=f"job-{i // 2}")
        for i in indices
    )


@pytest.mark.parametrize(
    "indices", [list(range(16)), [0, 1, 2, 5, 6, 7, 9, 12, 13, 14]], ids=["0..n-1", "gaps"]
)
def test_only_the_held_gpus_go_down_and_keep_their_place(indices: list[int]) -> None:
    gpus = views(indices)
    held = [5, 6, 12, 5]  # a repeat changes nothing
    aside = set_aside(gpus, held)
    assert [g.id for g in aside] == indices
    assert {g.id for g in aside if g.state == GpuState.DOWN} == {5, 6, 12}
    assert all(a == g for a, g in zip(aside, gpus, strict=True) if a.id not in held)
    assert all(a.job == g.job and a.leaf == g.leaf for a, g in zip(aside, gpus, strict=True))
    assert set_aside(gpus, []) is gpus
