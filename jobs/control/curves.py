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
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

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
