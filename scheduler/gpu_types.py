"""GPU types and node selectors in the pure pass: which GPUs a job may hold, and its pool.

A cluster may mix GPU generations (``Gpu.gpu_type``: ``"a100-40g"`` beside
``"h100-80g"``) and label its servers (``Cluster.server_labels``: ``pool=train``);
a job accepts some types (``JobView.gpu_types``, preferred first; empty: any) and
may ask for servers by label (``JobView.selector``).  The one rule everything
here serves: **a job's whole allocation is of one type**, its elastic extras
included, and once started it stays on that type.

So a typed pass is one pass per type, each over that type's GPUs only::

    snapshot ──split_by_type──┬─ pool "a100": its GPUs, the running jobs on them,
                              │               the queued jobs routed to it
                              │     └─ policy's pass ─┐ (candidates, policy, preemption,
                              ├─ pool "h100": ...     │  scale-out and reclaim: all see
                              │     └─ policy's pass ─┤  only the pool's GPUs and jobs)
                              └─ waits: jobs no server could ever hold
                                                      ▼
                                        decisions, pool after pool (type name order)

A queued job is routed like a Kueue flavor assignment: to the first type of its
list (every type present, by name, when it has none) whose free GPUs on servers
its selector matches still cover its minimum after the jobs routed before it
(in the policy's view order); when none does, to the first type that could ever
hold it (it waits there).  Tenants' fair share spans the pools (each pool's
pass reads the whole snapshot's ``tenants``).

A selector narrows placement inside the pool (:class:`SelectorPlacement`): the
policy counts GPUs of the type, and a start whose GPUs are not free on matching
servers is left for the next pass, as any start that does not fit real GPUs.

One type and no job asking for a type or a label (today's clusters):
:func:`split_by_type` returns None and the pass is today's, byte for byte.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, eq, is_, is_not, itemgetter, not_
from types import MappingProxyType

from scheduler.quota import quota_need
from scheduler.types import Cluster, Gpu, GpuState, JobView, Snapshot

DEFAULT_TYPE = ""
"""The type of every GPU of a cluster that names none: today's uniform clusters."""

TYPE_SLUG = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
"""A GPU type's slug (servers, requests, quotas): lower-case letters, digits, '.', '_', '-',
at most 32 characters; here, below every package that checks one."""

Labels = tuple[tuple[str, str], ...]
"""Sorted ``(label, value)`` pairs: a server's labels, or a job's node selector."""

NO_ALLOWED: Mapping[str, frozenset[int]] = MappingProxyType({})
"""The selecting jobs of a pool where none selects (shared)."""


@dataclass(frozen=True, slots=True)
class GpuType:
    """What the scheduler knows of a GPU type: its name, its speed and its fair-share weight.

    ``speed`` multiplies the per-GPU compute rate of every model (a reference
    A100 is 1.0; an H100 about 2.0): communication is unchanged, so a faster type
    reaches its network limit at fewer GPUs (:func:`scheduler.throughput.typed_model`).
    ``weight`` is what one of its GPU-hours counts in fair share and usage (an
    admin's choice: an H100 hour may count 2 A100 hours).
    """

    name: str
    speed: float = 1.0
    weight: float = 1.0

    def __post_init__(self) -> None:
        for field_name in ("speed", "weight"):
            value = getattr(self, field_name)
            if not 0 < value < float("inf"):
                raise ValueError(
                    f"gpu type {self.name!r}: {field_name} must be a finite number > 0, "
                    f"not {value!r}"
                )


def parse_selector(text: str) -> Labels:
    """``"pool=train,rack=r12"`` -> sorted label pairs; ValueError naming the field on bad input."""
    pairs: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        label, sep, value = part.partition("=")
        if not sep or not label.strip() or not value.strip():
            raise ValueError(f"selector: {part!r} must be label=value (e.g. pool=train)")
        pairs[label.strip()] = value.strip()
    return tuple(sorted(pairs.items()))


def parse_type_numbers(text: str, what: str) -> dict[str, float]:
    """``"a100:48,h100:16"`` (``:`` or ``=``) -> number per GPU type; ValueError (one line,
    naming ``what`` and the item as written) on bad input."""
    numbers: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.replace("=", ":").partition(":")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not name.strip() or not number >= 0:
            raise ValueError(f"bad {what} {part!r} (use e.g. a100:48,h100:16)")
        numbers[name.strip()] = number
    if not numbers:
        raise ValueError(f"no {what} given (use e.g. a100:48,h100:16)")
    return numbers


