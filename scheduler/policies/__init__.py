"""Scheduling policies by name: ``get_policy("tiresias", thresholds=(3250, 7200))``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.policies.fifo import FifoPolicy
from scheduler.policies.srtf import SrtfPolicy
from scheduler.policies.tiresias import TiresiasPolicy


def _dlas(**params: Any) -> Policy:
    return TiresiasPolicy(by_gpu_time=False, **params)


def _elastic(**params: Any) -> Policy:
    from scheduler.policies.elastic import ElasticTiresiasPolicy

    return ElasticTiresiasPolicy(**params)


#: Every policy name the CLI and the control plane accept.
REGISTRY: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "srtf": SrtfPolicy,
    "tiresias": TiresiasPolicy,
    "dlas": _dlas,
    "elastic-tiresias": _elastic,
}


def get_policy(name: str, **params: Any) -> Policy:
    """A policy instance by registry name; unknown names raise ValueError with the choices."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose {', '.join(REGISTRY)})") from None
    return factory(**params)


__all__ = ["REGISTRY", "Plan", "Policy", "PolicyCore", "get_policy"]
