"""Schemathesis against the OpenAPI schema, in-process: no 5xx, no undocumented status.

Every operation of ``/api/schema/`` gets ``EXAMPLES_PER_OPERATION`` generated
requests (valid and invalid: schemathesis mixes both), sent through Django's
real WSGI stack on the test database, authenticated with an API token of a
user whose own tenant has a GPU quota of 0, so nothing it submits is ever
scheduled. A response of 5xx, or with a status the operation does not
document, fails the test with schemathesis's reproduction (a curl command).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tenancy.services import do_create_tenant
from tenancy.token_services import do_issue_token

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

EXAMPLES_PER_OPERATION = 25
"""Bounded so the whole run stays well under two minutes on an idle 2-core machine."""

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def wsgi_app() -> Iterator[WSGIHandler]:
    """Django's WSGI application, keeping the test's connection (and its transaction) open.

    Each request would otherwise close the connection at its end (as Django's
    own test client avoids the same way), losing the test's transaction.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def quota_zero_token(db: None) -> str:
    """An API token of the owner of a fresh tenant with no GPUs: nothing it submits runs."""
    do_create_tenant(
        slug="fuzz", owner_username="fuzz-owner", password="pw-fuzz-owner-1", gpu_quota=0
    )
    return do_issue_token(user=get_user_model().objects.get(username="fuzz-owner"))


def _check_operation(
    operation: Any, app: WSGIHandler, headers: dict[str, str], seen: Counter[int]
) -> None:
    """Valid and invalid requests to one operation (schemathesis's two generation modes)."""
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,  # no example replay between runs: the same budget every time
        derandomize=True,  # the same examples every run: a failure reproduces
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call(app=app, headers=headers)
        seen[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    run()


def test_no_server_error_and_only_documented_statuses(
    wsgi_app: WSGIHandler, quota_zero_token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)
    headers = {"Authorization": f"Token {quota_zero_token}"}
    started = time.monotonic()
    operations = 0
    seen: Counter[int] = Counter()
    for result in schema.get_all_operations():
        _check_operation(result.ok(), wsgi_app, headers, seen)
        operations += 1
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(  # noqa: T201 - the brief asks for the run's time in the test output
            f"\nschemathesis: {operations} operations x {EXAMPLES_PER_OPERATION} examples "
            f"in {elapsed:.1f} s; statuses {dict(sorted(seen.items()))}"
        )
    assert operations >= 15
    assert seen[200] and seen[400] and seen[404], seen  # the token works; bad input was sent