def selector_matches(labels: Labels, selector: Labels) -> bool:
    """Whether a server with ``labels`` carries every ``(label, value)`` of ``selector``."""
    return not selector or set(selector) <= set(labels)


def cluster_types(cluster: Cluster) -> tuple[str, ...]:
    """The GPU types of the cluster's GPUs, by name (``("",)`` for today's clusters)."""
    return tuple(sorted({g.gpu_type for g in cluster.gpus}))


def eligible_gpus(
    cluster: Cluster, gpu_types: Sequence[str], selector: Labels
) -> dict[str, list[int]]:
    """Per acceptable type present (in the job's order; every type by name when it names
    none), the ids of its GPUs in service on servers the selector matches."""
    order = list(gpu_types) or list(cluster_types(cluster))
    found: dict[str, list[int]] = {name: [] for name in order}
    labels = cluster.server_labels
    for gpu in cluster.gpus:
        ids = found.get(gpu.gpu_type)
        if ids is None or gpu.state is GpuState.DOWN:
            continue
        if selector and not selector_matches(labels.get(gpu.server, ()), selector):
            continue
        ids.append(gpu.id)
    return {name: ids for name, ids in found.items() if ids}


def never_satisfiable(
    cluster: Cluster, gpu_types: Sequence[str], selector: Labels, min_gpus: int
) -> str | None:
    """Why no server of ``cluster`` could ever hold a job of at least ``min_gpus`` GPUs of
    one of ``gpu_types`` on servers ``selector`` matches; None when some could.

    For the live side to refuse such a job at submit (with this reason) and for the
    pass to leave it waiting with it; every GPU in service counts, busy or free.
    """
    sizes = {name: len(ids) for name, ids in eligible_gpus(cluster, gpu_types, selector).items()}
    return _unsatisfiable(sizes, gpu_types, selector, min_gpus)


def _unsatisfiable(
    sizes: Mapping[str, int], gpu_types: Sequence[str], selector: Labels, min_gpus: int
) -> str | None:
    """:func:`never_satisfiable` from the request's GPU count per type it can reach."""
    if any(size >= min_gpus for size in sizes.values()):
        return None
    wanted = ", ".join(gpu_types) if gpu_types else "any type"
    where = " on servers with " + ",".join(f"{k}={v}" for k, v in selector) if selector else ""
    if not sizes:
        return f"no server has GPUs of {wanted}{where}"
    most = max(sizes.values())
    return f"needs {min_gpus} GPUs of one type ({wanted}){where}; the most there are is {most}"


def is_typed(snapshot: Snapshot) -> bool:
    """Whether the pass must split by type: several types, or a job asks for a type or labels."""
    # Every tick asks (10,000 jobs, thousands of GPUs): map over attrgetters, no frame a row.
    jobs = snapshot.jobs
    if any(map(_TYPES, jobs)) or any(map(_SELECTOR, jobs)):
        return True
    return len(set(map(_GPU_TYPE, snapshot.cluster.gpus))) > 1


_TYPES = attrgetter("gpu_types")
_SELECTOR = attrgetter("selector")
_GPU_TYPE = attrgetter("gpu_type")


@dataclass(frozen=True, slots=True)
class Pool:
    """One type's share of a snapshot: its GPUs and jobs, and each selecting job's GPUs."""

    gpu_type: str
    snapshot: Snapshot
    allowed: Mapping[str, frozenset[int]]


@dataclass(frozen=True, slots=True)
class TypeSplit:
    """A snapshot split by type: the pools, and why each job left out of all of them waits."""

    pools: tuple[Pool, ...]
    waits: Mapping[str, str]


def job_type(view: JobView, gpus: Mapping[int, Gpu]) -> str:
    """The type a running job holds (that of its first GPU; it never holds two); a GPU
    the cluster no longer lists counts as the default type."""
    gpu = gpus.get(view.gpus[0])
    return gpu.gpu_type if gpu is not None else DEFAULT_TYPE


def split_by_type(snapshot: Snapshot) -> TypeSplit | None:
    """The snapshot split into one pool per type (see the module); None when not typed.

    The last snapshot's split is remembered (by identity: a snapshot and what it holds
    never change): the tick's hold-back, its policy and its binding each ask for the
    split of one snapshot, and at 16,384 GPUs a split is milliseconds of Python.
    """
    last = _last_split
    if last is not None and last[0] is snapshot:
        return last[1]
    split = _split(snapshot)
    _remember_split((snapshot, split))
    return split


