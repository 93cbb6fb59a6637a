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
