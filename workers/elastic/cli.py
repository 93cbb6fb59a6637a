"""Command-line arguments of a training worker process (pure parsing, no torch).

Kept apart from ``worker.py`` so that the node agent can build and check the
same command line without importing torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.catalog import WorkloadArgumentError, validate_args
from workers.elastic.redis_client import DEFAULT_OUTAGE_S, MAX_OUTAGE_S
from workers.elastic.straggler import DEFAULT_RULE, parse_rule

RECOVERY_MODES = ("consistent", "approximate")


@dataclass(frozen=True)
class WorkerOptions:
    """Everything one worker process is told on its command line."""

    job_id: str
    worker_id: str
    workload: str
    args: dict[str, int | float]
    batch_size: int
    recovery: str
    store_url: str
    """The job's store (``<ARTIFACT_URL>/tenants/<slug>/jobs/<pk>``, or any directory):
    checkpoints go to ``checkpoints/`` there, ``ctx.save_artifact`` to ``artifacts/``."""
    checkpoint_every: int
    checkpoint_minutes: float | None
    initial_world: int | None
    device: str
    redis_url: str
    max_steps: int | None
    step_log: str | None
    sync_timeout_s: float
    scale_lead_ms: float
    drop_stragglers: bool
    slow_ms: float
    dtype: str = "float32"
    checkpoint_keep: int = 2
    checkpoint_min_seconds: float = 0.0
    """Periodic checkpoints (every N steps) come at most this often; 0 = no floor."""
    """Non-final checkpoints kept (plus the final one)."""
    redis_outage_s: float = DEFAULT_OUTAGE_S
    """How long a Redis outage (restart, AOF loading) the worker rides out before it fails."""
    rank: int | None = None
    """This worker's place in the allocation's rank order (``ranks.py``); None: unranked."""
    straggler_rule: str = DEFAULT_RULE.spec()
    """When the leader flags a straggler (``straggler.parse_rule``: ``default``, ``paper``,
    ``K/N@R``)."""
    comm: str = "auto"
    """The communicator's backend: ``auto`` (NCCL on CUDA, gloo on the CPU), ``gloo``, ``nccl``."""

    @property
    def backend(self) -> str:
        """The process groups' backend this worker builds (``communicator_backend``)."""
        return communicator_backend(self.device, self.comm)


COMM_CHOICES = ("auto", "gloo", "nccl")


