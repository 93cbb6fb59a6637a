"""Placement strategies: which free GPUs a job of ``n`` GPUs gets.

A :class:`Placement` only chooses GPU ids; policies decide sizes.  ``count``
takes the lowest free ids (the Tiresias simulator's "count" scheme ignores
locality), ``consolidated`` packs a job onto as few servers, then leaves, as
it can (best fit).  The vClos strategy lives in
:mod:`scheduler.fabric_placement` and plugs in through the same protocol.

The simulator places through a :class:`SimPlacement`, which owns the
cluster's GPUs for a whole run::

    policy core: (job, n GPUs) ──> SimPlacement.place(job, n) ──> GPU ids, or None (refused)
                                   ├─ CountOnly      no ids at all (the default, fastest)
                                   ├─ FreeList       ids from a Placement above (consolidated,
                                   │                 or lowest ids for ECMP)
                                   └─ VClosBinder    scheduler.binding.bind() on a VClosAllocator
                                                     (in scheduler.fabric_placement)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler.packing import Packing
from scheduler.types import Gpu


class Placement(Protocol):
    """Chooses ``n`` GPUs among the free ones, or None when it cannot."""

    name: str

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """GPU ids in rank order, or None; ``near`` holds a growing job's GPUs."""
        ...

    def release(self, job: str) -> None:
        """The job's GPUs (all of them) are given back in this round of decisions."""
        ...


class CountPlacement:
    """Any ``n`` free GPUs: the lowest ids."""

    name = "count"

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """The ``n`` lowest free ids, or None when fewer are free."""
        if n > len(free):
            return None
        return tuple(sorted(free)[:n])

    def release(self, job: str) -> None:
        """Nothing to do: the free list is the caller's."""


class ConsolidatedPlacement:
    """Fewest servers, then fewest leaves; best fit so that empty servers stay whole.

    When growing a running job (``near`` given), servers and leaves it already
    uses are preferred.
    """

    name = "consolidated"

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """Ids packed by server then leaf, or None when fewer than ``n`` are free."""
        if n <= 0:
            return ()
        if n > len(free):
            return None
        by_server: dict[int, list[int]] = defaultdict(list)
        for gid in sorted(free):
            by_server[gpus[gid].server].append(gid)
        home_servers = {gpus[g].server for g in near if g in gpus}
        home_leaves = {gpus[g].leaf for g in near if g in gpus}
        # One server that fits: the one with the fewest free GPUs (best fit).
        fitting = [s for s, ids in by_server.items() if len(ids) >= n]
        if fitting:
            best = min(fitting, key=lambda s: (s not in home_servers, len(by_server[s]), s))
            return tuple(by_server[best][:n])
        by_leaf: dict[int, list[int]] = defaultdict(list)
        for server in by_server:
            by_leaf[gpus[by_server[server][0]].leaf].append(server)
        leaf_free = {leaf: sum(len(by_server[s]) for s in ss) for leaf, ss in by_leaf.items()}
        fitting_leaves = [leaf for leaf, f in leaf_free.items() if f >= n]
        if fitting_leaves:
            leaves = [min(fitting_leaves, key=lambda x: (x not in home_leaves, leaf_free[x], x))]
        else:
            leaves = sorted(leaf_free, key=lambda x: (x not in home_leaves, -leaf_free[x], x))
        chosen: list[int] = []
        for leaf in leaves:
            servers = sorted(
                by_leaf[leaf], key=lambda s: (s not in home_servers, -len(by_server[s]), s)
            )
            for server in servers:
                take = by_server[server][: n - len(chosen)]
                chosen.extend(take)
                if len(chosen) == n:
                    return tuple(chosen)
        return None

    def release(self, job: str) -> None:
        """Nothing to do: the free list is the caller's."""


