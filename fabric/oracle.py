"""Exact CP-SAT (OR-Tools) formulation of the vClos shape search: test oracle and baseline.

Not used in production: the combinatorial search in :mod:`fabric.allocator` is
exact and much faster. This is the authors' ILP restated for CP-SAT: choose
``m`` leaves (``x``) and ``n`` uplink planes (``y``) with ``x_l + y_p <= 1``
whenever plane ``p`` is not free on leaf ``l``; minimise best-fit cost (free
uplinks of the chosen leaves plus the number of leaves each chosen plane is
free on), so busy leaves and planes are used first.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec


def solve_biclique_cpsat(
    masks: Mapping[int, int], m: int, n: int, planes: int, time_limit_s: float = 10.0
) -> tuple[int, int] | None:
    """``(planes_mask, m)`` of an optimal best-fit ``m x n`` choice, or ``None``.

    ``None`` also when the time limit passes without a solution (as a solver-based
    allocator with a time limit would then leave the job waiting).
    """
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    leaves = sorted(masks)
    x = {leaf: model.new_bool_var(f"x{leaf}") for leaf in leaves}
    y = {p: model.new_bool_var(f"y{p}") for p in range(planes)}
    model.add(sum(x.values()) == m)
    model.add(sum(y.values()) == n)
    plane_free_on = dict.fromkeys(range(planes), 0)
    for leaf in leaves:
        for p in range(planes):
            if masks[leaf] >> p & 1:
                plane_free_on[p] += 1
            else:
                model.add_bool_or([x[leaf].Not(), y[p].Not()])
    model.minimize(
        sum(masks[leaf].bit_count() * x[leaf] for leaf in leaves)
        + sum(plane_free_on[p] * y[p] for p in range(planes))
    )
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1  # the machine is shared; also makes runs repeatable
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = sum(1 << p for p in range(planes) if solver.value(y[p]))
    return chosen, m


class OracleAllocator(VClosAllocator):
    """The same policy as :class:`VClosAllocator` with the shape search done by CP-SAT."""

    def __init__(self, spec: FabricSpec, time_limit_s: float = 10.0) -> None:
        super().__init__(spec)
        self.time_limit_s = time_limit_s

    def _find(
        self, masks: dict[int, int], m: int, n: int, order: list[int]
    ) -> tuple[int, int] | None:
        return solve_biclique_cpsat(masks, m, n, self.spec.uplinks_per_leaf, self.time_limit_s)
