"""CPU cores and host memory beside the GPUs: how many of a job's GPUs each server still holds.

A server has CPU cores and host memory (``Cluster.server_capacity``; 0: not
known, which bounds nothing); a job asks for some beside each GPU
(``JobView.cpus_per_gpu``, ``mem_per_gpu_mib``).  Each GPU a job holds on a
server takes its per-GPU share of that server, and binding never puts a job's
GPU on a server where what is left would go negative, for starts, elastic
scale-out and migrations alike::

    server 0: 8 GPUs, 16 cores          job a: 4 GPUs x 4 cores = all 16 cores
    ┌──┬──┬──┬──┬──┬──┬──┬──┐
    │a │a │a │a │  │  │  │  │          job b (4 cores a GPU): room on server 0 =
    └──┴──┴──┴──┴──┴──┴──┴──┘          (16 - 16) // 4 = 0 of its 4 free GPUs

The policy counts GPUs; binding (:mod:`scheduler.binding`) asks
:meth:`Packing.room` how many GPUs of the job it places each bounded server can
still take, and hides that server's other free GPUs from the allocator while it
places the job.  No job asking, or no server with a known capacity:
:func:`packing_for` is None and binding is what it was, decision for decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.types import ServerCapacity, Snapshot

Holdings = Mapping[str, Sequence[int]]
"""Job name -> the GPU ids it holds."""


@dataclass(frozen=True, slots=True)
class PerGpu:
    """What a job asks beside each of its GPUs: CPU cores and host memory (MiB)."""

    cpus: int = 0
    mem_mib: int = 0


CPU = "CPU cores"
MEMORY = "host memory"


@dataclass(frozen=True, slots=True)
class Packing:
    """What binding packs by: each bounded server's capacity, each asking job's request.

    ``capacity``: server id -> its cores and memory (a server absent, or a figure 0,
    is unbounded in that figure); ``requests``: job name -> what it asks per GPU (a
    job absent asks nothing and is placed as before); ``servers``: GPU id -> its
    server id.
    """

    capacity: Mapping[int, ServerCapacity]
    requests: Mapping[str, PerGpu]
    servers: Mapping[int, int]

    def server_of(self, gpu: int) -> int:
        """The server of GPU ``gpu`` (-1: a GPU the snapshot does not list, unbounded)."""
        return self.servers.get(gpu, -1)

    def used(self, holdings: Holdings, skip: str = "") -> dict[int, tuple[int, int]]:
        """Per bounded server, the cores and memory the asking jobs of ``holdings`` (but
        ``skip``) take there."""
        use: dict[int, tuple[int, int]] = {}
        for job, ask in self.requests.items():
            if job == skip:
                continue
            for gpu in holdings.get(job, ()):
                server = self.server_of(gpu)
                if server in self.capacity:
                    cpus, mem = use.get(server, (0, 0))
                    use[server] = (cpus + ask.cpus, mem + ask.mem_mib)
        return use

    def account(
        self, use: dict[int, tuple[int, int]], job: str, gpus: Sequence[int], step: int
    ) -> None:
        """Count ``job`` holding ``gpus`` in (``step`` 1) or out (-1) of ``use`` (per bounded
        server, as :meth:`used` gives it): binding keeps it as it moves jobs."""
        ask = self.requests.get(job)
        if ask is None:
            return
        for gpu in gpus:
            server = self.server_of(gpu)
            if server in self.capacity:
                cpus, mem = use.get(server, (0, 0))
                use[server] = (cpus + step * ask.cpus, mem + step * ask.mem_mib)

    def room_in(self, use: Mapping[int, tuple[int, int]], ask: PerGpu) -> dict[int, int]:
        """Per bounded server, how many GPUs asking ``ask`` each it can hold beside ``use``
        (what the jobs there take); a server absent is unbounded for such a GPU."""
        if not (ask.cpus or ask.mem_mib):
            return {}
        room: dict[int, int] = {}
        for server, cap in self.capacity.items():
            cpus, mem = use.get(server, (0, 0))
            limit = -1
            if ask.cpus and cap.cpus:
                limit = max(0, cap.cpus - cpus) // ask.cpus
            if ask.mem_mib and cap.mem_mib:
                by_mem = max(0, cap.mem_mib - mem) // ask.mem_mib
                limit = by_mem if limit < 0 else min(limit, by_mem)
            if limit >= 0:
                room[server] = limit
        return room

    def room(self, job: str, holdings: Holdings, ask: PerGpu | None = None) -> dict[int, int]:
        """Per bounded server, how many GPUs of ``job`` it can hold beside what the other
        jobs of ``holdings`` take (``ask``: the request to count, default the job's own);
        a server absent is unbounded for it."""
        ask = self.requests.get(job) if ask is None else ask
        if ask is None:
            return {}
        return self.room_in(self.used(holdings, skip=job), ask)

    def over(self, holdings: Holdings) -> frozenset[int]:
        """The servers whose cores or memory the asking jobs of ``holdings`` overrun."""
        return frozenset(
            server
            for server, (cpus, mem) in self.used(holdings).items()
            if (self.capacity[server].cpus and cpus > self.capacity[server].cpus)
            or (self.capacity[server].mem_mib and mem > self.capacity[server].mem_mib)
        )

    def hide(
        self, room: Mapping[int, int], free: Sequence[int], keep: Sequence[int] = ()
    ) -> list[int]:
        """Of the ``free`` GPUs, those beyond each bounded server's ``room`` (``keep``, a
        job's own GPUs, counted first, then by id): what a job may not take there.

        Binding hides these from the allocator while it places the job, and shows them
        again after.
        """
        if not room:
            return []
        own = frozenset(keep)
        taken: dict[int, int] = {}
        hidden: list[int] = []
        for gpu in sorted(free, key=lambda g: (g not in own, g)):
            server = self.server_of(gpu)
            limit = room.get(server)
            if limit is None:
                continue
            count = taken.get(server, 0)
            if count < limit:
                taken[server] = count + 1
            else:
                hidden.append(gpu)
        return hidden

    def hidden(
        self, job: str, holdings: Holdings, free: Sequence[int], keep: Sequence[int] = ()
    ) -> list[int]:
        """Of the ``free`` GPUs, those ``job`` may not take beside what the other jobs of
        ``holdings`` hold (:meth:`room`, :meth:`hide`)."""
        return self.hide(self.room(job, holdings), free, keep)

    def hidden_by(
        self, resource: str, job: str, holdings: Holdings, free: Sequence[int]
    ) -> list[int]:
        """:meth:`hidden` counting only ``resource`` (:data:`CPU` or :data:`MEMORY`) of the
        job's request: to tell which of the two a refused job waits for."""
        ask = self.requests.get(job, PerGpu())
        only = PerGpu(cpus=ask.cpus) if resource == CPU else PerGpu(mem_mib=ask.mem_mib)
        return self.hide(self.room(job, holdings, only), free)

    def waits_for(self, job: str, resource: str, size: int) -> str:
        """Why ``job`` waits when its ``size`` GPUs fit the fabric but not ``resource``."""
        ask = self.requests.get(job, PerGpu())
        each = f"{ask.cpus} CPU cores" if resource == CPU else f"{ask.mem_mib} MiB of host memory"
        return (
            f"waits for {resource}: its {size} GPUs need {each} each beside them, and the "
            "servers with free GPUs have too little left"
        )


def packing_for(snapshot: Snapshot) -> Packing | None:
    """What binding packs by on ``snapshot``'s cluster; None when nothing is to pack (no job
    asks for CPU or memory, or no server's capacity is known)."""
    capacity = {
        server: cap
        for server, cap in snapshot.cluster.server_capacity.items()
        if cap.cpus or cap.mem_mib
    }
    if not capacity:
        return None
    requests = {
        view.id: PerGpu(view.cpus_per_gpu, view.mem_per_gpu_mib)
        for view in snapshot.jobs
        if view.cpus_per_gpu or view.mem_per_gpu_mib
    }
    if not requests:
        return None
    servers = {gpu.id: gpu.server for gpu in snapshot.cluster.gpus}
    return Packing(capacity, requests, servers)