_last_split: tuple[Snapshot, TypeSplit | None] | None = None


def _remember_split(entry: tuple[Snapshot, TypeSplit | None]) -> None:
    """Keep ``entry`` as the last split (one assignment: safe beside another thread's pass)."""
    global _last_split
    _last_split = entry


def _split(snapshot: Snapshot) -> TypeSplit | None:
    """:func:`split_by_type`, worked out.

    The jobs and GPUs are gone through in C (``map``, ``compress``) wherever every one
    is looked at (10,000 jobs, 16,384 GPUs a tick); Python loops only over the queued
    jobs and the selecting ones.
    """
    if not is_typed(snapshot):
        return None
    cluster, jobs = snapshot.cluster, snapshot.jobs
    reach = _Reach(cluster)
    members: dict[str, list[JobView]] = {name: [] for name in reach.names}
    held = list(map(_GPUS, jobs))
    running = list(compress(jobs, held))
    # The type each running job holds (that of its first GPU, :func:`job_type`).
    firsts = map(itemgetter(0), compress(held, held))
    holds = list(map(reach.type_of.get, firsts, repeat(DEFAULT_TYPE)))
    if len(reach.names) == 1 and DEFAULT_TYPE not in holds:
        members[reach.names[0]] = list(running)  # every running job holds the one type
    else:
        for view, name in zip(running, holds, strict=True):
            group = members.get(name)
            if group is None:  # a GPU the cluster no longer lists: the default type
                group = members[name] = []
            group.append(view)
    allowed: dict[str, dict[str, frozenset[int]]] = {name: {} for name in members}
    for at in compress(range(len(running)), map(_SELECTOR, running)):  # the selecting ones
        view, name = running[at], holds[at]
        allowed[name][view.id] = reach.ids((name,), view.selector).get(name, frozenset())
    queued = sorted(compress(jobs, map(not_, held)), key=_queue_key)
    waits: dict[str, str] = {}
    free_left = dict.fromkeys(members, 0)
    free_left.update(reach.free_by_type)
    for view in queued:
        need = quota_need(view.min_gpus, view.requested_gpus)
        eligible = reach.ids(view.gpu_types, view.selector)
        sizes = reach.sizes(view.gpu_types, view.selector)
        reason = _unsatisfiable(sizes, view.gpu_types, view.selector, need)
        if reason is not None:
            waits[view.id] = reason
            continue
        fits = [n for n, size in sizes.items() if size >= need]
        free = reach.free(view.gpu_types, view.selector)
        name = next((n for n in fits if free[n] >= need and free_left[n] >= need), fits[0])
        free_left[name] -= need
        members[name].append(view)
        if view.selector:
            allowed[name][view.id] = eligible[name]
    pools = tuple(
        Pool(
            name,
            _pool_snapshot(snapshot, name, reach.gpus_of(name), members[name]),
            allowed[name] or NO_ALLOWED,
        )
        for name in members
    )
    return TypeSplit(pools, waits)


_GPU_ID = attrgetter("id")
_GPU_STATE = attrgetter("state")
_GPUS = attrgetter("gpus")
_THROUGHPUT_BY_TYPE = attrgetter("throughput_by_type")


@dataclass(frozen=True, slots=True)
class _Layout:
    """Which GPU is of which type: what a split reads of a cluster besides the GPUs' states.

    The same from tick to tick while no server changes (kept: :func:`_layout`)."""

    ids: list[int]
    types: list[str]
    type_of: dict[int, str]
    names: tuple[str, ...]
    masks: dict[str, list[bool]]  # per type, which positions hold one (several types only)
    in_service: dict[str, tuple[frozenset[int], frozenset[int]]]
    """Per type, the GPUs down when it was worked out and its GPUs in service then."""


def _layout(gpus: tuple[Gpu, ...]) -> _Layout:
    """The layout of ``gpus``: the last one when the GPUs' ids and types are the same."""
    ids, types = list(map(_GPU_ID, gpus)), list(map(_GPU_TYPE, gpus))
    last = _last_layout
    if last is not None and last.ids == ids and last.types == types:
        return last
    names = tuple(sorted(set(types)))
    masks = {n: list(map(eq, types, repeat(n))) for n in names} if len(names) > 1 else {}
    layout = _Layout(ids, types, dict(zip(ids, types, strict=True)), names, masks, {})
    _remember_layout(layout)
    return layout


