"""What a job asks of the cluster's GPUs and servers (issue 38), checked at submit.

A job may name the GPU types it accepts (``gpu_types``, preferred first; empty:
any), a node selector on server labels (``node_selector``: label -> value,
checked like a server's labels), and CPU cores and host memory per GPU
(``cpus_per_gpu``, ``mem_per_gpu_mib``; 0: the tenant's default, or none)::

    request ──check_request──> ResourceRequest ──unsatisfiable──> None, or
                                                  (field, reason): a 400 on that field

A request no server of the cluster could ever satisfy is refused here, not
queued forever: no server of an accepted type that the selector matches has
GPUs enough for the job's minimum (``scheduler.gpu_types.never_satisfiable``, on
the inventory's servers, busy or not, up or not), or none of them has the CPU
cores and host memory per GPU it asks for (a server's cores and memory divided
by its GPUs).  CPU and memory bound what a job may ask per GPU at submit; the
placement then packs by them (``scheduler.packing``): a job's GPUs land only on
servers whose cores and memory still hold its request beside the other jobs'
there, so a job asking more than a small server's share per GPU goes to the
servers that offer it, and waits, naming CPU cores or host memory, while none
has room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabric.topology import FabricSpec
from inventory.models import Server
from inventory.server_types import (
    MAX_CPU_CORES,
    MAX_GPU_MEMORY_MIB,
    ServerTypeError,
    check_labels,
    check_type_slug,
)
from scheduler.gpu_types import Labels, never_satisfiable, selector_matches
from scheduler.types import Cluster, Gpu

MAX_GPU_TYPES = 8
REQUEST_FIELDS = ("gpu_types", "node_selector", "cpus_per_gpu", "mem_per_gpu_mib")
"""A submission's keys that say what kind of GPUs and servers the job needs."""

AddError = Callable[[str, str], None]


@dataclass(frozen=True)
class ResourceRequest:
    """A checked request: accepted types, selector, CPU cores and MiB per GPU (0: none)."""

    gpu_types: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    cpus_per_gpu: int = 0
    mem_per_gpu_mib: int = 0

    @property
    def selector(self) -> Labels:
        """The selector as the scheduler matches it: sorted ``(label, value)`` pairs."""
        return tuple(sorted(self.node_selector.items()))

    def asks(self) -> bool:
        """Whether it asks anything beyond a number of GPUs."""
        return bool(
            self.gpu_types or self.node_selector or self.cpus_per_gpu or self.mem_per_gpu_mib
        )

    def as_fields(self) -> dict[str, Any]:
        """The ``Job`` fields it sets."""
        return {
            "gpu_types": list(self.gpu_types),
            "node_selector": dict(self.node_selector),
            "cpus_per_gpu": self.cpus_per_gpu,
            "mem_per_gpu_mib": self.mem_per_gpu_mib,
        }


def _gpu_types(raw: Any, add_error: AddError) -> tuple[str, ...]:
    """A list of type slugs (or ``"a,b"``), without repeats; [] / None / "": any type."""
    if raw is None or raw == "":
        return ()
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or len(items) > MAX_GPU_TYPES:
        add_error("gpu_types", f"Must be a list of at most {MAX_GPU_TYPES} GPU type slugs.")
        return ()
    try:
        names = [check_type_slug(item.strip() if isinstance(item, str) else item) for item in items]
    except ServerTypeError as error:
        add_error("gpu_types", str(error).split(": ", 1)[1])
        return ()
    return tuple(dict.fromkeys(names))


def _selector(raw: Any, add_error: AddError) -> dict[str, str]:
    """Labels a server must carry, checked as a server's labels are."""
    if raw is None or raw == "":
        return {}
    try:
        return check_labels(raw, "node_selector")
    except ServerTypeError as error:
        add_error("node_selector", str(error))
        return {}


def _per_gpu(raw: Any, key: str, default: int, most: int, add_error: AddError) -> int:
    """A whole number from 0 to ``most``; ``default`` when left out."""
    if raw is None or raw == "":
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= most:
        add_error(key, f"Must be a whole number from 0 to {most}.")
        return 0
    return raw


def check_request(
    data: Mapping[str, Any], *, default_cpus: int, default_mem_mib: int, add_error: AddError
) -> ResourceRequest:
    """The submission's request, its CPU and memory per GPU defaulting to the tenant's."""
    return ResourceRequest(
        gpu_types=_gpu_types(data.get("gpu_types"), add_error),
        node_selector=_selector(data.get("node_selector"), add_error),
        cpus_per_gpu=_per_gpu(
            data.get("cpus_per_gpu"), "cpus_per_gpu", default_cpus, MAX_CPU_CORES, add_error
        ),
        mem_per_gpu_mib=_per_gpu(
            data.get("mem_per_gpu_mib"),
            "mem_per_gpu_mib",
            default_mem_mib,
            MAX_GPU_MEMORY_MIB,
            add_error,
        ),
    )


