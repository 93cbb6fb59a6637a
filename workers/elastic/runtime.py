"""Running one elastic worker: a program's ``main(ctx)`` inside an elastic context.

The one way to write a training program, for the built-in workloads and for
tenants' own (``edl.run``): the program gets an ``ElasticContext``, prepares
its model while the context joins the job in the background, attaches, and
loops over ``ctx.steps()``.  ``run_elastic`` owns what surrounds that: threads,
reporting a failure to the job, the exit status.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F

from workers import workloads
from workers.elastic import phases
from workers.elastic.cli import WorkerOptions
from workers.elastic.constants import ElasticError, JobEnded, log
from workers.elastic.context import ElasticContext
from workers.elastic.sampler import ElasticSampler

Main = Callable[[ElasticContext], None]
"""A training program: everything after ``ctx = ElasticContext(...)``."""


def run_elastic(options: WorkerOptions, main: Main) -> int:
    """Run ``main`` as one worker of the job; return the process exit status (0 or 1)."""
    if options.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ctx = ElasticContext(options)  # the background thread registers from here on
    try:
        main(ctx)
    except JobEnded as exc:  # a late joiner: the job finished without it, nothing failed
        log(options.worker_id, f"exit ({exc})")
        return 0
    except Exception as exc:
        if ctx.left_behind():  # the job finished while this newcomer was joining it
            log(options.worker_id, f"exit (the job ended before this worker could join it: {exc})")
            return 0
        if isinstance(exc, ElasticError):
            log(options.worker_id, f"error: {exc}")
            ctx.fail(str(exc))
            return 1
        traceback.print_exc()  # the program's own bug: say what, and tell the job
        ctx.fail(f"{type(exc).__name__}: {exc}"[:500])
        return 1
    log(options.worker_id, f"exit ({ctx.exit_reason}) at step {ctx.step}")
    return 0


def run_worker(options: WorkerOptions, prepared: workloads.Prepared | None = None) -> int:
    """Run the job's named built-in workload elastically; return the process exit status.

    ``prepared``: the workload already built for exactly these options (a warm
    process, ``warm.py``); its weights are replaced by the job's state anyway.
    """
    return run_elastic(options, lambda ctx: builtin_main(ctx, options, prepared))


def builtin_main(
    ctx: ElasticContext, options: WorkerOptions, prepared: workloads.Prepared | None = None
) -> None:
    """A built-in workload (``workers/workloads``), written as any SDK program is."""
    if prepared is None:
        prepared = prepare_builtin(options.workload, options.args, options.device, options.dtype)
    phases.mark("prepared")
    dtype = getattr(torch, options.dtype)
    sampler = ElasticSampler(prepared.num_samples, ctx.batch_size, prepared.seed)
    ctx.attach(
        prepared.model,
        prepared.optimizer,
        sampler,
        prepared.total_steps_for(ctx.batch_size),
    )
    train(ctx, prepared, dtype)


def prepare_builtin(
    workload: str, args: dict[str, int | float], device: str, dtype: str
) -> workloads.Prepared:
    """Build a built-in workload's model, optimizer and data on ``device`` in ``dtype``."""
    prepared = workloads.prepare(workload, args, torch.device(device))
    prepared.model.to(getattr(torch, dtype))  # in place: the optimizer keeps the same parameters
    return prepared


def train(ctx: ElasticContext, prepared: workloads.Prepared, dtype: torch.dtype) -> None:
    """The ordinary PyTorch loop, wrapped by the elastic context."""
    model, optimizer = prepared.model, prepared.optimizer
    model.train()
    for batch in ctx.steps():
        optimizer.zero_grad(set_to_none=False)
        loss_sum = 0.0
        if len(batch.indices):
            x, y = prepared.batch(batch.indices)
            if x.is_floating_point():
                x = x.to(dtype)
            loss = F.cross_entropy(model(x), y, reduction="sum")
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum = float(loss.item())
        if not ctx.sync_gradients(loss_sum, len(batch.indices)):
            continue
        optimizer.step()
        ctx.notify_batch_end()