def communicator_backend(device: str, comm: str) -> str:
    """``nccl`` or ``gloo``: what ``--comm`` means for ``--device``.

    ``auto`` is NCCL on a CUDA device and gloo on the CPU. ``gloo`` on a CUDA
    device keeps the model there and moves the communicated tensors through
    the host: the only way several workers can share one GPU (NCCL refuses two
    ranks of a communicator on one device).
    """
    if comm not in COMM_CHOICES:
        raise WorkerArgumentError(f"--comm must be one of {', '.join(COMM_CHOICES)}")
    cuda = device.startswith("cuda")
    if comm == "nccl" and not cuda:
        raise WorkerArgumentError("--comm nccl needs a CUDA --device")
    if comm == "auto":
        return "nccl" if cuda else "gloo"
    return comm


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m workers.elastic.worker``."""
    p = argparse.ArgumentParser(
        prog="python -m workers.elastic.worker",
        description="One elastic training worker (one process = one GPU slot).",
    )
    p.add_argument("--job", required=True, help="job id (Redis keys edl:{job}:...)")
    p.add_argument("--worker", required=True, help="worker id, unique within the job")
    p.add_argument("--workload", required=True, help="built-in workload name (workers/catalog.py)")
    p.add_argument("--args", default="{}", help="workload arguments as a JSON object")
    p.add_argument("--batch-size", type=int, required=True, help="fixed global batch size")
    p.add_argument("--recovery", choices=RECOVERY_MODES, default="consistent")
    p.add_argument(
        "--store-url",
        "--checkpoint-dir",  # the earlier name, kept as an alias
        dest="store_url",
        required=True,
        help="the job's artifact store: a directory, file:///dir or s3://bucket/prefix",
    )
    p.add_argument(
        "--checkpoint-keep", type=int, default=2, help="non-final checkpoints kept (>= 1)"
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=50, help="mini-batches between checkpoints (0: off)"
    )
    p.add_argument("--checkpoint-minutes", type=float, default=None)
    p.add_argument(
        "--checkpoint-min-seconds",
        type=float,
        default=0.0,
        help="at most one periodic checkpoint per this many seconds (fast steps); 0 = no floor",
    )
    p.add_argument(
        "--initial-world",
        type=int,
        default=None,
        help="size of generation 0; omit for a newcomer joining a running job",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda:K")
    p.add_argument(
        "--comm",
        choices=COMM_CHOICES,
        default="auto",
        help="communicator backend: auto (NCCL on CUDA, gloo on the CPU), gloo, nccl",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="this worker's place in the allocation's order; every generation sorts by it",
    )
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument(
        "--redis-outage-s",
        type=float,
        default=DEFAULT_OUTAGE_S,
        help="seconds of Redis outage (restart, loading its AOF) ridden out before failing",
    )
    # Optional knobs beyond the agent's contract (tests and benchmarks use them).
    p.add_argument("--step-log", default=None, help="append one JSON line per mini-batch here")
    p.add_argument(
        "--sync-timeout", type=float, default=30.0, help="seconds before a peer is dropped"
    )
    p.add_argument("--scale-lead-ms", type=float, default=500.0, help="T_a of the switch step")
    p.add_argument("--drop-stragglers", action="store_true", help="scale in detected stragglers")
    p.add_argument(
        "--straggler-rule",
        default=DEFAULT_RULE.spec(),
        help="slow in K of the last N mini-batches above R x the peers' time: K/N@R[/batch]; "
        "'paper' is EDL's 10 consecutive (10/10@1.2/batch)",
    )
    p.add_argument(
        "--slow-ms", type=float, default=0.0, help="inject a delay per mini-batch (tests)"
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="parameter and input precision (float64: bit-level comparisons in tests)",
    )
    return p


class WorkerArgumentError(ValueError):
    """A worker command line that cannot run."""


def parse_options(argv: list[str] | None = None) -> WorkerOptions:
    """Parse and check a worker command line; raise WorkerArgumentError on bad input."""
    ns = build_parser().parse_args(argv)
    try:
        raw: Any = json.loads(ns.args)
    except json.JSONDecodeError as exc:
        raise WorkerArgumentError(f"--args is not JSON: {exc.msg}") from exc
    try:
        args = validate_args(ns.workload, raw)
    except WorkloadArgumentError as exc:
        raise WorkerArgumentError(str(exc)) from exc
    _check(ns)
    return WorkerOptions(
        job_id=ns.job,
        worker_id=ns.worker,
        workload=ns.workload,
        args=args,
        batch_size=ns.batch_size,
        recovery=ns.recovery,
        store_url=ns.store_url,
        checkpoint_every=ns.checkpoint_every,
        checkpoint_minutes=ns.checkpoint_minutes,
        initial_world=ns.initial_world,
        device=ns.device,
        redis_url=ns.redis_url,
        max_steps=ns.max_steps,
        step_log=ns.step_log,
        sync_timeout_s=ns.sync_timeout,
        scale_lead_ms=ns.scale_lead_ms,
        drop_stragglers=ns.drop_stragglers,
        slow_ms=ns.slow_ms,
        dtype=ns.dtype,
        checkpoint_keep=ns.checkpoint_keep,
        checkpoint_min_seconds=ns.checkpoint_min_seconds,
        redis_outage_s=ns.redis_outage_s,
        straggler_rule=ns.straggler_rule,
        rank=ns.rank,
        comm=ns.comm,
    )


def _check(ns: Any) -> None:
    """The checks every worker's options pass, from a command line or from the environment."""
    if ns.batch_size < 1:
        raise WorkerArgumentError("--batch-size must be >= 1")
    if ns.checkpoint_every < 0:
        raise WorkerArgumentError("--checkpoint-every must be >= 0")
    if not ns.checkpoint_min_seconds >= 0:  # also refuses nan
        raise WorkerArgumentError("--checkpoint-min-seconds must be >= 0")
    if ns.checkpoint_keep < 1:
        raise WorkerArgumentError("--checkpoint-keep must be >= 1")
    if not ns.store_url or not ns.store_url.strip():
        raise WorkerArgumentError("--store-url must not be empty")
    if ns.rank is not None and not 0 <= ns.rank < 1_000_000:
        raise WorkerArgumentError("--rank must be within [0, 1000000)")
    if ns.initial_world is not None and ns.initial_world < 1:
        raise WorkerArgumentError("--initial-world must be >= 1")
    if not (0 <= ns.redis_outage_s <= MAX_OUTAGE_S):  # also refuses nan and inf
        raise WorkerArgumentError(f"--redis-outage-s must be within [0, {MAX_OUTAGE_S:.0f}]")
    try:
        parse_rule(ns.straggler_rule)
    except ValueError as exc:
        raise WorkerArgumentError(f"--straggler-rule: {exc}") from None
    if not ns.redis_url:
        raise WorkerArgumentError("no Redis: pass --redis-url or set REDIS_URL")
    if not (ns.device == "cpu" or ns.device.startswith("cuda")):
        raise WorkerArgumentError("--device must be cpu or cuda:K")
    communicator_backend(ns.device, ns.comm)
    for name in ("job", "worker"):
        value = getattr(ns, name)
        if not value or any(c in value for c in " :{}\n"):
            raise WorkerArgumentError(f"--{name} {value!r} is not a valid id")


OPTIONS_ENV = "EDL_OPTIONS"
"""The variable that hands a user program (``launcher: edl``) its worker options, as JSON."""


def options_to_env(options: WorkerOptions) -> str:
    """``options`` as the JSON value of ``OPTIONS_ENV`` (the agent's side of the contract)."""
    return json.dumps(dataclasses.asdict(options), sort_keys=True)


def options_from_env(environ: Mapping[str, str] | None = None) -> WorkerOptions:
    """The worker options the edl launcher put in ``OPTIONS_ENV``; raise WorkerArgumentError."""
    env = os.environ if environ is None else environ
    text = env.get(OPTIONS_ENV)
    if not text:
        raise WorkerArgumentError(
            f"{OPTIONS_ENV} is not set: run this program as a job with launcher 'edl'"
        )
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkerArgumentError(f"{OPTIONS_ENV} is not JSON: {exc.msg}") from None
    names = {f.name for f in dataclasses.fields(WorkerOptions)}
    if isinstance(raw, dict) and "checkpoint_dir" in raw and "store_url" not in raw:
        raw["store_url"] = raw.pop("checkpoint_dir")  # an agent from before the rename
    if not isinstance(raw, dict) or set(raw) - names:
        raise WorkerArgumentError(f"{OPTIONS_ENV} must be an object of the worker's options")
    try:
        options = WorkerOptions(**raw)
    except TypeError as exc:
        raise WorkerArgumentError(f"{OPTIONS_ENV}: {exc}") from None
    fields = dataclasses.asdict(options)
    _check(argparse.Namespace(**fields, job=options.job_id, worker=options.worker_id))
    return options
