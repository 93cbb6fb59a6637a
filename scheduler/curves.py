"""Throughput curves for the policy: profiled, measured, or an optimistic prior (pure).

Elastic-Tiresias grows a job while its throughput still rises, so it needs a
samples/s figure for every size in the job's range.  In order of trust:

1. the curve of the job's ``profile(min, max)`` (EDL §4), when it ran;
2. what the job measured while running at each size (a running average of its
   progress reports at that parallelism, kept on the job);
3. for sizes never seen: linear in the GPU count from the per-GPU rate at the
   largest measured size (or 1 sample/s per GPU with no data at all).

The prior is deliberately optimistic: an unmeasured size looks worth trying,
the job grows onto idle GPUs, and the measurement at the new size then
replaces the guess, so a job whose throughput stops rising stops growing.

Reading a curve is done here too, once, for every caller: the policies turn a
job's curve into progress rates relative to its requested size
(:func:`relative_speeds`), the cluster view into EDL's per-job contribution
to cluster efficiency, ``thr(n)/thr(1)`` (:func:`speedup`), and into how busy
each of a job's GPUs is (:func:`gpu_efficiency`).  Curves arrive with integer
keys (policy side) or string keys (JSON on the job); both are accepted.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from itertools import pairwise
from types import MappingProxyType

#: A throughput curve: GPU count (int, or str as stored in JSON) -> samples/s.
Curve = Mapping[int, float] | Mapping[str, float]

MEASUREMENT_WEIGHT = 0.3  # weight of the newest progress report in a size's running average


def record_measurement(
    curve: Mapping[str, float], size: int, rate: float, weight: float = MEASUREMENT_WEIGHT
) -> dict[str, float]:
    """The job's measured curve after one progress report at ``size`` GPUs.

    Kept on the job as an exponentially weighted average per size (JSON keys
    are strings), so the tick reads one small dict per job, not its history.
    """
    updated = dict(curve)
    if size <= 0 or rate <= 0:
        return updated
    key = str(size)
    previous = updated.get(key)
    updated[key] = rate if previous is None else (1 - weight) * previous + weight * rate
    return updated


@functools.cache
def _linear_prior(max_gpus: int) -> Mapping[int, float]:
    return MappingProxyType({n: float(n) for n in range(1, max_gpus + 1)})


def policy_curve(
    profiled: Mapping[int, float], measured: Mapping[int, float], max_gpus: int
) -> Mapping[int, float]:
    """A samples/s value for every size 1..max_gpus (profiled > measured > linear prior)."""
    if not profiled and not measured:
        return _linear_prior(max_gpus)  # most queued jobs: one shared, read-only curve
    known = {**measured, **profiled}
    known = {n: v for n, v in known.items() if n >= 1 and v > 0}
    if known:
        top = max(known)
        per_gpu = known[top] / top
    else:
        top, per_gpu = 0, 1.0
    curve: dict[int, float] = {}
    for n in range(1, max(max_gpus, top) + 1):
        if n in known:
            curve[n] = known[n]
        elif n > top:
            curve[n] = per_gpu * n
        else:  # between measured sizes: interpolate from the nearest known neighbours
            lower = max((m for m in known if m < n), default=None)
            upper = min(m for m in known if m > n)
            if lower is None:
                curve[n] = known[upper] * n / upper
            else:
                frac = (n - lower) / (upper - lower)
                curve[n] = known[lower] + (known[upper] - known[lower]) * frac
    return curve


def curve_points(curve: Curve | None) -> list[tuple[int, float]]:
    """The curve's (GPUs, samples/s) points with positive throughput, by GPU count."""
    return sorted((int(k), float(v)) for k, v in (curve or {}).items() if float(v) > 0)


