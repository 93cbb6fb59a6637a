"""What the leader and its helpers read of the worker they run in, declared once.

Each helper asks for the least it needs; ``JobView``, the leader's whole view
(an ``ElasticContext`` satisfies it), is their union::

    GenerationView ─┬─ StepView ───┬─ ReportedJob ─┬─ JobView
                    └─ WorkerView ─┤               │
                                   └─ ProfiledJob ─┘

This module imports neither the leader nor the context, so every side can import it.
"""

from __future__ import annotations

from typing import Protocol

from workers.elastic.cli import WorkerOptions
from workers.elastic.keys import JobKeys


class GenerationView(Protocol):
    """The job's options, its current generation and members, the committed step."""

    @property
    def opts(self) -> WorkerOptions: ...
    @property
    def generation(self) -> int: ...
    @property
    def members(self) -> list[str]: ...
    @property
    def step(self) -> int: ...


class StepView(GenerationView, Protocol):
    """What a step's metadata is made of (``LeaderMeta``)."""

    @property
    def epoch(self) -> int: ...
    @property
    def last_loss(self) -> float: ...


class WorkerView(GenerationView, Protocol):
    """Which worker this is, and how many there are (recovery reads this)."""

    @property
    def me(self) -> str: ...
    @property
    def world(self) -> int: ...


class ProfiledJob(WorkerView, Protocol):
    """What the profiler reads of the worker."""

    def throughput_since(self, step: int) -> tuple[int, float]: ...


class ReportedJob(StepView, WorkerView, Protocol):
    """What the reports read of the worker."""

    def batch_time(self) -> float: ...


class JobView(ReportedJob, ProfiledJob, Protocol):
    """What the leader reads of the worker it runs in (an ``ElasticContext``)."""

    @property
    def keys(self) -> JobKeys: ...
    @property
    def state(self) -> str: ...
