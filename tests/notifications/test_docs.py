"""The verification snippet of docs/notifications.md, run against a real signed delivery."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from notifications.models import Subscription
from notifications.services import do_attempt_delivery, do_send_test_event
from tests.notifications.receiver import Receiver

DOC = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def snippet() -> Callable[..., bool]:
    """``verify_signature`` as the documentation defines it (the one Python block there)."""
    [code] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    verify_signature: Callable[..., bool] = namespace["verify_signature"]
    return verify_signature


@pytest.mark.django_db
def test_the_documented_snippet_verifies_a_real_delivery(
    alice: Any, subscribe: Callable[..., Subscription], receiver: Receiver
) -> None:
    verify_signature = snippet()
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    delivery = do_send_test_event(subscription=sub, now=timezone.now())
    assert do_attempt_delivery(delivery_id=delivery.pk, now=timezone.now())
    [request] = receiver.requests
    assert verify_signature(sub.secret, request.headers, request.body)
    assert not verify_signature(sub.secret, request.headers, request.body + b" ")
    assert not verify_signature("wrong", request.headers, request.body)
    assert not verify_signature(sub.secret, request.headers, request.body, now=time.time() + 3600)
    assert not verify_signature(sub.secret, {}, request.body)