def speedup(curve: Curve | None, gpus: int) -> float:
    """thr(n)/thr(1) from a curve, interpolated linearly; ``n`` when there is no curve.

    Beyond the curve's ends the nearest point's per-GPU rate is extended
    linearly; with no single-GPU point, thr(1) is taken as the smallest
    point's per-GPU rate.
    """
    if gpus <= 0:
        return 0.0
    points = curve_points(curve)
    if not points:
        return float(gpus)
    base = dict(points).get(1) or points[0][1] / points[0][0]
    for (n0, v0), (n1, v1) in pairwise(points):
        if n0 <= gpus <= n1:
            return (v0 + (v1 - v0) * (gpus - n0) / (n1 - n0)) / base
    nearest_n, nearest_v = points[-1] if gpus > points[-1][0] else points[0]
    return nearest_v / base * gpus / nearest_n


def gpu_efficiency(curve: Curve | None, gpus: int, measured: float | None) -> float | None:
    """How busy each of a job's GPUs is: thr(n) / (n thr(1)), measured when possible.

    Measured throughput over the curve's single-GPU throughput when both are
    known; else the curve's own thr(n)/(n thr(1)); None when nothing is known.
    """
    if gpus <= 0 or not curve:
        return None
    single = dict(curve_points(curve)).get(1)
    if single and measured:
        return round(min(1.0, measured / (gpus * single)), 3)
    return round(min(1.0, speedup(curve, gpus) / gpus), 3)


def relative_speeds(curve: Curve, reference_gpus: int, top: int) -> list[float]:
    """Progress rate on 0..top GPUs relative to ``reference_gpus`` (1.0 there), from a curve.

    A size missing from the curve runs at the largest size below it that the
    curve knows (0 below its first point): a policy never counts on
    throughput nobody measured or predicted.  Without a point at
    ``reference_gpus`` the curve's best throughput is the reference.
    """
    points = dict(curve_points(curve))
    ref = points.get(reference_gpus) or max(points.values(), default=0.0)
    speeds = [0.0] * (top + 1)
    last = 0.0
    for n in range(1, top + 1):
        last = points.get(n, last)
        speeds[n] = last / ref if ref > 0 else 0.0
    return speeds


def view_speeds(curve: Mapping[int, float], requested: int, max_gpus: int) -> list[float]:
    """A job's speed table for the policy: :func:`relative_speeds` up to its largest size.

    The largest size is the curve's, the job's maximum or its request,
    whichever is largest.
    """
    top = max(max(curve), max_gpus or 0, requested)
    return relative_speeds(curve, requested, top)


class SpeedTables:
    """:func:`view_speeds` remembered across policy passes, for curves seen again.

    The tick hands the policy the same curve objects pass after pass (kept per
    job while the job does not change, or the linear prior shared by every job
    with no measurement), so a job's table is made when its curve or size
    changes, not on every pass.  A table is found by the curve's identity:
    an entry holds its curve, so no other object can take that identity while
    the entry stands, and a curve must not be changed in place once used here
    (none is: the tick makes a new one for a changed job).  Tables are shared,
    read-only lists.  :meth:`sweep` drops the entries no pass asked for since
    the previous sweep, so the memo holds the live jobs' curves only.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[int, int, int], tuple[Mapping[int, float], list[float]]] = {}
        self._used: set[tuple[int, int, int]] = set()

    def table(self, curve: Mapping[int, float], requested: int, max_gpus: int) -> list[float]:
        """:func:`view_speeds` of ``curve``, made once per curve object and sizes."""
        key = (id(curve), requested, max_gpus)
        entry = self._tables.get(key)
        if entry is None or entry[0] is not curve:
            entry = (curve, view_speeds(curve, requested, max_gpus))
            self._tables[key] = entry
        self._used.add(key)
        return entry[1]

    def sweep(self) -> None:
        """Forget the tables of curves no pass used since the last sweep."""
        used = self._used
        self._tables = {key: entry for key, entry in self._tables.items() if key in used}
        self._used = set()

    def __len__(self) -> int:
        return len(self._tables)
