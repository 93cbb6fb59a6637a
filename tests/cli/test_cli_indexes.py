"""``portalctl`` and a job's own package indexes: ``submit --index`` (after a job file's
``environment.indexes``), ``get`` showing them, and the portal's answer whether its
operator allows them (ENVIRONMENT_ALLOW_JOB_INDEX) or not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.models import Job
from portalctl.cli import environment_text
from portalctl.jobfile import parse_job_file
from tests.cli.test_cli_environment import BUNDLE, JOB, portal, run, sent

__all__ = ["portal", "sent"]  # fixtures, used by name

INDEX = "https://pypi.example.org/simple"
OTHER = "https://wheels.example.com/simple"


def test_a_job_files_indexes_are_passed_as_written() -> None:
    fields = parse_job_file(f"name: t\nenvironment:\n  indexes: [{INDEX}]\n")
    assert fields["environment"] == {"indexes": [INDEX]}


def test_submit_index_is_repeatable_and_comes_after_the_job_files(
    sent: list[httpx.Request], tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"name: t\ncode: '{BUNDLE}'\nentrypoint: train.py\nlauncher: torchrun\n"
        f"environment: {{requirements: [einops], indexes: ['{INDEX}']}}\n"
    )
    result = run("submit", "-f", str(job_file), "--index", OTHER)
    assert result.exit_code == 0, result.output
    assert json.loads(sent[-1].content)["environment"] == {
        "requirements": ["einops"],
        "indexes": [INDEX, OTHER],
    }
    result = run("submit", "--code", BUNDLE, "--entrypoint", "train.py", "--launcher", "torchrun",
                 "--index", INDEX, "--index", OTHER)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(sent[-1].content)["environment"] == {"indexes": [INDEX, OTHER]}


def test_get_shows_the_jobs_indexes(sent: list[httpx.Request]) -> None:
    assert environment_text({**JOB["environment"], "indexes": [INDEX]}) == (
        f"einops==0.8.1 tqdm>=4 (python 3.11; index {INDEX})"
    )
    assert environment_text({"requirements": [], "indexes": [INDEX, OTHER]}) == (
        f"(indexes {INDEX}, {OTHER})"
    )
    assert environment_text(JOB["environment"]) == "einops==0.8.1 tqdm>=4 (python 3.11)"


def submit_with_index(tmp_path: Path, token: str, url: str = INDEX) -> Any:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text("import einops\n")
    return run("submit", "--code", str(project), "--entrypoint", "train.py",
               "--launcher", "torchrun", "-r", "einops", "--index", url,
               url="http://testserver", token=token)  # fmt: skip


def test_where_the_operator_does_not_allow_it_submit_exits_4_naming_the_setting(
    portal: Callable[[Any], str], alice: Any, tmp_path: Path, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = False
    result = submit_with_index(tmp_path, portal(alice))
    assert result.exit_code == 4, result.output
    assert "environment.indexes" in result.output
    assert "ENVIRONMENT_ALLOW_JOB_INDEX" in result.output
    assert not Job.objects.exists()


def test_a_credential_in_the_url_is_refused_and_not_echoed(
    portal: Callable[[Any], str], alice: Any, tmp_path: Path, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = True
    result = submit_with_index(tmp_path, portal(alice), "https://me:s3cret@pypi.example.org/x")
    assert result.exit_code == 4, result.output
    assert "credentials" in result.output and "s3cret" not in result.output
    assert not Job.objects.exists()


def test_where_the_operator_allows_it_the_index_is_stored_and_get_shows_it(
    portal: Callable[[Any], str], alice: Any, tmp_path: Path, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = True
    token = portal(alice)
    result = submit_with_index(tmp_path, token)
    assert result.exit_code == 0, result.output
    job = Job.objects.get()
    assert job.environment["indexes"] == [INDEX]
    shown = run("get", str(job.pk), url="http://testserver", token=token)
    assert shown.exit_code == 0, shown.output
    assert f"einops (index {INDEX})" in shown.output


@pytest.mark.parametrize("flag", ["--index"])
def test_submit_help_names_the_flag(flag: str) -> None:
    result = run("submit", "--help")
    assert flag in result.output and "credentials" in result.output