_last_layout: _Layout | None = None


def _remember_layout(layout: _Layout) -> None:
    """Keep ``layout`` as the last one (one assignment: safe beside another thread's pass)."""
    global _last_layout
    _last_layout = layout


@dataclass(frozen=True, slots=True)
class _GpuSide:
    """What a split reads of a cluster's GPUs: their layout, each type's GPUs (in the
    cluster's order), the free ones and their count per type, the ids of those down.

    Brought from one tick's GPU views to the next by the positions whose view is
    another object (:meth:`moved_to`; the tick keeps an unchanged GPU's view), so that a
    split does not go through 16,384 GPUs a dozen times a tick, even in C.
    """

    gpus: tuple[Gpu, ...]
    layout: _Layout
    at: list[int]  # each position's index in its type's tuple
    by_type: dict[str, tuple[Gpu, ...]]
    free_ids: frozenset[int]
    free_by_type: dict[str, int]
    down: frozenset[int]

    @staticmethod
    def build(gpus: tuple[Gpu, ...]) -> _GpuSide:
        """Everything worked out from ``gpus``."""
        layout = _layout(gpus)
        states = list(map(_GPU_STATE, gpus))
        free = list(map(is_, states, repeat(GpuState.FREE)))
        seen: dict[str, int] = {}
        at = []
        for name in layout.types:
            at.append(seen.get(name, 0))
            seen[name] = at[-1] + 1
        return _GpuSide(
            gpus,
            layout,
            at,
            {n: tuple(compress(gpus, mask)) for n, mask in layout.masks.items()}
            if layout.masks
            else dict.fromkeys(layout.names, gpus),
            frozenset(compress(layout.ids, free)),
            dict(Counter(compress(layout.types, free))),
            frozenset(compress(layout.ids, map(is_, states, repeat(GpuState.DOWN)))),
        )

    def moved_to(self, gpus: tuple[Gpu, ...]) -> _GpuSide | None:
        """This side brought to ``gpus`` (as many, most the same objects); None when a GPU's
        id or type changed at a position (the layout did: build again)."""
        last = self.gpus
        changed = list(compress(range(len(gpus)), map(is_not, last, gpus)))
        if not changed:
            return self
        patched: dict[str, list[Gpu]] = {}
        free, down = set(self.free_ids), set(self.down)
        free_by_type = dict(self.free_by_type)
        one_type = not self.layout.masks
        for position in changed:
            old, new = last[position], gpus[position]
            if old.id != new.id or old.gpu_type != new.gpu_type:
                return None
            name = new.gpu_type
            if not one_type:
                views = patched.get(name)
                if views is None:
                    views = patched[name] = list(self.by_type[name])
                views[self.at[position]] = new
            if old.state is new.state:
                continue
            if old.state is GpuState.FREE:
                free.discard(old.id)
                free_by_type[name] -= 1
            elif old.state is GpuState.DOWN:
                down.discard(old.id)
            if new.state is GpuState.FREE:
                free.add(new.id)
                free_by_type[name] = free_by_type.get(name, 0) + 1
            elif new.state is GpuState.DOWN:
                down.add(new.id)
        by_type = (
            dict.fromkeys(self.layout.names, gpus)
            if one_type
            else {**self.by_type, **{name: tuple(views) for name, views in patched.items()}}
        )
        free_by_type = {name: count for name, count in free_by_type.items() if count}
        return _GpuSide(
            gpus, self.layout, self.at, by_type, frozenset(free), free_by_type, frozenset(down)
        )


_sides = threading.local()
"""Each thread's last :class:`_GpuSide` (the tick's, the forecast's: never shared)."""


def _gpu_side(gpus: tuple[Gpu, ...]) -> _GpuSide:
    """The GPU side of ``gpus``: this thread's last one brought to them, or built."""
    last: _GpuSide | None = getattr(_sides, "last", None)
    side = last.moved_to(gpus) if last is not None and len(last.gpus) == len(gpus) else None
    if side is None:
        side = _GpuSide.build(gpus)
    _sides.last = side
    return side


