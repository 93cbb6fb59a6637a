"""End to end: hostile tenant programs, through the public API alone, stay in their box.

On the real stack (four node agents on this machine, the shared e2e stack of
``tests/conftest.py``), a tenant submits programs under both launchers that
try to leave the sandbox; another tenant's built-in job trains beside them.
What the programs could do comes back in their logs (one JSON line each):

- a job ``env`` with ``LD_AUDIT`` (the loader would run a library of the
  tenant's bundle in the root process that builds the sandbox): a 400 naming
  it, no job made;
- read a root-only host file that ``--ro-bind / /`` shows, and pid 1's
  environment: refused (the program is its job's own unprivileged uid);
- make a user namespace, ptrace, reach the kernel keyrings: ``EPERM``;
- replace its store prefix's ``artifacts`` folder with a link to a host
  directory and leave a file in ``ARTIFACT_DIR``: the agent, uploading as
  root, writes nothing through the link.

The other tenant's job completes, and every node stays up.
"""

from __future__ import annotations

import json
import platform
import shutil
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.stack import manage
from tests import test_e2e
from tests.test_e2e import EXAMPLES, api, events, job_state, log_text, upload_code, wait_for
from workers.agent import seccomp

pytestmark = [
    pytest.mark.stack,
    pytest.mark.slow,
    pytest.mark.skipif(seccomp.filter_for() is None, reason="no system-call filter here"),
]
idle_cluster = test_e2e.idle_cluster  # the session's stack (tests/conftest.py), idle per test

HOSTILE = '''\
"""Tries to leave the sandbox; prints what it could do as one JSON line."""
import ctypes, json, os, sys
from pathlib import Path

HOST = Path(sys.argv[1])
NUMBERS = json.loads(sys.argv[2])


def syscall(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(NUMBERS[name], *[ctypes.c_long(a) for a in args])
    return "ok" if result >= 0 else os.strerror(ctypes.get_errno())


def attempt(path):
    try:
        return Path(path).read_text()[:60]
    except OSError as exc:
        return "refused: " + type(exc).__name__


def probe():
    return {
        "uid": os.getuid(),
        "root_file": attempt(HOST / "root-only.txt"),
        "pid1_environ": attempt("/proc/1/environ"),
        "unshare_user": syscall("unshare", 0x10000000),
        "ptrace": syscall("ptrace", 0, 0, 0, 0),
        "keyctl": syscall("keyctl", 0, 0, 0, 0, 0),
    }


def plant_link():
    """Swap the artifacts folder beside CHECKPOINT_DIR (once the store prefix) for a link to a
    host directory, and leave a link to it in CHECKPOINT_DIR for the agent's mirror."""
    prefix = Path(os.environ["CHECKPOINT_DIR"]).parent
    artifacts = prefix / "artifacts"
    os.symlink(HOST / "target", Path(os.environ["CHECKPOINT_DIR"], "into-host"))
    try:
        if artifacts.is_dir() and not artifacts.is_symlink():
            artifacts.rmdir()
        os.symlink(HOST / "target", artifacts)
        linked = "linked"
    except OSError as exc:
        linked = "could not link: " + type(exc).__name__
    Path(os.environ["ARTIFACT_DIR"], "planted.txt").write_text("written through the link")
    return linked
'''

TORCHRUN_MAIN = """\
import json
from hostile import plant_link, probe

seen = probe()
seen["link"] = plant_link()
print("HOSTILE " + json.dumps(seen), flush=True)
"""

