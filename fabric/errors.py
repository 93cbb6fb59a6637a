"""Exceptions raised by the fabric core.

All of them carry a message meant to be shown to a person on one line.
"""

from __future__ import annotations

from typing import Literal

PlacementCode = Literal["insufficient_gpus", "no_links", "fragmentation", "too_large"]


class FabricError(Exception):
    """Base class of every error the fabric package raises on purpose."""


class TopologyError(FabricError, ValueError):
    """A fabric description (dataclass, dict, JSON or YAML file) is invalid."""


class PlacementError(FabricError):
    """A job cannot be placed now; ``code`` says why, ``reason`` says it in words.

    Codes:

    * ``too_large``: no ``m x n`` shape exists for this size on this fabric, even empty.
    * ``insufficient_gpus``: fewer GPUs are free than the job asks for.
    * ``fragmentation``: enough GPUs are free, but no shape finds ``m`` leaves with
      ``n`` free GPUs each.
    * ``no_links``: some shape has the GPUs, but no ``n`` uplinks are free on all
      ``m`` leaves of any such choice.
    """

    def __init__(self, reason: str, code: PlacementCode) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code: PlacementCode = code

    def __repr__(self) -> str:
        return f"PlacementError({self.reason!r}, code={self.code!r})"


class AllocationConflictError(FabricError, ValueError):
    """Persisted allocations cannot be restored: they overlap or do not fit the fabric."""


class UnknownJobError(FabricError, LookupError):
    """The job has no allocation."""
