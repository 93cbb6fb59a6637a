"""``portalctl`` against the real portal application in this process, for the workflow
commands' tests (``tests/cli/test_cli_arrays.py``, ``tests/jobs/test_sweep_cli.py``).

The command line's requests go through httpx into the Django application (the real URLs,
token authentication, serializers and services), so what they create is in the database.
A test module imports the fixtures by name (``store`` is autouse there once imported).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from django.core.wsgi import get_wsgi_application

import portalctl.cli as cli
from portalctl.client import Client
from tenancy.token_services import do_issue_token


@pytest.fixture(autouse=True)
def store(tmp_path: Any, settings: Any) -> None:
    """The artifacts (code bundles, checkpoints) under the test's tmp_path; any host served."""
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"
    settings.ALLOWED_HOSTS = ["*"]


@pytest.fixture
def env(alice: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """portalctl configured with alice's token, its client talking to this process's portal."""
    transport = httpx.WSGITransport(app=get_wsgi_application())

    def real(url: str, token: str) -> Client:
        return Client(url, token, transport=transport)

    monkeypatch.setattr(cli, "Client", real)
    return {"PORTAL_URL": "http://portal.test", "PORTAL_TOKEN": do_issue_token(user=alice),
            "COLUMNS": "200"}  # fmt: skip


def run(env: dict[str, str], *args: str) -> Result:
    """``portalctl *args`` with ``env``; its exit code and output."""
    return CliRunner().invoke(cli.main, list(args), env=env)
