"""edl: the elastic SDK, the public face of ``workers.elastic`` for training programs.

A program written against it runs as a job with ``launcher: "edl"`` and is
resized without stopping: workers join at an agreed future step and receive
the model from a running peer, leavers go at a step, a failed peer is dropped
and the job recovers in place.  The whole surface::

    import edl

    def main(ctx: edl.Context) -> None:
        model, optimizer, data = build()           # runs while ctx joins the job
        ctx.attach(model, optimizer, edl.ElasticSampler(len(data), ctx.batch_size), steps)
        for batch in ctx.steps():                  # this worker's share of one global batch
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch.indices]), y[batch.indices], reduction="sum")
            loss.backward()
            if not ctx.sync_gradients(loss.item(), len(batch.indices)):
                continue                           # a peer failed: recovered, redo the step
            optimizer.step()
            ctx.notify_batch_end()                 # report, checkpoint, switch or leave

    edl.run(main)

``ctx.rank``, ``ctx.world``, ``ctx.generation``, ``ctx.device``, ``ctx.step``,
``ctx.batch_size`` and ``ctx.store_url`` (the job's store; ``ctx.checkpoint_dir``
is its earlier name) describe the worker now.  The runtime checkpoints the
model and optimizer it was given into the job's store and restores the newest
checkpoint that verifies when the job restarts, on whatever nodes.  What else a
program hands the job::

    stored = ctx.save_artifact("/tmp/model.pt", name="model.pt")   # -> edl.StoredObject
    ctx.log_metrics(ctx.step, accuracy=0.93, **{"val/loss": 0.21})  # rank 0's, once a second

The user guide is ``docs/user-guide.md``.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from workers.artifacts import StoredObject
from workers.elastic.cli import WorkerArgumentError, options_from_env
from workers.elastic.constants import ElasticError
from workers.elastic.context import Batch, ElasticContext
from workers.elastic.runtime import Main, run_elastic
from workers.elastic.sampler import ElasticSampler

__version__ = "1.1.0"
"""The SDK's version: the major number changes when a program would need changing."""

Context = ElasticContext
"""The worker's view of the job and the hooks of its loop."""

__all__ = [
    "Batch",
    "Context",
    "ElasticError",
    "ElasticSampler",
    "Main",
    "StoredObject",
    "__version__",
    "exit_code",
    "run",
]


def exit_code(main: Main) -> int:
    """Run ``main`` as one worker of the job the launcher described; return the exit status.

    2 when the program was not started by the edl launcher (``EDL_OPTIONS``
    missing or malformed), 1 when training failed, 0 when it finished or this
    worker was asked to leave.
    """
    try:
        options = options_from_env()
    except WorkerArgumentError as exc:
        sys.stderr.write(f"edl: {exc}\n")
        return 2
    return run_elastic(options, main)


def run(main: Main) -> NoReturn:
    """Run ``main`` as one worker of the job, then end the process with its exit status.

    Ends with ``os._exit``: tearing down live communicators and the runtime's
    background threads in interpreter shutdown can abort a process whose
    training already ended cleanly.
    """
    code = exit_code(main)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
