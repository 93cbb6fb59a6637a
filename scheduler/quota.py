"""Tenant quotas over one tick's decisions (pure).

A tenant's jobs may hold at most its quota of GPUs at once, counting each
job's requested share; GPUs a job holds above its request are idle extras the
policy reclaims first, so they do not count.  The policy does not know quotas,
so its starts and growth are checked here, in its order, before binding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.types import Decision, JobView, Preempt, Start


@dataclass
class QuotaBook:
    """Quota and requested-share use of each tenant (by slug) at the snapshot."""

    quota: dict[str, int] = field(default_factory=dict)
    in_use: dict[str, int] = field(default_factory=dict)


def enforce_quotas(
    decisions: Sequence[Decision], views: Mapping[str, JobView], book: QuotaBook
) -> tuple[list[Decision], dict[str, str]]:
    """Keep the decisions that fit their tenant's quota; say why the others were dropped."""
    in_use = dict(book.in_use)
    for decision in decisions:  # releases first: their shares are free for the starts
        view = views.get(decision.job)
        if view is not None and view.gpus and isinstance(decision, Preempt):
            share = min(len(view.gpus), view.requested_gpus)
            in_use[view.tenant] = in_use.get(view.tenant, 0) - share
    kept: list[Decision] = []
    dropped: dict[str, str] = {}
    for decision in decisions:
        view = views.get(decision.job)
        if view is None or not isinstance(decision, Start):
            kept.append(decision)
            continue
        share = min(len(decision.gpus), view.requested_gpus)
        quota = book.quota.get(view.tenant, 0)
        used = in_use.get(view.tenant, 0)
        if used + share > quota:
            dropped[decision.job] = f"tenant {view.tenant} holds {used} of its {quota}-GPU quota"
            continue
        in_use[view.tenant] = used + share
        kept.append(decision)
    return kept, dropped
