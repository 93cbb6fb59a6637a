"""Collective communication patterns as steps of point-to-point flows.

Each generator takes a job's GPUs in rank order (``gpus[r]`` is rank ``r``) and
the message size in bytes, and returns the communication steps: in one step
all flows run at the same time; the next step starts when all of them are done.
Flows between a GPU and itself are never produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Flow:
    """``nbytes`` sent from GPU ``src`` to GPU ``dst`` (global ids)."""

    src: int
    dst: int
    nbytes: float


@dataclass(frozen=True)
class Step:
    """Flows that run concurrently; ``label`` names the phase for people."""

    flows: tuple[Flow, ...]
    label: str = ""


def _check(gpus: Sequence[int], nbytes: float) -> list[int]:
    ranks = list(gpus)
    if len(set(ranks)) != len(ranks):
        raise ValueError("a GPU appears twice in the rank list")
    if nbytes < 0:
        raise ValueError("nbytes must be non-negative")
    return ranks


def ring_allreduce(gpus: Sequence[int], nbytes: float) -> list[Step]:
    """Ring all-reduce: ``N-1`` reduce-scatter steps then ``N-1`` all-gather steps.

    In every step rank ``r`` sends one chunk (``nbytes / N``) to rank ``r+1 mod N``.
    """
    ranks = _check(gpus, nbytes)
    n = len(ranks)
    if n < 2:
        return []
    chunk = nbytes / n
    flows = tuple(Flow(ranks[r], ranks[(r + 1) % n], chunk) for r in range(n))
    return [Step(flows, f"reduce-scatter {t}") for t in range(n - 1)] + [
        Step(flows, f"all-gather {t}") for t in range(n - 1)
    ]


def _exchange(ranks: list[int], pairs: list[tuple[int, int]], size: float, label: str) -> Step:
    flows: list[Flow] = []
    for a, b in pairs:
        flows.append(Flow(ranks[a], ranks[b], size))
        flows.append(Flow(ranks[b], ranks[a], size))
    return Step(tuple(flows), label)


def halving_doubling(gpus: Sequence[int], nbytes: float) -> list[Step]:
    """Recursive halving-doubling all-reduce (Rabenseifner), any number of ranks.

    With ``P`` the largest power of two ``<= N``: ranks ``P..N-1`` first send their
    data to ranks ``0..N-P-1`` (pre-step); the ``P`` ranks run reduce-scatter by
    recursive vector halving (partner ``r xor d``, ``d = 1, 2, ... P/2``, half the
    data each time) and all-gather by recursive doubling (``d = P/2 ... 1``);
    finally ranks ``0..N-P-1`` send the result back (post-step).
    """
    ranks = _check(gpus, nbytes)
    n = len(ranks)
    if n < 2:
        return []
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    steps: list[Step] = []
    if extra:
        steps.append(
            Step(tuple(Flow(ranks[p + i], ranks[i], nbytes) for i in range(extra)), "pre-reduce")
        )
    dists = []
    d = 1
    while d < p:
        dists.append(d)
        d *= 2
    size = nbytes
    for d in dists:
        size /= 2
        pairs = [(r, r ^ d) for r in range(p) if r < r ^ d]
        steps.append(_exchange(ranks, pairs, size, f"reduce-scatter d={d}"))
    for d in reversed(dists):
        pairs = [(r, r ^ d) for r in range(p) if r < r ^ d]
        steps.append(_exchange(ranks, pairs, size, f"all-gather d={d}"))
        size *= 2
    if extra:
        steps.append(
            Step(
                tuple(Flow(ranks[i], ranks[p + i], nbytes) for i in range(extra)), "post-broadcast"
            )
        )
    return steps


def hierarchical_ring(gpus: Sequence[int], nbytes: float, group_size: int) -> list[Step]:
    """Two-level (multi-ring) all-reduce over groups of ``group_size`` consecutive ranks.

    Reduce-scatter inside every group (a ring each, chunks of ``nbytes / g``);
    then, for every slot ``s``, a ring all-reduce among the ``s``-th ranks of all
    groups over that slot's chunk (one independent ring per slot, run together);
    then all-gather inside every group. Groups are usually one leaf's GPUs.
    """
    ranks = _check(gpus, nbytes)
    n = len(ranks)
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size {group_size} must divide the {n} ranks")
    g = group_size
    groups = n // g
    steps: list[Step] = []
    chunk = nbytes / g
    intra = tuple(
        Flow(ranks[k * g + s], ranks[k * g + (s + 1) % g], chunk)
        for k in range(groups)
        for s in range(g)
        if g > 1
    )
    if intra:
        steps += [Step(intra, f"intra reduce-scatter {t}") for t in range(g - 1)]
    if groups > 1:
        inter_chunk = chunk / groups
        inter = tuple(
            Flow(ranks[k * g + s], ranks[((k + 1) % groups) * g + s], inter_chunk)
            for s in range(g)
            for k in range(groups)
        )
        steps += [Step(inter, f"inter reduce-scatter {t}") for t in range(groups - 1)]
        steps += [Step(inter, f"inter all-gather {t}") for t in range(groups - 1)]
    if intra:
        steps += [Step(intra, f"intra all-gather {t}") for t in range(g - 1)]
    return steps


def all_to_all(gpus: Sequence[int], nbytes: float) -> list[Step]:
    """Pairwise all-to-all: in step ``k`` (1..N-1) rank ``r`` sends ``nbytes / N`` to ``r+k``."""
    ranks = _check(gpus, nbytes)
    n = len(ranks)
    if n < 2:
        return []
    chunk = nbytes / n
    return [
        Step(tuple(Flow(ranks[r], ranks[(r + k) % n], chunk) for r in range(n)), f"shift {k}")
        for k in range(1, n)
    ]


def pipeline(gpus: Sequence[int], nbytes: float, microbatches: int = 1) -> list[Step]:
    """Pipeline-parallel point-to-point: stage ``r`` feeds stage ``r+1``.

    Per micro-batch, one forward step (activations ``r -> r+1``, all stages busy as
    in the steady state) and one backward step (gradients ``r+1 -> r``).
    """
    ranks = _check(gpus, nbytes)
    n = len(ranks)
    if n < 2 or microbatches < 1:
        return []
    fwd = Step(tuple(Flow(ranks[r], ranks[r + 1], nbytes) for r in range(n - 1)), "forward")
    bwd = Step(tuple(Flow(ranks[r + 1], ranks[r], nbytes) for r in range(n - 1)), "backward")
    return [fwd, bwd] * microbatches


PATTERNS = ("ring", "hd", "hring", "a2a", "pipeline")


def pattern_steps(
    pattern: str, gpus: Sequence[int], nbytes: float, group_size: int | None = None
) -> list[Step]:
    """Steps of a named pattern (``ring``, ``hd``, ``hring``, ``a2a``, ``pipeline``).

    ``hring`` needs ``group_size`` (GPUs per leaf of the job); without it, it uses
    a single group (a plain ring's shape).
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")
    if len(gpus) < 2:
        return []
    if pattern == "ring":
        return ring_allreduce(gpus, nbytes)
    if pattern == "hd":
        return halving_doubling(gpus, nbytes)
    if pattern == "hring":
        return hierarchical_ring(gpus, nbytes, group_size or len(gpus))
    if pattern == "a2a":
        return all_to_all(gpus, nbytes)
    return pipeline(gpus, nbytes)
