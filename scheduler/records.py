"""The mutable working record of one job, shared by the simulator and the policy cores.

Policies decide on these records; the simulator owns their progress.  Keeping
one record per job (instead of rebuilding frozen views every event) is what
lets the simulator replay 82k-job traces quickly.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.priority import NORMAL


class JobRecord:
    """A job's requests, progress and allocation.

    ``remaining`` is work left, in seconds at the requested parallelism;
    ``speed[n]`` is the progress rate on ``n`` GPUs relative to the requested
    size (1.0 at ``requested``; a rigid job has no table and runs at 1.0).
    ``attained`` is GPU-seconds received since the last starvation promotion;
    ``executed`` is seconds run in total.  ``pace`` (1.0 unless the simulator
    models link contention) multiplies the progress rate: a job whose
    all-reduce shares uplinks progresses more slowly than its table says.
    ``klass`` is the priority class (:mod:`scheduler.priority`; 0 high, 1
    normal, 2 low), which every policy orders by before its own rule: the
    job's effective class, which ageing may lift above ``own_klass``, the class
    its priority gives (see :mod:`scheduler.priority`).  ``pending_since`` is
    when the job last started waiting (submit, preemption or requeue).

    Retries and limits (simulator only): ``fail_after`` seconds after each
    start the program fails; it is requeued with its progress while
    ``restarts < max_restarts``, else it ends failed; ``max_runtime`` seconds
    of wall clock after its first start it ends failed wherever it is.
    ``done_at`` is when its last step was done (None before): a job whose end
    costs time (``ScalingCost.finish_s``) still holds its GPUs from there.
    ``true_speed`` (None: ``speed``) is the table its progress follows when the
    policy believes another: in a replay of a measured run the policy sees
    only what the job had measured so far (``devtools.measured``).
    ``weight`` (``JobView.weight``, 1.0 by default) ranks its claim on extra
    GPUs in Elastic-Tiresias' scale-out and reclaim.  ``interactive`` (``JobView.interactive``)
    marks a session: the LAS policies keep it at its class's top level
    (:func:`scheduler.priority.las_level`), so only a higher class preempts it.
    """

    __slots__ = (
        "alloc",
        "attained",
        "attempt_start",
        "base",
        "compacted",
        "done_at",
        "duration",
        "end_time",
        "executed",
        "fail_after",
        "gain_ref",
        "id",
        "idx",
        "interactive",
        "klass",
        "last",
        "max_gpus",
        "max_restarts",
        "max_runtime",
        "min_gpus",
        "model",
        "own_klass",
        "pace",
        "pending_since",
        "preemptions",
        "q_exec",
        "queue",
        "remaining",
        "requested",
        "restarts",
        "resume_at",
        "running",
        "scale_events",
        "speed",
        "start_time",
        "submit",
        "tenant",
        "true_speed",
        "version",
        "weight",
    )

    def __init__(
        self,
        id: str,
        idx: int,
        submit: float,
        requested: int,
        duration: float,
        *,
        tenant: str = "",
        model: str = "",
        min_gpus: int = 0,
        max_gpus: int = 0,
        speed: Sequence[float] | None = None,
        klass: int = NORMAL,
        weight: float = 1.0,
        interactive: bool = False,
    ) -> None:
        self.id = id
        self.interactive = interactive
        self.idx = idx
        self.submit = submit
        self.requested = requested
        self.duration = duration
        self.tenant = tenant
        self.klass = klass
        self.own_klass = klass
        self.model = model
        self.min_gpus = min_gpus or requested
        self.max_gpus = max(max_gpus or requested, requested)
        self.speed = speed
        self.weight = weight
        self.true_speed: Sequence[float] | None = None
        self.remaining = float(duration)
        self.alloc = 0
        self.base = requested
        self.running = False
        self.attained = 0.0
        self.executed = 0.0
        self.q_exec = 0.0
        self.last = submit
        self.resume_at = submit
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.queue = 0
        self.version = 0
        self.preemptions = 0
        self.scale_events = 0
        self.pending_since = submit
        self.compacted = False
        self.pace = 1.0
        self.done_at: float | None = None
        self.fail_after: float | None = None
        self.max_restarts = 0
        self.max_runtime: float | None = None
        self.restarts = 0
        self.attempt_start = submit
        # throughput(requested)/throughput(1): turns ``rate`` into a speedup over one GPU
        self.gain_ref = float(requested)

    def rate(self, n: int) -> float:
        """Progress per second on ``n`` GPUs (seconds of requested-size work per second)."""
        if n <= 0:
            return 0.0
        table = self.speed
        if table is None:
            return 1.0
        return table[n] if n < len(table) else table[-1]

    def progress_rate(self, n: int) -> float:
        """The rate its progress follows on ``n`` GPUs (``rate`` unless ``true_speed`` is set)."""
        table = self.true_speed
        if table is None:
            return self.rate(n)
        if n <= 0:
            return 0.0
        return table[n] if n < len(table) else table[-1]

    def settle(self, now: float) -> None:
        """Account progress and service up to ``now`` (idempotent for the same ``now``)."""
        dt = now - self.last
        if dt <= 0:
            return
        if self.running:
            busy_from = self.last if self.last > self.resume_at else self.resume_at
            if now > busy_from:
                rate = self.progress_rate(self.alloc) * self.pace
                left = self.remaining
                self.remaining = left - (now - busy_from) * rate
                if self.remaining <= 0 < left and rate > 0:
                    self.done_at = busy_from + left / rate
            self.attained += self.alloc * dt
            self.executed += dt
            self.q_exec += dt
        self.last = now

    def finish_time(self, tail: float = 0.0) -> float:
        """When the job ends if nothing changes (it must be running).

        ``tail``: seconds it still holds its GPUs after its last step; once
        that step is behind it (``done_at``), the end stays where it was.
        """
        start = self.last if self.last > self.resume_at else self.resume_at
        if self.remaining > 0:
            return start + self.remaining / (self.progress_rate(self.alloc) * self.pace) + tail
        if tail > 0 and self.done_at is not None:
            return self.done_at + tail
        return start + tail

    def __repr__(self) -> str:
        return f"JobRecord({self.id!r}, gpus={self.requested}, alloc={self.alloc}, q={self.queue})"
