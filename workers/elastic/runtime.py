"""One worker process: join the job, prepare the workload, train until done or told to leave."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from workers import workloads
from workers.elastic.cli import WorkerOptions
from workers.elastic.constants import ElasticError, log
from workers.elastic.context import ElasticContext
from workers.elastic.sampler import ElasticSampler


def run_worker(options: WorkerOptions) -> int:
    """Run the job's named workload elastically; return the process exit status."""
    if options.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ctx = ElasticContext(options)  # the background thread registers from here on
    try:
        prepared = workloads.prepare(options.workload, options.args, ctx.device)
        dtype = getattr(torch, options.dtype)
        prepared.model.to(dtype)  # in place: the optimizer keeps the same parameters
        sampler = ElasticSampler(prepared.num_samples, options.batch_size, prepared.seed)
        ctx.attach(
            prepared.model,
            prepared.optimizer,
            sampler,
            prepared.total_steps_for(options.batch_size),
        )
        train(ctx, prepared, dtype)
    except ElasticError as exc:
        log(options.worker_id, f"error: {exc}")
        ctx.fail(str(exc))
        return 1
    log(options.worker_id, f"exit ({ctx.exit_reason}) at step {ctx.step}")
    return 0


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