@dataclass(frozen=True)
class ServerOffer:
    """What one server of the inventory offers a job: its GPUs' type, labels, and CPU
    cores and host memory per GPU (0: not known, which bounds nothing)."""

    gpu_type: str
    labels: Labels
    cpus_per_gpu: int
    mem_per_gpu_mib: int

    def fits(self, request: ResourceRequest) -> bool:
        """Whether its CPU cores and memory per GPU cover the request's (unknown: they do)."""
        cpus_ok = not self.cpus_per_gpu or self.cpus_per_gpu >= request.cpus_per_gpu
        mem_ok = not self.mem_per_gpu_mib or self.mem_per_gpu_mib >= request.mem_per_gpu_mib
        return cpus_ok and mem_ok


def read_offers(spec: FabricSpec) -> list[ServerOffer]:
    """Every server of the inventory, as :class:`ServerOffer` (GPUs: the fabric's per server)."""
    per = spec.gpus_per_server or 1
    return [
        ServerOffer(
            gpu_type,
            tuple(sorted(labels.items())) if isinstance(labels, dict) else (),
            cores // per,
            memory // per,
        )
        for gpu_type, labels, cores, memory in Server.objects.order_by("leaf", "slot").values_list(
            "gpu_type", "labels", "cpu_cores", "memory_mib"
        )
    ]


def offers_cluster(offers: Sequence[ServerOffer], gpus_per_server: int) -> Cluster:
    """A cluster of ``offers``' GPUs (all in service), for ``never_satisfiable``."""
    gpus = tuple(
        Gpu(id=s * gpus_per_server + k, server=s, leaf=0, gpu_type=offer.gpu_type)
        for s, offer in enumerate(offers)
        for k in range(gpus_per_server)
    )
    labels = {s: offer.labels for s, offer in enumerate(offers) if offer.labels}
    return Cluster(gpus=gpus, server_labels=labels)


def unsatisfiable(
    offers: Sequence[ServerOffer], gpus_per_server: int, request: ResourceRequest, min_gpus: int
) -> tuple[str, str] | None:
    """Why no server of ``offers`` could ever hold a job of ``request`` and at least
    ``min_gpus`` GPUs, with the field at fault; None when some could.  Pure."""
    cluster = offers_cluster(offers, gpus_per_server)
    types, selector = request.gpu_types, request.selector
    reason = never_satisfiable(cluster, types, selector, min_gpus)
    if reason is not None:
        if selector and never_satisfiable(cluster, types, (), min_gpus) is None:
            return "node_selector", reason
        return ("gpu_types" if types else "min_gpus"), reason
    if not request.cpus_per_gpu and not request.mem_per_gpu_mib:
        return None
    fitting = [offer for offer in offers if offer.fits(request)]
    if never_satisfiable(offers_cluster(fitting, gpus_per_server), types, selector, min_gpus):
        cpu_only = ResourceRequest(types, request.node_selector, request.cpus_per_gpu, 0)
        cpu_fits = [offer for offer in offers if offer.fits(cpu_only)]
        cpu_short = never_satisfiable(
            offers_cluster(cpu_fits, gpus_per_server), types, selector, min_gpus
        )
        field_name = "cpus_per_gpu" if cpu_short else "mem_per_gpu_mib"
        return field_name, _short_reason(offers, request, min_gpus)
    return None


def _short_reason(offers: Sequence[ServerOffer], request: ResourceRequest, min_gpus: int) -> str:
    """The refusal of a request no server has the CPU cores or memory per GPU for."""
    wanted = ", ".join(request.gpu_types) or "any type"
    reached = [
        o
        for o in offers
        if (not request.gpu_types or o.gpu_type in request.gpu_types)
        and selector_matches(o.labels, request.selector)
    ]
    most_cpus = max((o.cpus_per_gpu for o in reached), default=0)
    most_mem = max((o.mem_per_gpu_mib for o in reached), default=0)
    return (
        f"needs {min_gpus} GPUs of one type ({wanted}) with {request.cpus_per_gpu} CPU cores "
        f"and {request.mem_per_gpu_mib} MiB of host memory per GPU; no server offers that "
        f"(the most per GPU: {most_cpus} cores, {most_mem} MiB)"
    )


def check_satisfiable(
    spec: FabricSpec | None, request: ResourceRequest, min_gpus: int, add_error: AddError
) -> None:
    """Refuse (through ``add_error``) a request no server of the cluster could ever hold.

    Asked when the request names a type, a selector, CPU or memory, or the cluster
    mixes types; not before a topology and its servers are loaded.
    """
    if spec is None:
        return
    offers = read_offers(spec)
    if not offers or not (request.asks() or len({o.gpu_type for o in offers}) > 1):
        return
    problem = unsatisfiable(offers, spec.gpus_per_server, request, min_gpus)
    if problem is not None:
        add_error(*problem)
