"""``portalctl`` and a job's own requirements (issue 36): a job file's ``environment``,
``submit -r``, the bundle's requirements.txt packed with the code, and ``get`` showing them.

The first tests answer with a fake portal (the request portalctl sends is what they check);
the last ones speak to the real portal application in-process (``httpx.WSGITransport``), so
the client's fields and the server's rule meet, with no stack started.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

import portalctl.cli as cli
from bundles.models import CodeBundle
from jobs.models import Job
from portalctl.client import Client
from portalctl.jobfile import JobFileError, parse_job_file
from portalctl.packing import pack_directory
from tenancy.token_services import do_issue_token

BUNDLE = "ab" * 32
JOB = {
    "id": 7, "name": "train", "state": "queued", "tenant": "acme", "workload": "",
    "code": BUNDLE, "entrypoint": "train.py", "launcher": "torchrun", "gpus": 2,
    "min_gpus": 2, "max_gpus": 2, "parallelism": 0, "priority": 50, "restarts": 0,
    "max_restarts": 0, "max_runtime_s": None,
    "environment": {"requirements": ["einops==0.8.1", "tqdm>=4"], "python": "3.11",
                    "replace": []},
}  # fmt: skip


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every request portalctl makes, answered by a fake portal that knows job 7."""
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.method == "POST" and request.url.path == "/api/v1/jobs/":
            return httpx.Response(201, json={**JOB, **json.loads(request.content)})
        return httpx.Response(200, json=JOB)

    def fake(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli, "Client", fake)
    return requests


def run(*args: str, url: str = "http://portal.test", token: str = "t") -> Result:
    env = {"PORTAL_URL": url, "PORTAL_TOKEN": token, "COLUMNS": "200"}
    return CliRunner().invoke(cli.main, list(args), env=env)


def test_a_job_files_environment_is_passed_as_written() -> None:
    fields = parse_job_file(
        "name: t\nenvironment:\n  requirements: [einops==0.8.1, 'tqdm>=4']\n  python: '3.11'\n"
    )
    assert fields["environment"] == {"requirements": ["einops==0.8.1", "tqdm>=4"], "python": "3.11"}
    with pytest.raises(JobFileError, match="environment must be a mapping"):
        parse_job_file("environment: [einops]\n")


def test_submit_r_adds_requirements_to_the_environment(sent: list[httpx.Request]) -> None:
    result = run("submit", "--code", BUNDLE, "--entrypoint", "train.py", "--launcher", "torchrun",
                 "-r", "einops==0.8.1", "--requirement", "tqdm>=4")  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(sent[-1].content)
    assert body["environment"] == {"requirements": ["einops==0.8.1", "tqdm>=4"]}


def test_submit_r_comes_after_the_job_files_requirements(
    sent: list[httpx.Request], tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"name: t\ncode: '{BUNDLE}'\nentrypoint: train.py\nlauncher: torchrun\n"
        "environment: {requirements: [einops], python: '3.11', replace: [numpy]}\n"
    )
    result = run("submit", "-f", str(job_file), "-r", "tqdm>=4")
    assert result.exit_code == 0, result.output
    body = json.loads(sent[-1].content)
    assert body["environment"] == {
        "requirements": ["einops", "tqdm>=4"],
        "python": "3.11",
        "replace": ["numpy"],
    }


def test_submit_without_r_sends_no_environment(sent: list[httpx.Request]) -> None:
    assert run("submit", "--workload", "mlp-digits").exit_code == 0
    assert "environment" not in json.loads(sent[-1].content)


def test_r_with_a_job_file_whose_requirements_are_not_a_list_is_a_usage_error(
    sent: list[httpx.Request], tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"code: '{BUNDLE}'\nentrypoint: train.py\nenvironment: {{requirements: x}}\n"
    )
    result = run("submit", "-f", str(job_file), "-r", "tqdm")
    assert result.exit_code == 2 and "must be a list" in result.output
    assert sent == []


def test_get_shows_the_requirements_on_one_line(sent: list[httpx.Request]) -> None:
    result = run("get", "7")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split(None, 1)[1] for line in result.output.splitlines() if line}
    assert rows["environment"].strip() == "einops==0.8.1 tqdm>=4 (python 3.11)"


def test_packing_takes_requirements_txt_and_pyproject_toml(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import einops\n")
    (tmp_path / "requirements.txt").write_text("einops==0.8.1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = []\n")
    packed = pack_directory(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["pyproject.toml", "requirements.txt", "train.py"]


# ------------------------------------------------------- against the real portal application


@pytest.fixture
def portal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: Any, db: None
) -> Iterator[Callable[[Any], str]]:
    """portalctl's requests served by the portal's own WSGI app; gives a user's token."""
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"
    app = get_wsgi_application()

    def real(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.WSGITransport(app=app))

    monkeypatch.setattr(cli, "Client", real)
    # As Django's test client does: a request's end must not close the test's connection
    # (its transaction holds the test's rows; on PostgreSQL the next query would fail).
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield lambda user: do_issue_token(user=user)
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


def test_submit_dir_uploads_its_requirements_and_get_shows_the_jobs(
    portal: Callable[[Any], str], alice: Any, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import einops, tqdm\n")
    (project / "requirements.txt").write_text("einops==0.8.1\n")
    token = portal(alice)
    result = run("-o", "json", "submit", "--code", str(project), "--entrypoint", "train.py",
                 "--launcher", "torchrun", "--gpus", "2", "-r", "tqdm >= 4",
                 url="http://testserver", token=token)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 requirements" in result.output  # the upload line on stderr
    bundle = CodeBundle.objects.get()
    assert bundle.requirements == ["einops==0.8.1"]
    job = Job.objects.get()
    assert job.code == bundle
    assert job.environment == {"requirements": ["tqdm>=4"], "python": None, "replace": []}
    shown = run("get", str(job.pk), url="http://testserver", token=token)
    assert shown.exit_code == 0, shown.output
    assert "tqdm>=4" in shown.output


def test_a_refused_requirement_exits_4_with_the_field_and_submits_nothing(
    portal: Callable[[Any], str], alice: Any, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("pass\n")
    result = run("submit", "--code", str(project), "--entrypoint", "train.py",
                 "--launcher", "torchrun", "-r", "--extra-index-url=https://evil.example/",
                 url="http://testserver", token=portal(alice))  # fmt: skip
    assert result.exit_code == 4, result.output
    assert "environment.requirements" in result.output and "not allowed" in result.output
    assert not Job.objects.exists()


def test_get_says_what_the_job_last_started_in() -> None:
    environment_used_text = cli.environment_used_text
    used = {"environment": "3f2a9c1e07b4" + "0" * 20, "hit": False, "build_s": 2.14,
            "packages": ["einops==0.8.1", "tabulate==0.9.0"], "node": "node-0"}  # fmt: skip
    assert environment_used_text(used) == (
        "3f2a9c1e07b4 on node-0: built in 2.1 s; einops==0.8.1 tabulate==0.9.0"
    )
    assert environment_used_text({**used, "hit": True, "packages": []}) == (
        "3f2a9c1e07b4 on node-0: cache hit; nothing beyond the base"
    )
    assert environment_used_text({}) == "" and environment_used_text("junk") == ""
