"""Fabric-aware placement: vClos (isolated sub-Clos per job) versus ECMP-shared.

Over a ``fabric.topology.FabricSpec`` leaf-spine network::

         spine 0 ... spine S-1
          /   \\      /    \\          vclos: a job owns an m x n sub-Clos (m leaves,
       leaf 0 ... leaf L-1            n GPUs and n uplinks on each): no contention,
       |  |  |    |  |  |             but it waits until such a shape is free.
       GPUs        GPUs               ecmp: any free GPUs (lowest ids); flows are
                                      hashed onto shared uplinks, which slows the
                                      communication of every job that collides.

Everything here is placement-specific; the event loop is
:func:`scheduler.simulator.simulate` for every placement and policy.

* :class:`VClosPlacement`: the :class:`scheduler.placement.Placement` for
  ``schedule()`` on a vClos fabric (starts only).
* :class:`VClosBinder`: the simulator's vClos placement; it binds every
  decision through :func:`scheduler.binding.bind`, the function the control
  plane binds its decisions with.
* :class:`EcmpContention`: the simulator's link-contention model, per running
  job a slowdown >= 1 of its communication (``fabric.contention.ecmp_slowdown``).
* :func:`sim_placement`: a placement (and contention model) by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fabric.allocator import Allocation, VClosAllocator
from fabric.contention import ecmp_slowdown
from fabric.topology import FabricSpec
from scheduler.binding import Bound, bind
from scheduler.packing import Packing
from scheduler.placement import (
    ConsolidatedPlacement,
    CountOnly,
    CountPlacement,
    FreeList,
    SimPlacement,
)
from scheduler.types import Cluster, Decision, Gpu, GpuState, Preempt, Scale, Snapshot, Start

#: Every placement the simulator (and ``python -m scheduler``) accepts.
SIM_PLACEMENTS = ("count", "consolidated", "vclos", "ecmp")


def _sized(n: int) -> tuple[int, ...]:
    # bind() reads only the size of a decision's GPU tuple: which GPUs is its choice.
    return tuple(range(n))


class VClosPlacement:
    """The :class:`scheduler.placement.Placement` for ``schedule()`` on a vClos fabric.

    Built from a snapshot (its ``fabric_spec`` and running ``allocations``), it
    binds an isolated sub-Clos per started job on a private
    ``VClosAllocator``; preemptions in the same round free theirs first.
    Growing a vClos job would change its shape, so grows are refused here (the
    job keeps its size; the control plane's binding may migrate it instead).
    """

    name = "vclos"

    def __init__(
        self,
        spec: FabricSpec,
        allocations: Sequence[Allocation] = (),
        down: Sequence[int] = (),
    ) -> None:
        self.spec = spec
        self.allocator = VClosAllocator(spec)
        self.allocator.restore(list(allocations))
        if down:
            self.allocator.set_unavailable(down)
        self.placed: dict[str, Allocation] = {}

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> VClosPlacement:
        """The placement for one ``schedule()`` call (the snapshot must carry a fabric_spec)."""
        cluster = snapshot.cluster
        if cluster.fabric_spec is None:
            raise ValueError("vClos placement needs the snapshot's fabric_spec")
        down = [g.id for g in cluster.gpus if g.state is GpuState.DOWN]
        return cls(cluster.fabric_spec, cluster.allocations, down)

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """An isolated m x n sub-Clos for a starting job, or None (also for grows)."""
        if near or n <= 0:
            return None
        key = job or f"pending-{len(self.placed)}"
        bound, _refused = bind(self.spec, self.allocator, [Start(key, _sized(n))])
        if not bound or bound[0].allocation is None:
            return None
        self.placed[key] = bound[0].allocation
        return bound[0].new_gpus

    def release(self, job: str) -> None:
        """A preempted job's sub-Clos becomes free for this round's starts."""
        if job in self.allocator.allocations():
            bind(self.spec, self.allocator, [Preempt(job)])


class VClosBinder:
    """The simulator's vClos placement: each decision goes through :func:`bind`.

    Starts get an ``m x n`` sub-Clos; resizes keep the workers in place when
    they can (one leaf) and otherwise get a new shape (a migration); a
    decision no free shape fits is refused and the job keeps what it had.
    A start that fits no shape may move a job shrunk earlier in the same
    pass (:func:`scheduler.binding.reshape_around`), as the control
    plane's binding of a whole round does; ``reshape=False`` leaves every
    shrink in place, as the live binder did before 2026-12-04.  ``packing``: the
    servers' CPU cores and memory and the jobs' requests per GPU
    (:mod:`scheduler.packing`), which binding packs; a resize that fits only in
    part is refused here (the simulator gives a job exactly what it asks or nothing).
    """

    name = "vclos"

    def __init__(
        self, spec: FabricSpec, *, reshape: bool = True, packing: Packing | None = None
    ) -> None:
        self.spec = spec
        self.allocator = VClosAllocator(spec)
        self.reshape = reshape
        self.packing = packing
        self._admits: dict[int, bool] = {}
        self._shrunk: dict[str, Bound] = {}  # this pass's shrinks, by job

    def begin_pass(self) -> None:
        """A new scheduling pass: the previous pass's shrinks are settled."""
        self._shrunk.clear()

    def admits(self, n: int) -> bool:
        """Whether an ``n``-GPU shape exists on the empty fabric (memoised per size)."""
        known = self._admits.get(n)
        if known is None:
            known = n <= self.spec.total_gpus and VClosAllocator(self.spec).can_place(n)
            self._admits[n] = known
        return known

    def place(self, job: str, n: int) -> tuple[int, ...] | None:
        """Bind a start (queued job) or a resize (running job); None when refused."""
        decision: Decision
        if job in self.allocator.allocations():
            decision = Scale(job, _sized(n))
        else:
            decision = Start(job, _sized(n))
        shrunk = self._shrunk if self.reshape else {}
        old = self.allocator.allocations().get(job)
        if self.packing is None:
            bound, _refused = bind(self.spec, self.allocator, [decision], shrunk)
        else:
            bound, _refused = bind(
                self.spec, self.allocator, [decision], shrunk, packing=self.packing
            )
        if bound and len(bound[0].new_gpus) != n:  # packing grew it only in part: undo
            self.allocator.release(job)
            if old is not None:
                self.allocator.reserve(old)
            return None
        return bound[0].new_gpus if bound else None

    def release(self, job: str) -> None:
        """Free the job's sub-Clos (a preemption is bound as one, a completion just frees)."""
        self._shrunk.pop(job, None)
        if job in self.allocator.allocations():
            bind(self.spec, self.allocator, [Preempt(job)])


#: Traffic models of the simulator: ``ring`` (every job's collective is ring
#: all-reduce) or ``mix`` (each job's collective by its model, :data:`COLLECTIVES`).
TRAFFIC = ("ring", "mix")

#: The journal's traffic mix, one collective per model (which all-reduce each
#: data-parallel model uses is our choice; the journal names ring and
#: halving-doubling for VGG16, ResNet50, ResNet101 and BERT, hierarchical rings
#: as multi-plane rings, and all-to-all for its mixture-of-experts model).
COLLECTIVES: Mapping[str, str] = {
    "vgg16": "ring",
    "vgg19": "ring",
    "alexnet": "ring",
    "resnet50": "hring",
    "resnet152": "hring",
    "inception3": "hring",
    "resnet101": "hd",
    "bert": "hd",
    "googlenet": "hd",
    "moe": "a2a",
}

#: The models of the vclos-synthetic workload with ``--traffic mix``: the
#: journal's four data-parallel models and its mixture-of-experts model.
MIX_MODELS = ("vgg16", "resnet50", "resnet101", "bert", "moe")


def collective_for(model: str, traffic: str = "ring") -> str:
    """The collective a job of ``model`` runs under ``traffic`` (unknown models: ring)."""
    if traffic not in TRAFFIC:
        raise ValueError(f"unknown traffic {traffic!r} (choose {', '.join(TRAFFIC)})")
    if traffic == "ring":
        return "ring"
    return COLLECTIVES.get(model, "ring")


class Contention(Protocol):
    """Link contention: a slowdown >= 1 of each job's communication, given where all run."""

    def slowdowns(
        self, placed: Sequence[tuple[int, ...]], patterns: Sequence[str] | None = None
    ) -> Sequence[float]:
        """One factor per job of ``placed`` (multi-GPU jobs' GPUs in rank order), in order.

        ``patterns`` names each job's collective (None: the model's default).
        """
        ...


@dataclass(frozen=True)
class EcmpContention:
    """ECMP: every job's flows hashed onto shared uplinks (``pattern`` collectives, hash ``seed``)."""

    spec: FabricSpec
    pattern: str = "ring"
    seed: int = 0

    def slowdowns(
        self, placed: Sequence[tuple[int, ...]], patterns: Sequence[str] | None = None
    ) -> Sequence[float]:
        """The fabric's max-min analysis of all jobs' flows at once (each its own collective)."""
        return ecmp_slowdown(
            self.spec, placed, self.pattern if patterns is None else patterns, self.seed
        )


def fabric_spec_for(total_gpus: int, gpus_per_server: int, leaves: int) -> FabricSpec:
    """A full-bisection leaf-spine fabric with ``leaves`` leaves (spines = GPUs per leaf)."""
    servers = total_gpus // gpus_per_server
    if leaves <= 0 or servers % leaves:
        raise ValueError("servers must split evenly over the leaves")
    per_leaf = servers // leaves
    return FabricSpec(
        leaves=leaves,
        spines=per_leaf * gpus_per_server,
        servers_per_leaf=per_leaf,
        gpus_per_server=gpus_per_server,
    )


def sim_placement(
    name: str,
    total_gpus: int,
    gpus_per_server: int,
    fabric: FabricSpec | None = None,
    *,
    seed: int = 0,
    reshape: bool = True,
) -> tuple[SimPlacement, Contention | None]:
    """A fresh simulator placement by name, and its contention model (None: links are free).

    ``count`` (no GPU ids), ``consolidated`` (fewest servers, then leaves),
    ``vclos`` (isolated sub-Clos through ``bind()``; ``reshape``: as
    :class:`VClosBinder`) or ``ecmp`` (lowest free ids, ECMP contention with
    hash ``seed``).  The fabric ones need ``fabric``; ``consolidated`` uses
    its leaves when given (one leaf otherwise).
    """
    if name == "count":
        return CountOnly(), None
    if name not in SIM_PLACEMENTS:
        raise ValueError(f"unknown placement {name!r} (choose {', '.join(SIM_PLACEMENTS)})")
    if fabric is not None and fabric.total_gpus != total_gpus:
        raise ValueError(f"the fabric has {fabric.total_gpus} GPUs, the cluster {total_gpus}")
    servers = total_gpus // gpus_per_server
    if name == "consolidated":
        per_leaf = fabric.servers_per_leaf if fabric is not None else servers
        gpus = Cluster.uniform(servers, gpus_per_server, per_leaf).gpus
        return FreeList(ConsolidatedPlacement(), gpus), None
    if fabric is None:
        raise ValueError(f"{name} placement needs a fabric (leaves and spines)")
    if name == "vclos":
        return VClosBinder(fabric, reshape=reshape), None
    gpus = Cluster.uniform(servers, gpus_per_server, fabric.servers_per_leaf).gpus
    return FreeList(CountPlacement(), gpus, name="ecmp"), EcmpContention(fabric, seed=seed)
