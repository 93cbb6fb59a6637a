"""The control plane's policy: the one the settings name, with the settings' class ageing.

The tick and the forecast both take their policy from here, so a prediction
follows the same rules as the decisions it predicts.
"""

from __future__ import annotations

from django.conf import settings

from scheduler.policies import Policy, get_policy


def live_policy(name: str | None = None) -> Policy:
    """``name`` (default ``SCHEDULER_POLICY``) with ``CLASS_AGEING_SECONDS`` (0: no ageing)."""
    policy = get_policy(name or settings.SCHEDULER_POLICY)
    ageing = float(settings.CLASS_AGEING_SECONDS)
    policy.class_ageing_s = ageing if ageing > 0 else None
    return policy
