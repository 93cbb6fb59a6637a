"""Tenant fair share: decayed GPU usage over weight, as Slurm's fair-share and Kueue's admission fair sharing.

Each tenant has a weight and a usage: GPU-seconds held, decayed with a
half-life ``H``.  Between two times ``dt`` apart, with ``g`` GPUs held the
whole time, the usage integrates exactly::

    U <- U * 2^(-dt/H) + g * H/ln 2 * (1 - 2^(-dt/H))

A tenant's *key* is its share of all usage over its share of all weight: below
1 it has used less than its weight entitles it to, above 1 more.  Policies
serve pending jobs of the lowest key first (inside a queue), reclaim elastic
extras first from the highest key, and give idle GPUs first to the lowest.  A
tenant of weight 0 comes last.  A tenant nobody gave a weight to counts with
weight 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from scheduler.named_numbers import named_numbers

#: Usage halves every week unless renewed (Slurm's PriorityDecayHalfLife default).
FAIR_SHARE_HALF_LIFE = 604_800.0

#: The weight of a tenant missing from the weights.
DEFAULT_WEIGHT = 1.0


class FairShare:
    """Weights and decayed usage per tenant; ``key(tenant)`` orders tenants (lower: served first)."""

    def __init__(
        self,
        weights: Mapping[str, float],
        usage: Mapping[str, float] | None = None,
        *,
        half_life_s: float = FAIR_SHARE_HALF_LIFE,
        now: float = 0.0,
    ) -> None:
        if half_life_s <= 0:
            raise ValueError("the fair-share half-life must be positive")
        for name, weight in weights.items():
            if not weight >= 0 or math.isinf(weight):
                raise ValueError(f"tenant {name!r}: weight must be a finite number >= 0")
        for name, used in (usage or {}).items():
            if not used >= 0 or math.isinf(used):
                raise ValueError(f"tenant {name!r}: usage must be a finite number >= 0")
        self.weights = dict(weights)
        self.usage: dict[str, float] = dict(usage or {})
        self.half_life_s = float(half_life_s)
        self.now = now
        self._keys: dict[str, float] | None = None

    def advance(self, now: float, held_gpus_by_tenant: Mapping[str, int]) -> None:
        """Decay every usage to ``now`` and add the GPUs each tenant held since the last call."""
        dt = now - self.now
        if dt <= 0:
            return
        h = self.half_life_s
        decay = 2.0 ** (-dt / h)
        gain = h / math.log(2) * (1.0 - decay)
        usage = self.usage
        for name in usage:
            usage[name] *= decay
        for name, gpus in held_gpus_by_tenant.items():
            if gpus:
                usage[name] = usage.get(name, 0.0) + gpus * gain
        self.now = now
        self._keys = None

    def weight(self, tenant: str) -> float:
        """A tenant's weight (``DEFAULT_WEIGHT`` when it has none)."""
        return self.weights.get(tenant, DEFAULT_WEIGHT)

    def key(self, tenant: str) -> float:
        """Usage share / weight share: below 1 under its share, above 1 over; weight 0: infinity."""
        keys = self._keys
        if keys is None:
            keys = self._keys = {}
        k = keys.get(tenant)
        if k is None:
            k = keys[tenant] = self._compute(tenant)
        return k

    def _compute(self, tenant: str) -> float:
        weight = self.weight(tenant)
        if weight <= 0:
            return math.inf
        names = set(self.weights) | set(self.usage) | {tenant}
        total_w = sum(self.weight(n) for n in names)
        total_u = sum(self.usage.values())
        if total_u <= 0:
            return 0.0
        return (self.usage.get(tenant, 0.0) / total_u) / (weight / total_w)

    def active(self, tenants: Iterable[str]) -> bool:
        """True when these (pending) jobs' tenants are more than one: only then does order change."""
        first: str | None = None
        for t in tenants:
            if first is None:
                first = t
            elif t != first:
                return True
        return False


def parse_weights(text: str) -> dict[str, float]:
    """``"a=2,b=1"`` -> weights per tenant; ValueError (one line) on bad input."""
    weights: dict[str, float] = {}
    for part, name, weight in named_numbers(text, "tenant weight", "a=2,b=1"):
        if not weight >= 0 or math.isinf(weight):
            raise ValueError(f"tenant weight {part!r} must be a finite number >= 0")
        weights[name] = weight
    if not weights:
        raise ValueError("no tenant weights given (use e.g. a=2,b=1)")
    return weights
