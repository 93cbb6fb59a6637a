"""A kept policy core per GPU-type pool: a typed snapshot decided as a fresh pass would.

:class:`~scheduler.policies.kept.KeptPolicy` keeps one restored core for a
one-type snapshot; a typed one (several GPU types, or a job asking for a type
or labels: :func:`scheduler.gpu_types.is_typed`) it hands to the wrapped
policy's fresh pass, which restores a core per type pool every time.
:class:`KeptTypedPolicy` keeps one restored core per pool instead::

    typed snapshot ──split_by_type──┬─ pool "a100" ─ its RestoredCore: update (the
                                    │                pool's changed jobs and GPUs), decide
                                    ├─ pool "h100" ─ its RestoredCore: ...
                                    └─ ...
                                      decisions, pool after pool (type name order)

A pool's snapshot is a snapshot like any other (its type's GPUs, the running
jobs on them, the queued jobs routed to it, the whole snapshot's tenants), so
each kept core decides on it as :meth:`Policy.schedule`'s fresh core for that
pool does: a queued job routed to another pool this time is one job gone from
one core and one new in another.  An unchanged job's view is the same object in
its pool as in the snapshot (the split keeps it unless the job has a curve of
its own on the type), so each core finds the changed jobs by identity, as the
one-type core does.  Tests check the decisions against the fresh pass on random
typed snapshot sequences (``tests/control/test_kept_typed_core.py``) and the
live tick's kept snapshot against a rebuild (``tests/jobs/test_typed_tick_kept.py``).
"""

from __future__ import annotations

from scheduler.curves import SpeedTables
from scheduler.gpu_types import split_by_type
from scheduler.placement import ConsolidatedPlacement, Placement, SelectorPlacement
from scheduler.policies.base import Policy
from scheduler.policies.kept import KeptPolicy, RestoredCore
from scheduler.types import Decision, Snapshot


class KeptTypedPolicy(KeptPolicy):
    """``policy`` with its core kept for one-type snapshots and one kept per type pool for
    typed ones; :meth:`schedule` decides as ``policy.schedule`` does.

    Not pure (it keeps the restored cores); one caller at a time (the tick, under its
    lock).  Any error in a typed pass drops every pool's core: the next pass restores
    fresh ones.  ``rebuilds`` counts the restored cores made from scratch, the one-type
    core's and the pools' together.
    """

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.pools: dict[str, RestoredCore] = {}

    def reset(self) -> None:
        """Forget every kept core: the next pass restores them from its whole snapshot."""
        super().reset()
        self.pools = {}

    def schedule(
        self,
        snapshot: Snapshot,
        placement: Placement | None = None,
        *,
        speeds: SpeedTables | None = None,
    ) -> list[Decision]:
        """The decisions :meth:`Policy.schedule` makes on ``snapshot``, from the kept cores."""
        split = split_by_type(snapshot)
        if split is None:  # one type, nobody asks for types or labels: the one kept core
            self.pools = {}
            return super().schedule(snapshot, placement, speeds=speeds)
        self.kept = None  # a typed cluster keeps its cores by pool
        placer = placement or ConsolidatedPlacement()
        decisions: list[Decision] = []
        kept: dict[str, RestoredCore] = {}
        try:
            for pool in split.pools:  # a job's GPUs, extras and victims: its pool's type
                core = self.pools.get(pool.gpu_type)
                if core is None:
                    core = RestoredCore(self.policy)
                    self.rebuilds += 1
                kept[pool.gpu_type] = core
                core.update(pool.snapshot, speeds)
                pool_placer = SelectorPlacement(placer, pool.allowed) if pool.allowed else placer
                decisions.extend(core.decide(pool.snapshot, pool_placer))
        except BaseException:
            self.pools = {}  # half-applied: the next pass starts over
            raise
        self.pools = kept  # a type no longer in the cluster: its core goes
        return decisions


__all__ = ["KeptTypedPolicy"]