class _Reach:
    """What each distinct request (accepted types, selector) reaches on one cluster,
    worked out once per pass: thousands of jobs share a handful of requests.

    The cluster's GPUs are gone through type by type in C (``map``, ``compress``): a
    split at 16,384 GPUs must not walk them in Python once per type and request.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        side = _gpu_side(cluster.gpus)
        self.layout = layout = side.layout
        self.type_of = layout.type_of
        self.names = layout.names  # :func:`cluster_types`
        self.down = side.down
        self.free_ids = side.free_ids
        self.free_by_type = side.free_by_type
        self._by_type = side.by_type
        self._ids: dict[tuple[tuple[str, ...], Labels], dict[str, frozenset[int]]] = {}
        self._sizes: dict[tuple[tuple[str, ...], Labels], dict[str, int]] = {}
        self._free: dict[tuple[tuple[str, ...], Labels], dict[str, int]] = {}

    def gpus_of(self, name: str) -> tuple[Gpu, ...]:
        """The cluster's GPUs of type ``name``, in the cluster's order."""
        return self._by_type.get(name, ())

    def _eligible(self, name: str, selector: Labels) -> frozenset[int]:
        """The GPUs of type ``name`` in service on servers ``selector`` matches
        (:func:`eligible_gpus`, one type)."""
        if not selector:
            # The same while no GPU goes down or comes back: kept with the layout.
            down, found = self.layout.in_service.get(name, (None, frozenset()))
            if down != self.down:
                pool = self.gpus_of(name)
                up = map(is_not, map(_GPU_STATE, pool), repeat(GpuState.DOWN))
                found = frozenset(compress(map(_GPU_ID, pool), up))
                self.layout.in_service[name] = (self.down, found)
            return found
        labels = self.cluster.server_labels
        return frozenset(
            gpu.id
            for gpu in self.gpus_of(name)
            if gpu.state is not GpuState.DOWN
            and selector_matches(labels.get(gpu.server, ()), selector)
        )

    def ids(self, gpu_types: Sequence[str], selector: Labels) -> dict[str, frozenset[int]]:
        """Per type reached (the request's order), its GPUs in service the request may hold."""
        key = (tuple(gpu_types), selector)
        found = self._ids.get(key)
        if found is None:
            order = dict.fromkeys(gpu_types or self.names)
            eligible = {name: self._eligible(name, selector) for name in order}
            found = self._ids[key] = {name: ids for name, ids in eligible.items() if ids}
            self._sizes[key] = {name: len(ids) for name, ids in found.items()}
            self._free[key] = {name: len(ids & self.free_ids) for name, ids in found.items()}
        return found

    def sizes(self, gpu_types: Sequence[str], selector: Labels) -> dict[str, int]:
        """Per type reached, how many GPUs in service the request may hold."""
        self.ids(gpu_types, selector)
        return self._sizes[(tuple(gpu_types), selector)]

    def free(self, gpu_types: Sequence[str], selector: Labels) -> dict[str, int]:
        """Per type reached, how many of those GPUs are free now."""
        self.ids(gpu_types, selector)
        return self._free[(tuple(gpu_types), selector)]


def _queue_key(view: JobView) -> tuple[float, float, str]:
    since = view.queue_since if view.queue_since is not None else view.submit_time
    return (since, view.submit_time, view.id)


def _pool_snapshot(
    snapshot: Snapshot, name: str, gpus: tuple[Gpu, ...], jobs: list[JobView]
) -> Snapshot:
    """The snapshot restricted to one type's GPUs (``gpus``) and the jobs in its pool, each
    job with its curve on this type where it has one (``JobView.throughput_by_type``)."""
    cluster = dataclasses.replace(snapshot.cluster, gpus=gpus)
    if any(map(_THROUGHPUT_BY_TYPE, jobs)):
        views = tuple(_on_type(view, name) for view in jobs)
    else:  # no job has a curve of its own per type (the tick's): the views themselves
        views = tuple(jobs)
    return dataclasses.replace(snapshot, cluster=cluster, jobs=views)


def _on_type(view: JobView, name: str) -> JobView:
    """``view`` with its throughput curve on GPU type ``name`` (itself when it has none)."""
    curves = view.throughput_by_type
    if not curves or name not in curves or curves[name] is view.throughput:
        return view
    return dataclasses.replace(view, throughput=curves[name])


def weighted_gpu_seconds(by_type: Mapping[str, float], types: Mapping[str, GpuType]) -> float:
    """A tenant's GPU-seconds summed over types, each times its type's weight (unknown
    types weigh 1.0): its fair-share usage and its usage report's figure."""
    return sum(
        seconds * (types[name].weight if name in types else 1.0)
        for name, seconds in by_type.items()
    )