EDL_MAIN = """\
import json
import sys
import edl
import train
from hostile import probe


def main(ctx):
    print("HOSTILE " + json.dumps(probe()), flush=True)
    del sys.argv[1:3]  # the probe's arguments: the example's parser sees its own only
    train.main(ctx)


if __name__ == "__main__":
    edl.run(main)
"""


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A host directory the programs can see (read-only) but must not use."""
    base = Path("/var/tmp") / f"portal-hostile-{uuid.uuid4().hex[:8]}"
    (base / "target").mkdir(parents=True)
    secret = base / "root-only.txt"
    secret.write_text("root's eyes only")
    secret.chmod(0o600)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def findings(stack: dict[str, Any], job: int) -> dict[str, Any]:
    lines = [line for line in log_text(stack, job).splitlines() if line.startswith("HOSTILE ")]
    assert lines, log_text(stack, job)[-3000:]
    seen: dict[str, Any] = json.loads(lines[-1].removeprefix("HOSTILE "))
    return seen


def assert_boxed(seen: dict[str, Any]) -> None:
    assert 200_000 <= seen["uid"] < 300_000, seen  # its job's own uid, not root
    assert seen["root_file"] == "refused: PermissionError", seen
    assert seen["pid1_environ"].startswith("refused"), seen
    refused = "Operation not permitted"
    assert seen["unshare_user"] == seen["ptrace"] == seen["keyctl"] == refused, seen


def test_hostile_programs_under_both_launchers_stay_in_their_box(
    stack: dict[str, Any], tmp_path: Path, host_dir: Path
) -> None:
    numbers = json.dumps(seccomp.ARCHES[platform.machine().lower()].numbers)
    bundle = tmp_path / "hostile"
    bundle.mkdir()
    (bundle / "hostile.py").write_text(HOSTILE)
    (bundle / "attack.py").write_text(TORCHRUN_MAIN)
    (bundle / "elastic.py").write_text(EDL_MAIN)
    shutil.copy(EXAMPLES / "elastic-digits" / "train.py", bundle / "train.py")
    code = upload_code(stack, bundle)
    args = f"{host_dir} '{numbers}'"

    before = api(stack, "/api/v1/jobs/?page_size=200")["count"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        api(stack, "/api/v1/jobs/",
            {"name": "audit", "code": code, "entrypoint": f"attack.py {args}",
             "launcher": "torchrun", "gpus": 1, "env": {"LD_AUDIT": "/x/evil.so"}})  # fmt: skip
    assert refused.value.code == 400 and "LD_AUDIT" in refused.value.read().decode()
    assert api(stack, "/api/v1/jobs/?page_size=200")["count"] == before

    neighbour = api(stack, "/api/v1/jobs/",
                    {"name": "neighbour", "workload": "mlp-digits", "gpus": 2,
                     "args": {"epochs": 2}})  # fmt: skip
    attack = api(stack, "/api/v1/jobs/",
                 {"name": "attack", "code": code, "entrypoint": f"attack.py {args}",
                  "launcher": "torchrun", "gpus": 1})  # fmt: skip
    elastic = api(stack, "/api/v1/jobs/",
                  {"name": "elastic-attack", "code": code,
                   "entrypoint": f"elastic.py {args} --epochs 1", "launcher": "edl",
                   "gpus": 1, "batch_size": 32})  # fmt: skip
    jobs = (neighbour["id"], attack["id"], elastic["id"])
    ended = ("completed", "failed", "cancelled")
    wait_for("the three jobs to end",
             lambda: all(job_state(stack, j)["state"] in ended for j in jobs), stack, 300)  # fmt: skip
    for job in jobs:
        assert job_state(stack, job)["state"] == "completed", events(stack, job)

    assert_boxed(findings(stack, attack["id"]))
    assert_boxed(findings(stack, elastic["id"]))
    # The store is not in the sandbox: the folder is the node's own bind, no link replaces it;
    # and neither the upload nor the checkpoint mirror goes through the links it did plant.
    assert findings(stack, attack["id"])["link"].startswith("could not link")
    assert list((host_dir / "target").iterdir()) == []
    names = [a["name"] for a in api(stack, f"/api/v1/jobs/{attack['id']}/artifacts/")["results"]]
    assert "planted.txt" in names, names  # an ordinary artifact of its own prefix, nothing more
    states = manage(stack["env"], "shell", "-c",
                    "from inventory.models import Server\n"
                    "print(sorted(set(Server.objects.values_list('state', flat=True))))")  # fmt: skip
    assert states.splitlines()[-1] == "['up']", states  # (the shell may print a banner first)
