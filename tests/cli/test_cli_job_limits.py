"""``submit --priority/--max-restarts/--max-runtime`` reach the API; ``get`` and ``ls`` show them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

import portalctl.cli as cli
from portalctl.client import Client
from portalctl.duration import format_duration, parse_duration

ENV = {"PORTAL_URL": "http://portal.test", "PORTAL_TOKEN": "t", "COLUMNS": "200"}

JOB = {
    "id": 7, "name": "train", "state": "queued", "tenant": "acme", "workload": "mlp-digits",
    "gpus": 2, "min_gpus": 2, "max_gpus": 2, "parallelism": 0, "priority": 80,
    "restarts": 1, "max_restarts": 3, "max_runtime_s": 5400, "runtime_deadline": None,
}  # fmt: skip


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every request portalctl makes, answered by a fake portal that knows job 7."""
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.url.path == "/api/v1/me/":
            return httpx.Response(200, json={"memberships": [{"tenant": "acme", "role": "owner"}]})
        if request.method == "POST" and request.url.path == "/api/v1/jobs/":
            return httpx.Response(201, json={**JOB, **json.loads(request.content)})
        if request.url.path == "/api/v1/jobs/7/":
            return httpx.Response(200, json=JOB)
        return httpx.Response(200, json={"count": 1, "next": None, "results": [JOB]})

    def fake(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli, "Client", fake)
    return requests


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=ENV)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7200", 7200), ("45s", 45), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
     (" 2H ", 7200)],
)  # fmt: skip
def test_parse_duration_forms(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0m", "-5", "2x", "h", "30m2h", "1h1h", "1.5h", "2 h"])
def test_parse_duration_refuses_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    assert format_duration(None) == ""
    for seconds in (1, 59, 60, 5400, 86400, 90061):
        assert parse_duration(format_duration(seconds)) == seconds
    assert format_duration(5400) == "1h30m"


def test_submit_sends_priority_restarts_and_runtime(sent: list[httpx.Request]) -> None:
    result = run("submit", "--workload", "mlp-digits", "--gpus", "2", "--priority", "80",
                 "--max-restarts", "3", "--max-runtime", "1h30m")  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(sent[-1].content)
    assert body["priority"] == 80 and body["max_restarts"] == 3 and body["max_runtime_s"] == 5400


def test_submit_without_the_flags_leaves_the_tenant_defaults(sent: list[httpx.Request]) -> None:
    assert run("submit", "--workload", "mlp-digits").exit_code == 0
    body = json.loads(sent[-1].content)
    assert not {"priority", "max_restarts", "max_runtime_s"} & set(body)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-runtime", "soon"], "not a duration: 'soon'"),
        (["--max-runtime", "0"], "at least one second"),
        (["--max-restarts", "-1"], "-1 is not in the range x>=0"),
        (["--priority", "101"], "101 is not in the range 0<=x<=100"),
    ],
)
def test_bad_limits_exit_2_and_send_nothing(
    sent: list[httpx.Request], args: list[str], message: str
) -> None:
    result = run("submit", "--workload", "mlp-digits", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert sent == []


def test_get_shows_restarts_and_limits(sent: list[httpx.Request]) -> None:
    result = run("get", "7")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.output.splitlines() if line}
    assert rows["restarts"] == ["1"] and rows["max_restarts"] == ["3"]
    assert rows["max_runtime_s"] == ["5400", "(1h30m)"]
    assert rows["priority"] == ["80"]


def test_ls_shows_restarts_and_limit_columns(sent: list[httpx.Request]) -> None:
    result = run("ls")
    assert result.exit_code == 0, result.output
    header, row = (line.split() for line in result.output.splitlines()[:2])
    cells: dict[str, Any] = dict(zip(header, row, strict=False))
    assert cells["PRIO"] == "80" and cells["RESTARTS"] == "1/3" and cells["LIMIT"] == "1h30m"
