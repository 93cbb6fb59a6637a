"""Usage errors are caught before any request: exit code 2 and a line that says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from portalctl.cli import main

DEAD = {"PORTAL_URL": "http://127.0.0.1:9", "PORTAL_TOKEN": "t"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["submit", "--gpus", "1"], "give --code"),
        (["submit", "--workload", "mlp-digits", "--env", "NOEQUALS"], "is not K=V"),
        (["submit", "--code", "no/such/dir", "--entrypoint", "x.py"], "neither a directory"),
        (["submit", "--workload", "w", "--launcher", "mpi"], "'mpi' is not one of"),
        (["scale", "1"], "give --min, --max or --priority"),
        (["get", "one"], "'one' is not a valid integer"),
    ],
)
def test_a_usage_error_exits_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args, env=DEAD)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_an_unknown_key_in_a_job_file_is_named(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nworkload: mlp-digits\ngpu: 2\n")
    result = CliRunner().invoke(main, ["submit", "-f", str(job)], env=DEAD)
    assert result.exit_code == 2
    assert "unknown key(s) gpu" in result.output


def test_no_configuration_says_how_to_log_in(tmp_path: Path) -> None:
    env = {"PORTAL_URL": "", "PORTAL_TOKEN": "", "XDG_CONFIG_HOME": str(tmp_path)}
    result = CliRunner().invoke(main, ["ls"], env=env)
    assert result.exit_code == 2 and "portalctl login" in result.output


def test_ls_shows_your_tenants_jobs_unless_asked_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """An admin sees every tenant's jobs through the API; ``ls`` keeps to theirs by default."""
    import json

    import httpx

    import portalctl.cli as cli
    from portalctl.client import Client

    jobs = [
        {"id": 1, "name": "mine", "state": "running", "tenant": "acme"},
        {"id": 2, "name": "theirs", "state": "running", "tenant": "globex"},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/me/":
            memberships = [{"tenant": "acme", "role": "owner"}]
            return httpx.Response(200, json={"is_admin": True, "memberships": memberships})
        return httpx.Response(200, json={"count": 2, "next": None, "results": jobs})

    def fake(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli, "Client", fake)
    env = {"PORTAL_URL": "http://portal.test", "PORTAL_TOKEN": "t"}
    mine = CliRunner().invoke(main, ["-o", "json", "ls"], env=env)
    assert mine.exit_code == 0, mine.output
    assert [job["id"] for job in json.loads(mine.output)] == [1]
    every = CliRunner().invoke(main, ["-o", "json", "ls", "--all-tenants"], env=env)
    assert [job["id"] for job in json.loads(every.output)] == [1, 2]
