"""Pure-Python leaf-spine fabric core: topology, routing, traffic, vClos allocation.

Never imports Django, Celery, Channels or torch. Modules:

* :mod:`fabric.topology`: :class:`FabricSpec`, numbering, ``load_spec``, ``to_networkx``;
* :mod:`fabric.allocator`: :class:`VClosAllocator` and :class:`Allocation`;
* :mod:`fabric.traffic`: collective patterns as steps of flows;
* :mod:`fabric.routing`: source routing (vClos) and ECMP (mmh3 over the 5-tuple);
* :mod:`fabric.contention`: link loads, max-min slowdown, ``ecmp_slowdown``;
* :mod:`fabric.collisions`: the ECMP collision measurement;
* :mod:`fabric.oracle`: CP-SAT formulation (tests and benchmark only);
* :mod:`fabric.cli`: ``python -m fabric``.
"""

from fabric.allocator import Allocation, VClosAllocator
from fabric.errors import PlacementError, TopologyError
from fabric.topology import FabricSpec, OcsSpec, load_spec

__all__ = [
    "Allocation",
    "FabricSpec",
    "OcsSpec",
    "PlacementError",
    "TopologyError",
    "VClosAllocator",
    "load_spec",
]
