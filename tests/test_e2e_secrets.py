"""End to end: no credential of the portal or its agents reaches what a tenant can read.

A built-in job and a tenant's own program (launcher ``edl``, which prints its
whole environment and command line) run on the real stack; then their logs
(through the API and ``portalctl logs``), their events, their API objects and
every worker log file on the nodes are searched for the portal's Redis
credentials, the agents' signing keys and Django's ``SECRET_KEY``.  Any hit
fails the test, naming the secret and where it was found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools.stack import agent_key
from tests import test_e2e
from tests.test_e2e import EXAMPLES, ROOT, api, events, job_state, log_text, upload_code, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.slow]
idle_cluster = test_e2e.idle_cluster  # the session's stack (tests/conftest.py), idle per test

NOSY_PROGRAM = '''\
"""A tenant program that shows all it was handed (argv, its whole environment), then trains."""
import os
import sys

import edl
import train


def main(ctx: edl.Context) -> None:
    print("argv:", " ".join(sys.argv))
    for name, value in sorted(os.environ.items()):
        print(f"env {name}={value}")
    train.main(ctx)


if __name__ == "__main__":
    edl.run(main)
'''


def stack_secrets(stack: dict[str, Any]) -> dict[str, str]:
    """Every credential the stack holds, by a name for the failure message."""
    env: dict[str, str] = stack["env"]
    data = Path(stack["data_dir"])
    secrets = {"AGENT_SIGNING_KEY": env["AGENT_SIGNING_KEY"]}
    password = data / "redis" / "password"
    if password.exists():  # the embedded Redis: its portal user's password
        secrets["the embedded Redis password"] = password.read_text().strip()
    if env.get("REDIS_URL"):  # a Redis of the machine's: its URL is the portal's credential
        secrets["the portal's REDIS_URL"] = env["REDIS_URL"]
    key_file = data / "secret_key"
    secret_key = env.get("SECRET_KEY") or (
        key_file.read_text().strip() if key_file.exists() else ""
    )
    if secret_key:
        secrets["SECRET_KEY"] = secret_key
    listed = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from inventory.models import Server\n"
         "print('\\n'.join(Server.objects.values_list('node', flat=True)))"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert listed, "the demo fabric has servers"
    for node in listed:
        secrets[f"the signing key of {node}"] = agent_key(env, node)
    return secrets


def leaks(secrets: dict[str, str], where: str, text: str) -> list[str]:
    """``secret in where`` for each secret that ``text`` holds."""
    return [f"{name} in {where}" for name, value in secrets.items() if value and value in text]


def portalctl_logs(stack: dict[str, Any], job: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_"))}
    env.update(PORTAL_URL=stack["url"], PORTAL_TOKEN=stack["token"])
    done = subprocess.run(
        [sys.executable, "-m", "portalctl", "logs", str(job), "--tail", "10000"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout


def test_no_credential_reaches_a_tenant(stack: dict[str, Any], tmp_path: Path) -> None:
    program = tmp_path / "nosy"
    program.mkdir()
    (program / "nosy.py").write_text(NOSY_PROGRAM)
    shutil.copy(EXAMPLES / "elastic-digits" / "train.py", program / "train.py")
    code = upload_code(stack, program)
    builtin = api(
        stack,
        "/api/v1/jobs/",
        {"name": "builtin", "workload": "mlp-digits", "gpus": 2, "args": {"epochs": 2}},
    )
    nosy = api(stack, "/api/v1/jobs/",
               {"name": "nosy", "code": code, "entrypoint": "nosy.py --epochs 1", "launcher": "edl",
                "gpus": 1, "batch_size": 32})  # fmt: skip
    jobs = (builtin["id"], nosy["id"])
    ended = ("completed", "failed", "cancelled")
    wait_for("both jobs to end",
             lambda: all(job_state(stack, j)["state"] in ended for j in jobs), stack, 300)  # fmt: skip
    assert job_state(stack, builtin["id"])["state"] == "completed", events(stack, builtin["id"])
    assert job_state(stack, nosy["id"])["state"] == "completed", events(stack, nosy["id"])
    assert "env EDL_OPTIONS=" in log_text(stack, nosy["id"])

    secrets = stack_secrets(stack)
    found: list[str] = []
    for job in jobs:
        found += leaks(secrets, f"job {job}'s log (API)", log_text(stack, job))
        found += leaks(secrets, f"job {job}'s log (portalctl)", portalctl_logs(stack, job))
        found += leaks(secrets, f"job {job}'s events", json.dumps(events(stack, job)))
        found += leaks(secrets, f"job {job} (API)", json.dumps(job_state(stack, job)))
        for path in ("metrics/", "artifacts/", "logs/?tail=10000"):
            body = json.dumps(api(stack, f"/api/v1/jobs/{job}/{path}"))
            found += leaks(secrets, f"/api/v1/jobs/{job}/{path}", body)
    for path in sorted((Path(stack["data_dir"]) / "logs").rglob("*.log")):
        found += leaks(secrets, str(path), path.read_text(errors="replace"))
    assert not found, found
    # The built-in ran as its job's own Redis user, as a tenant program does.
    headers = [
        line for line in log_text(stack, builtin["id"]).splitlines() if line.startswith("---")
    ]
    assert headers and all("--redis-url" not in h and "REDIS_URL" in h for h in headers), headers
