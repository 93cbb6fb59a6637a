"""Ranks in the allocation's order: members of every generation sorted by their allocation rank.

The control plane's allocator (``fabric/allocator.py``) computes a rank order
whose ring neighbours share no link with another job's traffic; the agent
hands each worker its place in it (``--rank``), and the worker writes it to
``edl:{job}:ranks`` when it starts. Generation 0 fills its slots by that rank,
and the leader orders each later generation by it, so a ring all-reduce
follows the plan the fabric reserved::

    allocation   leaf A: gpu0 gpu1 | leaf B: gpu8 gpu9     rank order w8 w9 w0 w1
    ring          w8 -> w9 -> w0 -> w1 -> w8               two leaf crossings, as planned

When the control plane re-plans a running job, its command carries the
whole new order (``rank_order``); the agent sends it to the job
(``JobControl.set_rank_order``), and the leader replaces the ``ranks`` hash
with it before the change's generation, so the survivors take their places
in the new plan too (``write_rank_order``)::

    old plan  leaf 0: w0 w1 | leaf 1: w8 w9        ranks w0 w1 w8 w9
    re-plan   leaf 1: w8 w9 | leaf 2: w16 w17      migrate: -w0 -w1 +w16 +w17
    survivors' old ranks + joiners' new ones        w16(2) w8(2) w17(3) w9(3): 4 crossings
    the new order, for everyone                     w8 w9 w16 w17: 2 crossings

Workers without a rank (started by hand, by older agents) keep their order
after those with one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis

from workers.elastic.keys import JobKeys


def order_by_rank(members: Sequence[str], ranks: Mapping[str, int]) -> tuple[str, ...]:
    """``members`` sorted by allocation rank; those without one after, in the given order."""
    ranked = sorted((w for w in members if w in ranks), key=lambda w: (ranks[w], w))
    return tuple(ranked) + tuple(w for w in members if w not in ranks)


def parse_ranks(raw: Mapping[str, str]) -> dict[str, int]:
    """The ``ranks`` hash as numbers; a malformed value is ignored (that worker is unranked)."""
    ranks = {}
    for worker, value in raw.items():
        if value.isdigit():
            ranks[worker] = int(value)
    return ranks


def ring_neighbours(members: Sequence[str]) -> set[frozenset[str]]:
    """The pairs that exchange data in a ring all-reduce over ``members`` in rank order."""
    n = len(members)
    return {frozenset((members[i], members[(i + 1) % n])) for i in range(n) if n > 1}


def write_rank_order(client: redis.Redis, keys: JobKeys, order: Sequence[str]) -> None:
    """Make ``order`` the job's ranks, all at once (a worker it does not name is unranked)."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.ranks())
    pipe.hset(keys.ranks(), mapping={w: r for r, w in enumerate(order)})
    pipe.execute()
