"""End to end: the real ``portalctl`` (subprocesses) against a real running portal.

The session's stack (``manage.py runstack``, ``tests/conftest.py``; the REST API tests
of ``tests/test_e2e.py`` use it after these), a tenant ``e2e`` with owner ``eve`` and
her token; every check
runs the command line as a user would, configured by PORTAL_URL/PORTAL_TOKEN
or by ``portalctl login``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devtools.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
pytestmark = [pytest.mark.stack, pytest.mark.slow]


@pytest.fixture(scope="module")
def portal(stack: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's running portal (``tests/conftest.py``), its URL and eve's token."""
    return {
        "url": stack["url"],
        "token": stack["token"],
        "tmp": tmp_path_factory.mktemp("cli"),
        "manage": stack["manage"],
    }


def portalctl(
    portal: dict[str, Any],
    *args: str,
    token: str | None = None,
    url: str | None = None,
    timeout: float = 180,
    stdin: str | None = None,
    config_home: Path | None = None,
    configured: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run the command line as a user does (a fresh process, configured by the environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_"))}
    env["XDG_CONFIG_HOME"] = str(config_home or portal["tmp"] / "no-config")
    if configured:
        env["PORTAL_URL"] = url or portal["url"]
        env["PORTAL_TOKEN"] = token or portal["token"]
    return subprocess.run(
        [sys.executable, "-m", "portalctl", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_submit_a_directory_and_follow_it_to_completion(portal: dict[str, Any]) -> None:
    done = portalctl(
        portal,
        "submit", "--code", str(EXAMPLES / "torchrun-ddp"), "--entrypoint", "train.py --epochs 2",
        "--launcher", "torchrun", "--gpus", "2", "--follow",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"rank {rank} of 2: done" in done.stdout
    assert "uploaded" in done.stderr and "completed" in done.stderr
    # The same code again: the server has its id, nothing is sent.
    again = portalctl(
        portal, "submit", "--code", str(EXAMPLES / "torchrun-ddp"), "--entrypoint", "train.py",
        "--launcher", "torchrun", "--gpus", "1", "-o", "json",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "already on the server" in again.stderr
    job = json.loads(again.stdout)
    assert job["state"] in ("pending", "queued") and len(job["code"]) == 64
    assert portalctl(portal, "cancel", str(job["id"])).returncode == 0


def test_a_failing_program_exits_1(portal: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text("print('about to fail', flush=True)\nraise SystemExit(3)\n")
    done = portalctl(
        portal, "submit", "--code", str(tmp_path), "--entrypoint", "fail.py",
        "--launcher", "torchrun", "--gpus", "1", "--follow",
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "about to fail" in done.stdout
    assert "failed" in done.stderr


def test_ls_json_and_download_of_the_final_checkpoint(
    portal: dict[str, Any], tmp_path: Path
) -> None:
    done = portalctl(
        portal, "submit", "--workload", "mlp-digits", "--gpus", "1", "--arg", "epochs=2",
        "--name", "digits", "--wait",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = portalctl(portal, "ls", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    digits = next(job for job in jobs if job["name"] == "digits")
    assert digits["state"] == "completed"
    table = portalctl(portal, "artifacts", str(digits["id"]))
    assert table.returncode == 0 and "final" in table.stdout
    target = tmp_path / "final.pt"
    got = portalctl(portal, "download", str(digits["id"]), "-o", str(target), "--format", "json")
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == report["sha256"]
    assert target.stat().st_size == report["size"] > 0
    # The other views of the same job, for people and for machines.
    job_id = str(digits["id"])
    assert "completed" in portalctl(portal, "get", job_id).stdout
    history = json.loads(portalctl(portal, "events", job_id, "-o", "json").stdout)
    assert history[0]["kind"] == "submitted" and history[-1]["to_state"] == "completed"
    assert "completed" in portalctl(portal, "events", job_id).stdout
    tail = json.loads(portalctl(portal, "logs", job_id, "--tail", "3", "-o", "json").stdout)
    assert 0 < len(tail) <= 3 and all("text" in line for line in tail)
    followed = portalctl(portal, "logs", job_id, "-f", "--tail", "2")
    assert followed.returncode == 0 and len(followed.stdout.splitlines()) == 2
    snapshot = json.loads(portalctl(portal, "top", "-o", "json").stdout)
    assert [t["slug"] for t in snapshot["tenants"]] == ["e2e"]
    assert "e2e" in portalctl(portal, "top", "--once").stdout


def test_cancel_ends_a_waiting_submit_with_exit_3(portal: dict[str, Any]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(PORTAL_URL=portal["url"], PORTAL_TOKEN=portal["token"])
    waiting = subprocess.Popen(
        [sys.executable, "-m", "portalctl", "submit", "--workload", "mlp-digits", "--gpus", "1",
         "--arg", "epochs=5000", "--name", "long", "--wait", "-o", "json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        job_id = None
        deadline = time.monotonic() + 60
        while job_id is None and time.monotonic() < deadline:
            listed = json.loads(portalctl(portal, "ls", "--state", "pending,queued,running",
                                          "-o", "json").stdout)  # fmt: skip
            job_id = next((job["id"] for job in listed if job["name"] == "long"), None)
            if job_id is None:
                time.sleep(1)
        assert job_id is not None
        scaled = portalctl(portal, "scale", str(job_id), "--min", "1", "--max", "2", "-o", "json")
        assert scaled.returncode == 0, scaled.stderr
        assert (json.loads(scaled.stdout)["min_gpus"], json.loads(scaled.stdout)["max_gpus"]) == (
            1,
            2,
        )
        cancelled = portalctl(portal, "cancel", str(job_id))
        assert cancelled.returncode == 0, cancelled.stderr
        stdout, stderr = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    assert waiting.returncode == 3, stderr
    assert json.loads(stdout)["state"] == "cancelled"


def test_a_wrong_token_a_dead_url_and_no_configuration_are_one_clear_line(
    portal: dict[str, Any],
) -> None:
    wrong = portalctl(portal, "ls", token="not-a-token")
    assert wrong.returncode == 4
    # One line with the server's message (DRF's "Invalid token." today), nothing on stdout.
    assert wrong.stdout == "" and len(wrong.stderr.strip().splitlines()) == 1
    assert wrong.stderr.startswith("portalctl: ") and "token" in wrong.stderr.lower()
    dead = portalctl(portal, "ls", url=f"http://127.0.0.1:{free_port()}")
    assert dead.returncode == 5 and len(dead.stderr.strip().splitlines()) == 1
    assert "cannot reach the portal" in dead.stderr and "Traceback" not in dead.stderr
    missing = portalctl(portal, "get", "999999")
    assert missing.returncode == 4 and missing.stderr.strip() == "portalctl: Not found."
    bad = portalctl(portal, "submit", "--workload", "mlp-digits", "--gpus", "999")
    assert bad.returncode == 4 and "gpus" in bad.stderr


def test_a_read_only_token_reads_and_an_expired_token_is_refused_by_name(
    portal: dict[str, Any],
) -> None:
    manage = portal["manage"]
    reader = manage("issuetoken", "eve", "--name", "dashboards", "--scope", "read")
    listed = portalctl(portal, "-o", "json", "ls", token=reader)
    assert listed.returncode == 0, listed.stderr
    json.loads(listed.stdout)
    refused = portalctl(portal, "submit", "--workload", "mlp-digits", "--gpus", "1", token=reader)
    assert refused.returncode == 4 and refused.stdout == ""
    assert refused.stderr.strip() == "portalctl: this token is read-only"
    old = manage("issuetoken", "eve", "--name", "old", "--expires-in", "1")
    manage(
        "shell",
        "-c",
        "from datetime import timedelta; from django.utils import timezone; "
        "from tenancy.models import ApiToken; "
        "ApiToken.objects.filter(name='old').update("
        "expires_at=timezone.now() - timedelta(days=1))",
    )
    expired = portalctl(portal, "ls", token=old)
    assert expired.returncode == 4 and expired.stdout == ""
    assert expired.stderr.startswith("portalctl: token expired on "), expired.stderr


def test_login_stores_the_token_privately_and_later_commands_use_it(
    portal: dict[str, Any], tmp_path: Path
) -> None:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return portalctl(portal, *args, stdin=stdin, config_home=tmp_path, configured=False)

    unconfigured = run("ls")
    assert unconfigured.returncode == 2 and "portalctl login" in unconfigured.stderr
    login = run("login", "--url", portal["url"], stdin=portal["token"] + "\n")
    assert login.returncode == 0, login.stderr
    config = tmp_path / "portalctl" / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text()) == {"url": portal["url"], "token": portal["token"]}
    listed = run("-o", "json", "ls")
    assert listed.returncode == 0 and isinstance(json.loads(listed.stdout), list)
    refused = run("login", "--url", portal["url"], stdin="wrong\n")
    assert refused.returncode == 4 and "token" in refused.stderr.lower()
