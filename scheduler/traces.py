"""Trace loaders and synthetic workloads, all producing :class:`TraceJob` tuples.

* Tiresias CSV (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``;
  optional ``priority`` (0-100) and ``tenant`` columns).
* Philly CSV (``timestamp,duration,num_gpus,gpu_time,cluster``), unsorted rows;
  filter by date range, virtual cluster and size; models from a seeded mix.
* EDL §6's synthetic workload and Poisson arrivals at a target load.

Bad rows are either skipped and counted (``on_error="skip"``) or raise
:class:`TraceError` (``on_error="fail"``); a missing column always raises.
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from scheduler.throughput import MODEL_NAMES


class TraceError(ValueError):
    """A trace file that cannot be used, with a one-line reason."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: submit time and duration in seconds, duration at ``gpus`` GPUs.

    ``priority`` (0-100) is None when the trace has none (the job is then normal class).
    ``fail_after``, ``max_restarts`` and ``max_runtime`` model a failing program and
    the job's limits (see :class:`scheduler.records.JobRecord`); None/0: none.
    ``gpu_type``: the GPU type the job runs on (a Tiresias-format trace's optional
    ``gpu_type`` column; ``""``: none given, :func:`scheduler.sim_types.assign_types`
    draws one); its ``duration`` is on the reference type all the same.
    """

    id: str
    submit: float
    gpus: int
    duration: float
    model: str = ""
    tenant: str = ""
    priority: int | None = None
    fail_after: float | None = None
    max_restarts: int = 0
    max_runtime: float | None = None
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    """Jobs sorted by submit time (ties keep file order) and what was skipped and why."""

    jobs: tuple[TraceJob, ...]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        """All rows dropped."""
        return sum(self.skipped.values())


def shared_dir() -> Path:
    """The shared data folder: $PORTAL_SHARED_DIR, else <repo>/../shared, else /work/shared."""
    env = os.environ.get("PORTAL_SHARED_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    candidate = repo.parent / "shared"
    if candidate.is_dir():
        return candidate
    return Path("/work/shared")


def shared_trace(name: str) -> Path:
    """Path of a trace in the shared data folder (``60_job.csv``, ``philly.csv``)."""
    return shared_dir() / "data" / name


def _require(columns: Sequence[str] | None, needed: Iterable[str], path: Path) -> None:
    have = set(columns or ())
    missing = [c for c in needed if c not in have]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")


def _bad(reason: str, skipped: dict[str, int], on_error: str, where: str) -> None:
    if on_error == "fail":
        raise TraceError(f"{where}: {reason}")
    skipped[reason] = skipped.get(reason, 0) + 1


def load_tiresias(
    path: Path | str,
    *,
    duration_scale: float = 1.0,
    max_gpus: int | None = None,
    on_error: str = "skip",
) -> LoadedTrace:
    """Read a Tiresias-format CSV; durations may be multiplied (the x10 experiments)."""
    p = Path(path)
    try:
        handle = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"{p}: cannot open ({exc.strerror})") from exc
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    with handle:
        reader = csv.DictReader(handle)
        _require(reader.fieldnames, ("job_id", "num_gpu", "submit_time", "duration"), p)
        for line, row in enumerate(reader, start=2):
            where = f"{p}:{line}"
            try:
                gpus = int(row["num_gpu"])
                submit = float(row["submit_time"])
                duration = float(row["duration"]) * duration_scale
            except (TypeError, ValueError):
                _bad("unparsable number", skipped, on_error, where)
                continue
            if duration < 0 or submit < 0:
                _bad("negative time", skipped, on_error, where)
                continue
            if gpus <= 0:
                _bad("no GPUs requested", skipped, on_error, where)
                continue
            if max_gpus is not None and gpus > max_gpus:
                _bad("larger than the cluster", skipped, on_error, where)
                continue
            priority: int | None = None
            text = (row.get("priority") or "").strip()
            if text:
                try:
                    priority = int(text)
                except ValueError:
                    priority = -1
                if not 0 <= priority <= 100:
                    _bad("priority not an integer in 0-100", skipped, on_error, where)
                    continue
            jobs.append(
                TraceJob(
                    id=str(row["job_id"]),
                    submit=submit,
                    gpus=gpus,
                    duration=duration,
                    model=(row.get("model_name") or "").strip(),
                    tenant=(row.get("tenant") or "").strip(),
                    priority=priority,
                    gpu_type=(row.get("gpu_type") or "").strip(),
                )
            )
    jobs.sort(key=lambda j: j.submit)
    return LoadedTrace(tuple(jobs), skipped)


def _parse_date(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise TraceError(f"bad date {text!r} (use YYYY-MM-DD[ HH:MM:SS])") from exc
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _philly_rows(
    p: Path,
    reader: Iterator[list[str]],
    *,
    lo: datetime | None,
    hi: datetime | None,
    vc: str | None,
    min_gpus: int,
    gpu_scale: int,
    max_gpus: int | None,
    on_error: str,
    skipped: dict[str, int],
) -> list[tuple[float, int, int, float, str]]:
    """The rows of the Philly CSV ``p`` that :func:`load_philly` keeps, in file order:
    (submit timestamp, line, GPUs, duration, cluster).  Bad rows are counted in ``skipped``
    (or raise, ``on_error="fail"``)."""
    rows: list[tuple[float, int, int, float, str]] = []
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    header = next(reader, None)
    _require(header, ("timestamp", "duration", "num_gpus", "cluster"), p)
    assert header is not None
    i_ts, i_dur = header.index("timestamp"), header.index("duration")
    i_gpu, i_vc = header.index("num_gpus"), header.index("cluster")
    cache: dict[str, float] = {}
    for line, row in enumerate(reader, start=2):
        if not row:
            continue  # blank line (the file ends with one)
        try:
            ts_text = row[i_ts]
            ts = cache.get(ts_text)
            if ts is None:
                dt = datetime.fromisoformat(ts_text)
                if dt.tzinfo is None:
                    dt = dt.replace(tzinfo=UTC)
                ts = (dt - epoch).total_seconds()
                cache[ts_text] = ts
            duration = float(row[i_dur])
            gpus = int(float(row[i_gpu]))
            cluster = row[i_vc]
        except (IndexError, ValueError):
            _bad("unparsable row", skipped, on_error, f"{p}:{line}")
            continue
        if vc is not None and cluster != vc:
            continue
        if lo is not None and ts < (lo - epoch).total_seconds():
            continue
        if hi is not None and ts >= (hi - epoch).total_seconds():
            continue
        if not math.isfinite(duration) or duration < 0:
            _bad("negative duration", skipped, on_error, f"{p}:{line}")
            continue
        if gpus <= 0:
            _bad("no GPUs requested", skipped, on_error, f"{p}:{line}")
            continue
        if gpus < min_gpus:
            continue
        gpus *= gpu_scale
        if max_gpus is not None and gpus > max_gpus:
            _bad("larger than the cluster", skipped, on_error, f"{p}:{line}")
            continue
        rows.append((ts, line, gpus, duration, cluster))
    return rows


def load_philly(
    path: Path | str,
    *,
    start: str | None = None,
    end: str | None = None,
    vc: str | None = None,
    max_gpus: int | None = None,
    seed: int = 0,
    models: Sequence[str] = MODEL_NAMES,
    on_error: str = "skip",
    min_gpus: int = 1,
    gpu_scale: int = 1,
) -> LoadedTrace:
    """Read the Philly CSV: keep rows in [start, end) of virtual cluster ``vc``.

    Submit times become seconds after the first kept job.  Models are drawn
    uniformly from ``models`` with ``random.Random(seed)``, one per kept job in
    (submit time, file order) order, as the papers assigned models.  Rows
    asking for fewer than ``min_gpus`` GPUs are left out (not counted as
    skipped: a filter, like ``vc``); each kept job's GPUs are multiplied by
    ``gpu_scale`` (the vClos journal mapped a production trace's sizes onto
    4-512 GPUs) before the ``max_gpus`` check.
    """
    if min_gpus < 1 or gpu_scale < 1:
        raise TraceError("min_gpus and gpu_scale must be at least 1")
    p = Path(path)
    lo = _parse_date(start) if start else None
    hi = _parse_date(end) if end else None
    try:
        handle = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"{p}: cannot open ({exc.strerror})") from exc
    skipped: dict[str, int] = {}
    with handle:
        rows = _philly_rows(
            p,
            csv.reader(handle),
            lo=lo,
            hi=hi,
            vc=vc,
            min_gpus=min_gpus,
            gpu_scale=gpu_scale,
            max_gpus=max_gpus,
            on_error=on_error,
            skipped=skipped,
        )
    rows.sort()
    rng = random.Random(seed)
    t0 = rows[0][0] if rows else 0.0
    jobs = tuple(
        TraceJob(
            id=f"p{line}",
            submit=ts - t0,
            gpus=gpus,
            duration=max(duration, 1.0),
            model=rng.choice(list(models)),
            tenant=cluster,
        )
        for ts, line, gpus, duration, cluster in rows
    )
    return LoadedTrace(jobs, skipped)


def edl_synthetic(
    *,
    jobs: int = 16,
    gap: float = 30.0,
    gpus: int = 4,
    duration: float = 3600.0,
    mixed: bool = False,
    seed: int = 0,
) -> LoadedTrace:
    """EDL §6: one job every ``gap`` s until ``jobs``, each on ``gpus`` GPUs, models at random.

    The excerpt does not give job lengths: ``duration`` (seconds at 4 GPUs) for
    every job, or with ``mixed`` log-uniform between 10 minutes and 2 hours
    (our choices).  Models are drawn from the nine TensorFlow-benchmark models.
    """
    rng = random.Random(seed)
    out: list[TraceJob] = []
    for i in range(jobs):
        model = rng.choice(MODEL_NAMES[:9])
        length = (
            round(math.exp(rng.uniform(math.log(600), math.log(7200))), 1) if mixed else duration
        )
        out.append(TraceJob(id=f"s{i}", submit=i * gap, gpus=gpus, duration=length, model=model))
    return LoadedTrace(tuple(out), {})


def poisson_workload(
    *,
    jobs: int,
    total_gpus: int,
    load: float,
    sizes: Sequence[int] = (1, 2, 4, 8, 16),
    size_weights: Sequence[float] = (0.5, 0.2, 0.15, 0.1, 0.05),
    mean_duration: float = 3600.0,
    seed: int = 0,
) -> LoadedTrace:
    """Poisson arrivals whose offered GPU load is ``load`` x the cluster, exponential durations."""
    if not load > 0:
        raise TraceError("load must be positive")
    rng = random.Random(seed)
    mean_gpus = sum(s * w for s, w in zip(sizes, size_weights, strict=True)) / sum(size_weights)
    rate = load * total_gpus / (mean_gpus * mean_duration)
    t = 0.0
    out: list[TraceJob] = []
    for i in range(jobs):
        t += rng.expovariate(rate)
        g = rng.choices(list(sizes), weights=list(size_weights))[0]
        out.append(
            TraceJob(
                id=f"q{i}",
                submit=round(t, 3),
                gpus=g,
                duration=max(1.0, round(rng.expovariate(1.0 / mean_duration), 1)),
                model=rng.choice(MODEL_NAMES),
            )
        )
    return LoadedTrace(tuple(out), {})


def vclos_workload(
    *,
    jobs: int,
    total_gpus: int,
    load: float,
    sizes: Sequence[int] = (4, 8, 16, 32, 64),
    size_weights: Sequence[float] | None = (0.3, 0.25, 0.2, 0.15, 0.1),
    models: Sequence[str] = ("vgg16", "resnet50", "resnet101", "bert"),
    min_duration: float = 300.0,
    max_duration: float = 9000.0,
    seed: int = 0,
) -> LoadedTrace:
    """A scaled-down vClos experiment: Poisson arrivals, multi-GPU jobs, log-uniform durations.

    The authors used 8,192 GPUs, sizes 4-512 and durations 1,000-100,000 s;
    we keep the shape (sizes from 4 GPUs up, four communication-heavy models)
    at a size whose ECMP analysis runs in seconds.  With ``size_weights=None``
    the i-th size has weight 0.75**i (small jobs are the most common).
    """
    if not load > 0:
        raise TraceError("load must be positive")
    if not sizes or any(s <= 0 for s in sizes):
        raise TraceError("job sizes must be positive")
    if size_weights is None:
        size_weights = [0.75**i for i in range(len(sizes))]
    if len(size_weights) != len(sizes):
        raise TraceError("one weight per job size")
    rng = random.Random(seed)
    mean_gpus = sum(s * w for s, w in zip(sizes, size_weights, strict=True)) / sum(size_weights)
    mean_duration = (max_duration - min_duration) / math.log(max_duration / min_duration)
    rate = load * total_gpus / (mean_gpus * mean_duration)
    t = 0.0
    out: list[TraceJob] = []
    for i in range(jobs):
        t += rng.expovariate(rate)
        g = rng.choices(list(sizes), weights=list(size_weights))[0]
        d = math.exp(rng.uniform(math.log(min_duration), math.log(max_duration)))
        out.append(
            TraceJob(
                id=f"v{i}",
                submit=round(t, 3),
                gpus=g,
                duration=round(d, 1),
                model=rng.choice(models),
            )
        )
    return LoadedTrace(tuple(out), {})
