"""The vClos allocator: contention-free placement of jobs on a leaf-spine fabric.

A job of ``z`` GPUs goes under a single leaf when one has ``z`` free GPUs
(best-fit: the fullest such leaf); it needs no spine link. Otherwise it gets an
``m x n`` *virtual Clos* (``m * n = z``)::

      uplink ports P = {p0, p1}  (n = 2, the same on every chosen leaf)
         spine p0%S      spine p1%S
           |   \\          /   |         all m * n cables (leaf, p) for p in P
           |     \\      /     |         are reserved for this job alone
         leaf a          leaf b          (m = 2)
         r0  r1          r2  r3          ranks: leaf by leaf, slot by slot
    slot 0 -> p0, slot 1 -> p1           source routing: slot r of every leaf
                                         leaves through uplink P[r]

``m`` starts at ``max(odd part of z, ceil(z / gpus_per_leaf))`` (rounded up to
the next ``odd * 2**a``, so that ``n`` is a power of two) and doubles.

Representation. The unit of reservation is a *cable* ``(leaf, uplink port u)``,
reaching spine ``u % spines``. The search works on uplink port indices (called
*planes* here); with ``uplinks == spines`` a plane is a spine. A job's planes
``P`` are the same set on every leaf it uses, so spine ``P[r] % spines`` forwards
traffic down to the destination leaf on that leaf's cable ``P[r]``, also
reserved for the job: no link is shared with another job, and ring,
halving-doubling (any size), hierarchical ring and all-to-all inside the job put
at most one flow on a directed link per step.

State is a pair of bitsets per leaf (Python ints): free GPU ports and free
uplink ports. Finding an ``m x n`` shape is finding ``n`` planes common to the
free-uplink sets of ``m`` leaves that each have ``n`` free GPUs, i.e. a
biclique. The search (:func:`find_biclique`) first walks the candidates in
best-fit order keeping a leaf while the common free planes stay ``>= n`` (this
greedy pass almost always succeeds); otherwise it peels planes free on fewer
than ``m`` candidate leaves and leaves with fewer than ``n`` surviving planes
until nothing changes, then runs an exact depth-first search
(:func:`_grouped_search`) on the smaller side (planes when ``n < m``, else
leaves): items with identical bitsets grouped, intersections explored in
best-fit order, each node tightened by a k-core step and memoised. If it finds
nothing, no shape exists. (The problem is a balanced biclique, NP-hard in
general; vClos states are structured and searches take microseconds, see
``docs/benchmarks.md`` for random worst cases.)

Best-fit everywhere: among solutions' planes, the ones already reserved on the
most leaves are used first; leaves are taken fullest first; within a leaf,
whole free servers are taken for whole multiples of a server and the rest from
the fullest server that still fits, so empty servers, leaves and spines stay
whole.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fabric.errors import AllocationConflictError, PlacementError, UnknownJobError
from fabric.topology import FabricSpec


def _freeze_routes(routes: Mapping[int, Mapping[int, int]]) -> Mapping[int, Mapping[int, int]]:
    if isinstance(routes, MappingProxyType) and all(
        isinstance(m, MappingProxyType) for m in routes.values()
    ):
        return routes  # built frozen by the allocator
    return MappingProxyType(
        {
            int(leaf): MappingProxyType({int(p): int(s) for p, s in m.items()})
            for leaf, m in routes.items()
        }
    )


@dataclass(frozen=True)
class Allocation:
    """What a job holds: GPUs in rank order, leaves, spines, reserved cables, routes.

    * ``gpus``: global GPU ids in rank order (leaf by leaf in ``leaves`` order,
      the same slot order on every leaf).
    * ``leaves``: leaves used, ascending.
    * ``spines``: distinct spines used, ascending (empty for a single-leaf job).
    * ``links``: ``(leaf, spine)`` per reserved cable, sorted (a pair repeats
      only when a job holds parallel cables to one spine, i.e. uplinks > spines).
    * ``routes``: ``leaf -> leaf port -> spine`` for the job's GPU ports: the
      source-routing map. Empty for a single-leaf job.
    * ``uplinks``: uplink port per slot (the planes; same on every leaf). The
      exact cable of GPU port ``p`` of leaf ``l`` is ``(l, uplinks[slot])``
      where ``slot`` is the rank of ``p`` among the job's ports on ``l``.
    """

    job_id: str
    gpus: tuple[int, ...]
    leaves: tuple[int, ...]
    spines: tuple[int, ...] = ()
    links: tuple[tuple[int, int], ...] = ()
    routes: Mapping[int, Mapping[int, int]] = field(default_factory=dict, compare=False)
    uplinks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", _freeze_routes(self.routes))

    @property
    def size(self) -> int:
        """Number of GPUs."""
        return len(self.gpus)

    @property
    def gpus_per_leaf(self) -> int:
        """GPUs the job has on each of its leaves (``n``)."""
        return len(self.gpus) // max(1, len(self.leaves))

    def cables(self) -> tuple[tuple[int, int], ...]:
        """Reserved cables as ``(leaf, uplink port)`` pairs."""
        return tuple((leaf, u) for leaf in self.leaves for u in self.uplinks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (route keys become strings, as JSON requires)."""
        return {
            "job": self.job_id,
            "gpus": list(self.gpus),
            "leaves": list(self.leaves),
            "spines": list(self.spines),
            "links": [list(pair) for pair in self.links],
            "uplinks": list(self.uplinks),
            "routes": {
                str(leaf): {str(p): s for p, s in m.items()} for leaf, m in self.routes.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Allocation:
        """Inverse of :meth:`to_dict`; raises :class:`ValueError` on malformed data."""
        try:
            job = data["job"] if "job" in data else data["job_id"]
            if not isinstance(job, str) or not job:
                raise ValueError("job must be a non-empty string")
            routes = {
                int(leaf): {int(p): int(s) for p, s in m.items()}
                for leaf, m in data.get("routes", {}).items()
            }
            return cls(
                job_id=job,
                gpus=tuple(int(g) for g in data["gpus"]),
                leaves=tuple(int(x) for x in data["leaves"]),
                spines=tuple(int(x) for x in data.get("spines", ())),
                links=tuple((int(a), int(b)) for a, b in data.get("links", ())),
                routes=routes,
                uplinks=tuple(int(x) for x in data.get("uplinks", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed allocation: {exc}") from exc


def odd_part(z: int) -> int:
    """``z`` with all factors of two removed."""
    return z >> ((z & -z).bit_length() - 1)


def clos_shapes(spec: FabricSpec, z: int) -> list[tuple[int, int]]:
    """Multi-leaf ``(m, n)`` shapes tried for a job of ``z`` GPUs, in order.

    ``m = odd * 2**a`` (so ``n = z / m`` is a power of two), ``m >= 2``,
    ``m >= ceil(z / gpus_per_leaf)``, ``m <= leaves``.
    """
    gpl = spec.gpus_per_leaf
    lo = max(2, -(-z // gpl))
    shapes = []
    m = odd_part(z)
    while m <= z and m <= spec.leaves:
        if m >= lo:
            shapes.append((m, z // m))
        m *= 2
    return shapes


def find_biclique(
    masks: Mapping[int, int],
    m: int,
    n: int,
    order: Iterable[int],
    plane_leaves: Sequence[int] | None = None,
) -> tuple[int, int] | None:
    """Find ``m`` keys of ``masks`` whose bitsets share ``n`` set bits.

    ``masks`` maps a candidate leaf to its free-plane bitset (only leaves that
    have the GPUs). ``order`` lists the candidates in preference order.
    ``plane_leaves[p]``, if given, is a bitset of leaves (any superset of the
    candidates) on which plane ``p`` is free; it saves transposing ``masks``.
    Returns ``(common_planes_mask, count)`` for the first intersection found
    whose set of compatible candidates (those whose bitset contains it) has at
    least ``m`` members, or ``None`` if no such intersection exists (exact).
    """
    order = list(order)
    # Fast path: greedy over the preference order, keeping a leaf when the common
    # planes stay >= n. It usually succeeds; the exact search below runs when it does not.
    cur, taken = -1, 0
    for leaf in order:
        nxt = cur & masks.get(leaf, 0)
        if nxt.bit_count() >= n:
            cur, taken = nxt, taken + 1
            if taken >= m:
                return cur, taken
    cand = dict(masks)
    if plane_leaves is None:
        width = max((mk.bit_length() for mk in cand.values()), default=0)
        plane_leaves = [
            sum(1 << leaf for leaf, mk in cand.items() if mk >> p & 1) for p in range(width)
        ]
    good = 0
    for mk in cand.values():
        good |= mk
    # Peel: a plane is usable only if free on >= m candidates; a candidate only if it
    # keeps >= n usable planes. Repeat to a fixpoint (like a k-core).
    while True:
        if len(cand) < m:
            return None
        cand_bits = 0
        for leaf in cand:
            cand_bits |= 1 << leaf
        new_good = 0
        g = good
        while g:
            low = g & -g
            if (plane_leaves[low.bit_length() - 1] & cand_bits).bit_count() >= m:
                new_good |= low
            g ^= low
        shrunk = {
            leaf: mk & new_good for leaf, mk in cand.items() if (mk & new_good).bit_count() >= n
        }
        if len(shrunk) == len(cand) and new_good == good:
            break
        cand, good = shrunk, new_good
    if good.bit_count() < n:
        return None
    if n < m:
        # Fewer planes to choose than leaves: search on the plane side (the problem is
        # symmetric), where intersections of leaf sets shrink below m within a few
        # steps, then map the answer back to a set of planes.
        cand_bits = 0
        for leaf in cand:
            cand_bits |= 1 << leaf
        columns: dict[int, int] = {}
        g = good
        while g:
            low = g & -g
            p = low.bit_length() - 1
            columns[p] = plane_leaves[p] & cand_bits
            g ^= low
        busiest = sorted(columns, key=lambda p: (columns[p].bit_count(), p))
        hit = _grouped_search(columns, n, m, busiest, cand_bits)
        if hit is None:
            return None
        leaves_mask, _ = hit
        planes_mask = 0
        for p, col in columns.items():
            if col & leaves_mask == leaves_mask:
                planes_mask |= 1 << p
        return planes_mask, leaves_mask.bit_count()
    return _grouped_search(cand, m, n, order, good)


def _grouped_search(
    items: Mapping[int, int], k_a: int, k_b: int, order: Sequence[int], universe: int
) -> tuple[int, int] | None:
    """Exact search for a set of ``>= k_b`` bits contained in ``>= k_a`` of ``items``' masks.

    Items with identical masks form a group (taking one means taking all: the
    count only grows). Depth-first over intersections of group masks in
    ``order`` (preference), starting from ``universe``; at every node the
    intersection is tightened by dropping bits that fewer than ``k_a`` still
    viable items contain (no solution below the node can use them), nodes are
    memoised, and a branch stops when the viable items number fewer than ``k_a``.
    Returns ``(intersection, items containing it)`` or ``None``.
    """
    groups: dict[int, int] = {}
    rank: dict[int, int] = {}
    for pos, key in enumerate(order):
        if key not in items:
            continue
        mk = items[key]
        groups[mk] = groups.get(mk, 0) + 1
        rank.setdefault(mk, pos)
    glist = sorted(groups, key=lambda mk: (mk.bit_count(), rank[mk]))
    # Items expanded to bit positions: group j owns item bits gbits[j]; column[b] is the
    # set of items whose mask has bit b, so "items containing b among V" is a popcount.
    gbits: list[int] = []
    column: dict[int, int] = {}
    nxt = 0
    for mk in glist:
        size = groups[mk]
        bits = ((1 << size) - 1) << nxt
        nxt += size
        gbits.append(bits)
        rest = mk
        while rest:
            low = rest & -rest
            b = low.bit_length() - 1
            column[b] = column.get(b, 0) | bits
            rest ^= low

    def tighten(cur: int) -> tuple[int, int]:
        """Drop bits of ``cur`` held by fewer than ``k_a`` viable items; return (cur, viable)."""
        while True:
            viable = 0
            for mk, bits in zip(glist, gbits, strict=True):
                if (mk & cur).bit_count() >= k_b:
                    viable |= bits
            if viable.bit_count() < k_a:
                return 0, 0
            kept = 0
            rest = cur
            while rest:
                low = rest & -rest
                if (column.get(low.bit_length() - 1, 0) & viable).bit_count() >= k_a:
                    kept |= low
                rest ^= low
            if kept == cur:
                return cur, viable
            if kept.bit_count() < k_b:
                return 0, 0
            cur = kept

    def holders(cur: int) -> int:
        return sum(
            bits.bit_count() for mk, bits in zip(glist, gbits, strict=True) if mk & cur == cur
        )

    seen: dict[int, int] = {}

    def dfs(start: int, cur: int) -> tuple[int, int] | None:
        for j in range(start, len(glist)):
            new = cur & glist[j]
            if new.bit_count() < k_b:
                continue
            new, viable = tighten(new)
            if not viable:
                continue
            prev = seen.get(new)
            if prev is not None and prev <= j:
                continue
            seen[new] = j
            cnt = holders(new)
            if cnt >= k_a:
                return new, cnt
            found = dfs(j + 1, new)
            if found is not None:
                return found
        return None

    return dfs(0, universe)


class VClosAllocator:
    """Mutable fabric state plus the vClos placement policy.

    Not thread-safe: one owner (the scheduler tick, the simulator) drives it.
    Unavailable (down or draining) GPUs are never handed out; marking a GPU that
    a job holds keeps the job's allocation and takes effect when it is released.
    """

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self._gpl = spec.gpus_per_leaf
        self._full = (1 << self._gpl) - 1
        self._down = [0] * spec.leaves
        self._reset()

    def _reset(self) -> None:
        spec = self.spec
        self._busy = [0] * spec.leaves  # GPU ports held by jobs
        self._free_up = [self._full] * spec.leaves  # uplink ports not reserved
        self._plane_use = [0] * self._gpl  # leaves on which each plane is reserved
        self._plane_free = [
            (1 << spec.leaves) - 1
        ] * self._gpl  # leaves on which each plane is free
        self._allocs: dict[str, Allocation] = {}
        self._held: dict[str, list[tuple[int, int]]] = {}  # job -> (leaf, GPU port bits)
        self._free_cnt = [self._gpl] * spec.leaves  # popcount of _free_mask, kept in step
        self._version = 0
        self._can_place_cache: dict[int, bool] = {}

    # --- queries ---------------------------------------------------------------

    def _free_mask(self, leaf: int) -> int:
        return self._full & ~(self._busy[leaf] | self._down[leaf])

    def free_gpu_count(self) -> int:
        """GPUs neither held by a job nor unavailable."""
        return sum(self._free_cnt)

    def free_gpus_on_leaf(self, leaf: int) -> tuple[int, ...]:
        """Free global GPU ids under ``leaf``."""
        base = leaf * self._gpl
        mask = self._free_mask(leaf)
        return tuple(base + p for p in range(self._gpl) if mask >> p & 1)

    def free_uplinks_on_leaf(self, leaf: int) -> tuple[int, ...]:
        """Unreserved uplink ports of ``leaf``."""
        mask = self._free_up[leaf]
        return tuple(u for u in range(self._gpl) if mask >> u & 1)

    def unavailable_gpus(self) -> tuple[int, ...]:
        """GPUs marked unavailable."""
        return tuple(
            leaf * self._gpl + p
            for leaf in range(self.spec.leaves)
            for p in range(self._gpl)
            if self._down[leaf] >> p & 1
        )

    def allocations(self) -> Mapping[str, Allocation]:
        """Current allocations by job id (a read-only view)."""
        return MappingProxyType(self._allocs)

    # --- availability ----------------------------------------------------------

    def set_unavailable(self, gpu_ids: Iterable[int]) -> None:
        """Mark GPUs down or draining: never allocated until :meth:`set_available`."""
        for gpu in self._checked_gpus(gpu_ids):
            self._down[gpu // self._gpl] |= 1 << (gpu % self._gpl)
        self._recount()

    def set_available(self, gpu_ids: Iterable[int]) -> None:
        """Undo :meth:`set_unavailable`."""
        for gpu in self._checked_gpus(gpu_ids):
            self._down[gpu // self._gpl] &= ~(1 << (gpu % self._gpl))
        self._recount()

    def _checked_gpus(self, gpu_ids: Iterable[int]) -> list[int]:
        gpus = list(gpu_ids)
        for g in gpus:
            self.spec.check_gpu(g)
        return gpus

    def _recount(self, leaves: Iterable[int] | None = None) -> None:
        for leaf in range(self.spec.leaves) if leaves is None else leaves:
            self._free_cnt[leaf] = self._free_mask(leaf).bit_count()
        self._touch()

    def _touch(self) -> None:
        self._version += 1
        self._can_place_cache.clear()

    # --- placement -------------------------------------------------------------

    def can_place(self, gpus: int) -> bool:
        """Whether :meth:`allocate` of ``gpus`` would succeed now (cached per state)."""
        hit = self._can_place_cache.get(gpus)
        if hit is None:
            hit = not isinstance(self._plan(gpus), PlacementError)
            self._can_place_cache[gpus] = hit
        return hit

    def try_allocate(self, job_id: str, gpus: int) -> Allocation | PlacementError:
        """Like :meth:`allocate` but returns the :class:`PlacementError` instead of raising."""
        self._check_job(job_id)
        plan = self._plan(gpus)
        if isinstance(plan, PlacementError):
            return plan
        alloc = self._build(job_id, *plan)
        self._commit(alloc)
        return alloc

    def allocate(self, job_id: str, gpus: int) -> Allocation:
        """Place a job of ``gpus`` GPUs and reserve what it gets.

        Raises :class:`PlacementError` (with a ``code``) when it cannot be placed now,
        :class:`ValueError` for a bad size or a job id that already holds an allocation.
        """
        result = self.try_allocate(job_id, gpus)
        if isinstance(result, PlacementError):
            raise result
        return result

    def release(self, job_id: str) -> Allocation:
        """Free everything ``job_id`` holds and return its allocation."""
        alloc = self._allocs.pop(job_id, None)
        if alloc is None:
            raise UnknownJobError(f"job {job_id!r} holds no allocation")
        self._recount(self._apply(alloc, take=False))
        return alloc

    def reserve(self, allocation: Allocation) -> None:
        """Add one persisted allocation to the current state (what :meth:`restore` accepts).

        Raises :class:`AllocationConflictError` (and changes nothing) when it does
        not fit this fabric or overlaps what is already held.  Cheaper than
        :meth:`restore` when only one job changes.
        """
        self._validate_restored(allocation)
        self._commit(allocation)

    def restore(self, allocations: Iterable[Allocation] | Mapping[str, Allocation]) -> None:
        """Replace the current allocations by persisted ones (availability marks stay).

        Accepted: what :meth:`allocate` returns; a subset of such a vClos (a job
        that lost GPUs keeps its cables); and, without uplinks, any set of GPUs
        (a plain reservation, e.g. GPUs held without a recorded shape).

        Raises :class:`AllocationConflictError` (and keeps the previous state) when
        the allocations do not fit this fabric or overlap.
        """
        allocs = list(allocations.values() if isinstance(allocations, Mapping) else allocations)
        saved = (
            self._busy,
            self._free_up,
            self._plane_use,
            self._plane_free,
            self._allocs,
            self._held,
        )
        self._reset()
        try:
            for a in allocs:
                self._validate_restored(a)
                self._commit(a)
        except AllocationConflictError:
            (
                self._busy,
                self._free_up,
                self._plane_use,
                self._plane_free,
                self._allocs,
                self._held,
            ) = saved
            self._recount()
            raise

    def _validate_restored(self, a: Allocation) -> None:
        spec, gpl = self.spec, self._gpl
        if a.job_id in self._allocs:
            raise AllocationConflictError(f"job {a.job_id!r} appears twice")
        if not a.gpus or len(set(a.gpus)) != len(a.gpus):
            raise AllocationConflictError(f"job {a.job_id!r}: empty or repeated GPUs")
        if any(not 0 <= g < spec.total_gpus for g in a.gpus):
            raise AllocationConflictError(f"job {a.job_id!r}: GPU outside the fabric")
        if len(set(a.leaves)) != len(a.leaves) or any(not 0 <= x < spec.leaves for x in a.leaves):
            raise AllocationConflictError(
                f"job {a.job_id!r}: repeated leaves or a leaf outside the fabric"
            )
        if a.uplinks:
            # A vClos, or a subset of one (a job that lost GPUs keeps its cables).
            per_leaf = Counter(g // gpl for g in a.gpus)
            if not set(per_leaf) <= set(a.leaves) or max(per_leaf.values()) > len(a.uplinks):
                raise AllocationConflictError(
                    f"job {a.job_id!r}: GPUs outside its leaves or more per leaf than its uplinks"
                )
            if len(set(a.uplinks)) != len(a.uplinks):
                raise AllocationConflictError(f"job {a.job_id!r}: repeated uplinks")
        if any(not 0 <= u < gpl for u in a.uplinks):
            raise AllocationConflictError(f"job {a.job_id!r}: uplink outside 0..{gpl - 1}")
        for g in a.gpus:
            if self._busy[g // gpl] >> (g % gpl) & 1:
                raise AllocationConflictError(f"job {a.job_id!r}: GPU {g} is already held")
        for leaf in a.leaves:
            for u in a.uplinks:
                if not self._free_up[leaf] >> u & 1:
                    raise AllocationConflictError(
                        f"job {a.job_id!r}: cable ({leaf}, {u}) is already held"
                    )

    def _check_job(self, job_id: str) -> None:
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("job id must be a non-empty string")
        if job_id in self._allocs:
            raise ValueError(f"job {job_id!r} already holds an allocation")

    def _apply(self, a: Allocation, take: bool) -> list[int]:
        """Mark ``a``'s GPUs and cables held (``take``) or free; return the leaves of its GPUs."""
        per_leaf = self._held.get(a.job_id)
        if per_leaf is None:
            gpl = self._gpl
            acc: dict[int, int] = {}
            for g in a.gpus:
                leaf = g // gpl
                acc[leaf] = acc.get(leaf, 0) | 1 << (g % gpl)
            per_leaf = list(acc.items())
        if take:
            self._held[a.job_id] = per_leaf
        else:
            self._held.pop(a.job_id, None)
        for leaf, bits in per_leaf:
            self._busy[leaf] = self._busy[leaf] | bits if take else self._busy[leaf] & ~bits
        if a.uplinks:
            pmask = 0
            for u in a.uplinks:
                pmask |= 1 << u
            lmask = 0
            for leaf in a.leaves:
                lmask |= 1 << leaf
                self._free_up[leaf] = (
                    self._free_up[leaf] & ~pmask if take else self._free_up[leaf] | pmask
                )
            delta = len(a.leaves) if take else -len(a.leaves)
            for u in a.uplinks:
                self._plane_use[u] += delta
                self._plane_free[u] = (
                    self._plane_free[u] & ~lmask if take else self._plane_free[u] | lmask
                )
        return [leaf for leaf, _ in per_leaf]

    def _commit(self, a: Allocation) -> None:
        touched = self._apply(a, take=True)
        self._allocs[a.job_id] = a
        self._recount(touched)

    # --- the policy ------------------------------------------------------------

    def _plan(self, z: int) -> tuple[list[int], int, list[int]] | PlacementError:
        """Decide ``(leaves, n, planes)`` for ``z`` GPUs, or say why not."""
        if isinstance(z, bool) or not isinstance(z, int) or z < 1:
            raise ValueError(f"a job needs a positive integer number of GPUs, got {z!r}")
        spec, gpl = self.spec, self._gpl
        shapes = clos_shapes(spec, z)
        if z > spec.total_gpus or (z > gpl and not shapes):
            return PlacementError(
                f"{z} GPUs cannot form any m x n shape on {spec.leaves} leaves of {gpl} GPUs",
                "too_large",
            )
        free = self._free_cnt
        total_free = sum(free)
        if z > total_free:
            return PlacementError(f"{z} GPUs requested, {total_free} free", "insufficient_gpus")
        if z <= gpl:
            best = min(
                (leaf for leaf in range(spec.leaves) if free[leaf] >= z),
                key=lambda leaf: (free[leaf], self._free_up[leaf].bit_count(), leaf),
                default=None,
            )
            if best is not None:
                return [best], z, []
        gpu_ok = False
        free_up = self._free_up
        # Best-fit preference, computed once: fullest leaves first, then busiest uplinks,
        # then leaf id; packed into one int per leaf because ints sort much faster.
        lb = spec.leaves.bit_length()
        ub = (gpl + 1).bit_length()
        fs = lb + ub
        ranked = [
            f << fs | up.bit_count() << lb | leaf
            for leaf, (f, up) in enumerate(zip(free, free_up, strict=True))
            if f
        ]
        ranked.sort()
        leaf_mask = (1 << lb) - 1
        up_mask = (1 << ub) - 1
        for m, n in shapes:
            first = bisect_left(ranked, n << fs)
            if len(ranked) - first < m:
                continue
            gpu_ok = True
            order = [k & leaf_mask for k in ranked[first:] if (k >> lb) & up_mask >= n]
            if len(order) < m:
                continue
            masks = {leaf: free_up[leaf] for leaf in order}
            found = self._find(masks, m, n, order)
            if found is None:
                continue
            planes_mask, _ = found
            planes = self._pick_planes(planes_mask, n)
            pmask = 0
            for u in planes:
                pmask |= 1 << u
            leaves = [leaf for leaf in order if masks[leaf] & pmask == pmask][:m]
            return sorted(leaves), n, planes
        if not gpu_ok:
            return PlacementError(
                f"{z} GPUs are free in total but no shape finds enough leaves with the GPUs "
                f"(tried {', '.join(f'{m}x{n}' for m, n in shapes) or 'one leaf'})",
                "fragmentation",
            )
        return PlacementError(
            f"no shape for {z} GPUs has n uplinks free on all of its m leaves "
            f"(tried {', '.join(f'{m}x{n}' for m, n in shapes)})",
            "no_links",
        )

    def _find(
        self, masks: dict[int, int], m: int, n: int, order: list[int]
    ) -> tuple[int, int] | None:
        """Search hook: the combinatorial search here; the oracle overrides it."""
        return find_biclique(masks, m, n, order, self._plane_free)

    def _pick_planes(self, mask: int, n: int) -> list[int]:
        """Best-fit: the ``n`` planes of ``mask`` already reserved on the most leaves."""
        if mask.bit_count() == n:  # no choice to make
            return [u for u in range(mask.bit_length()) if mask >> u & 1]
        use, ub = self._plane_use, self._gpl.bit_length()
        top = self.spec.leaves
        keys = []
        bits = mask
        while bits:
            low = bits & -bits
            u = low.bit_length() - 1
            keys.append((top - use[u]) << ub | u)  # most used first, then lowest index
            bits ^= low
        keys.sort()
        out = [k & ((1 << ub) - 1) for k in keys[:n]]
        out.sort()
        return out

    def _pick_ports(self, leaf: int, n: int) -> list[int]:
        """Choose ``n`` free ports of ``leaf``: whole free servers first, best-fit remainder."""
        gps = self.spec.gpus_per_server
        free = self._free_mask(leaf)
        if n == self._gpl and free == self._full:
            return list(range(n))
        server_mask = (1 << gps) - 1
        whole: list[int] = []
        partial: list[tuple[int, int, int]] = []  # (free count, server, free bits)
        for s in range(self.spec.servers_per_leaf):
            bits = free >> (s * gps) & server_mask
            if bits == server_mask:
                whole.append(s)
            elif bits:
                partial.append((bits.bit_count(), s, bits))

        def lowest(s: int, bits: int, k: int) -> list[int]:
            out: list[int] = []
            while bits and len(out) < k:
                low = bits & -bits
                out.append(s * gps + low.bit_length() - 1)
                bits ^= low
            return out

        q, rem = divmod(n, gps)
        chosen: list[int] = []
        if len(whole) >= q:
            for s in whole[:q]:
                chosen.extend(range(s * gps, s * gps + gps))
            if rem:
                fits = [p for p in partial if p[0] >= rem]
                if fits:  # best fit: the fullest partly used server that still fits
                    _, s, bits = min(fits)
                    chosen += lowest(s, bits, rem)
                elif len(whole) > q:
                    chosen.extend(range(whole[q] * gps, whole[q] * gps + rem))
                else:
                    for _, s, bits in sorted(partial, reverse=True):
                        chosen += lowest(s, bits, n - len(chosen))
                        if len(chosen) == n:
                            break
        else:
            for s in whole:
                chosen.extend(range(s * gps, s * gps + gps))
            for _, s, bits in sorted(partial, key=lambda p: (-p[0], p[1])):
                if len(chosen) == n:
                    break
                chosen += lowest(s, bits, n - len(chosen))
        chosen.sort()
        return chosen

    def _build(self, job_id: str, leaves: list[int], n: int, planes: list[int]) -> Allocation:
        gpl, nspines = self._gpl, self.spec.spines
        spine_of = [u % nspines for u in planes]
        gpus: list[int] = []
        routes: dict[int, Mapping[int, int]] = {}
        held: list[tuple[int, int]] = []
        for leaf in leaves:
            ports = self._pick_ports(leaf, n)
            if n == gpl:
                bits = self._full
            else:
                bits = 0
                for p in ports:
                    bits |= 1 << p
            held.append((leaf, bits))
            base = leaf * gpl
            gpus += [base + p for p in ports]
            if planes:
                routes[leaf] = MappingProxyType(dict(zip(ports, spine_of, strict=True)))
        self._held[job_id] = held  # _commit reuses the bitsets instead of recomputing them
        per_leaf_links = sorted(spine_of)
        return Allocation(
            job_id=job_id,
            gpus=tuple(gpus),
            leaves=tuple(leaves),
            spines=tuple(sorted(set(spine_of))),
            links=tuple([(leaf, s) for leaf in leaves for s in per_leaf_links]),
            routes=MappingProxyType(routes),
            uplinks=tuple(planes),
        )