class SelectorPlacement:
    """Another placement, each selecting job's GPUs taken only from those it may hold.

    ``allowed``: job id -> the GPU ids on servers its node selector matches (of its
    type, :mod:`scheduler.gpu_types`); a job not in it places as ``inner`` would.
    """

    def __init__(self, inner: Placement, allowed: Mapping[str, frozenset[int]]) -> None:
        self.name = inner.name
        self.inner = inner
        self.allowed = allowed

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """The inner placement over the free GPUs the job may hold."""
        ids = self.allowed.get(job)
        if ids is not None:
            free = [g for g in free if g in ids]
        return self.inner.place(n, free, gpus, near=near, job=job)

    def release(self, job: str) -> None:
        """The inner placement's release."""
        self.inner.release(job)


class SimPlacement(Protocol):
    """The simulator's side of placement: it holds every job's GPUs for the whole run."""

    name: str

    def admits(self, n: int) -> bool:
        """Whether a job of ``n`` GPUs could ever be placed (on the empty cluster)."""
        ...

    def place(self, job: str, n: int) -> tuple[int, ...] | None:
        """Give ``job`` exactly ``n`` GPUs (start, grow or shrink); None: refused, nothing changes."""
        ...

    def release(self, job: str) -> None:
        """The job stopped (finished or preempted): all its GPUs are free."""
        ...

    def begin_pass(self) -> None:
        """A scheduling pass begins: what the last one shrank is settled."""
        ...


class CountOnly:
    """Placement by count alone: every decision fits (the policy counted), no GPU ids."""

    name = "count"

    def admits(self, n: int) -> bool:
        """Always: a job larger than the cluster simply never starts (and is reported)."""
        return True

    def place(self, job: str, n: int) -> tuple[int, ...] | None:
        """No ids: the count model needs none."""
        return ()

    def release(self, job: str) -> None:
        """Nothing is held."""

    def begin_pass(self) -> None:
        """Nothing to settle."""


class FreeList:
    """GPU ids from a :class:`Placement` over a free list the simulator keeps.

    Shrinking keeps the first GPUs of the job (rank order); growing asks the
    placement for the extra GPUs next to the job's own, as ``schedule()`` does.
    ``packing`` (the servers' CPU cores and memory, the jobs' requests per GPU:
    :mod:`scheduler.packing`): an asking job's new GPUs come only from servers whose
    cores and memory still hold them beside the other jobs' (None: GPUs alone).
    """

    def __init__(
        self,
        placement: Placement,
        gpus: Sequence[Gpu],
        name: str = "",
        packing: Packing | None = None,
    ) -> None:
        self.name = name or placement.name
        self.placement = placement
        self.gpus = {g.id: g for g in gpus}
        self.free = set(self.gpus)
        self.held: dict[str, tuple[int, ...]] = {}
        self.packing = packing

    def admits(self, n: int) -> bool:
        """A job fits the empty cluster when it asks for at most all of its GPUs."""
        return n <= len(self.gpus)

    def place(self, job: str, n: int) -> tuple[int, ...] | None:
        """Keep a prefix to shrink; add GPUs chosen by the placement to start or grow."""
        current = self.held.get(job, ())
        if n <= len(current):
            self.free.update(current[n:])
            chosen = current[:n]
        else:
            free = sorted(self.free)
            packing = self.packing
            if packing is not None and job in packing.requests:
                mine = [packing.server_of(g) for g in current]
                room = {
                    s: max(0, k - mine.count(s)) for s, k in packing.room(job, self.held).items()
                }
                hidden = set(packing.hide(room, free))
                free = [g for g in free if g not in hidden]
            extra = self.placement.place(n - len(current), free, self.gpus, near=current, job=job)
            if extra is None:
                return None
            self.free.difference_update(extra)
            chosen = current + extra
        self.held[job] = chosen
        return chosen

    def begin_pass(self) -> None:
        """Nothing to settle: a shrink keeps a prefix, whatever comes after it."""

    def release(self, job: str) -> None:
        """Return the job's GPUs to the free list."""
        self.free.update(self.held.pop(job, ()))


def get_placement(name: str) -> Placement:
    """A placement by name: ``count`` or ``consolidated`` (fabric-aware ones in fabric_placement)."""
    if name == "count":
        return CountPlacement()
    if name == "consolidated":
        return ConsolidatedPlacement()
    raise ValueError(f"unknown placement {name!r} (choose count or consolidated)")
