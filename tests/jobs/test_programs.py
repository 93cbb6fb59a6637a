"""Jobs that run a tenant's program: the submission rules and the control plane's side.

The agents are not running here: the tests read the commands off the agents'
real queues and send the reports agents would send.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from bundles.models import CodeBundle
from bundles.services import do_upload
from control.reports import handle_report
from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.conftest import job_body
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def store(tmp_path: Path, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def bundle_of(user: Any, tenant: Any, files: dict[str, bytes] | None = None) -> CodeBundle:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (files or {"train.py": b"print('hi')\n"}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    upload = SimpleUploadedFile("code.tgz", buf.getvalue())
    bundle, _created = do_upload(user=user, tenant=tenant, uploaded_file=upload)
    return bundle


def program_body(code: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mine",
        "code": code,
        "entrypoint": "train.py --epochs 2",
        "launcher": "torchrun",
        "gpus": 2,
        "env": {"MY_FLAG": "yes"},
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def test_a_program_job_is_accepted_and_shown(token_client: Any, alice: Any, acme: Any) -> None:
    bundle = bundle_of(alice, acme)
    response = token_client(alice).post("/api/v1/jobs/", program_body(bundle.sha256), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["code"] == bundle.sha256 and body["workload"] == ""
    assert body["entrypoint"] == "train.py --epochs 2" and body["launcher"] == "torchrun"
    assert body["env"] == {"MY_FLAG": "yes"} and body["batch_size"] == 256


@pytest.mark.parametrize(
    ("files", "overrides", "accepted"),
    [
        ({"pkg/__init__.py": b"", "pkg/train.py": b""}, {"entrypoint": "python -m pkg.train"}, True),
        ({"pkg/train/__main__.py": b""}, {"entrypoint": "-m pkg.train --lr 1"}, True),
        ({"train.py": b""}, {"entrypoint": "-m pkg.train"}, False),
        ({"train.py": b""}, {"entrypoint": "-m pkg.train", "environment": {"requirements": ["pkg"]}}, True),
        ({"train.py": b""}, {"entrypoint": "accelerate launch train.py"}, False),
        ({"requirements.txt": b"accelerate\n", "train.py": b""}, {"entrypoint": "accelerate launch train.py"}, True),
        ({"sub/dir/train.py": b""}, {"entrypoint": "python sub/dir/train.py"}, True),
    ],
    ids=["module", "package-main", "module-missing", "module-of-requirements", "command-alone",
         "command-of-requirements", "subdirectory"],
)  # fmt: skip
def test_any_entrypoint_a_user_would_type_from_the_bundle_or_its_requirements(
    token_client: Any,
    alice: Any,
    acme: Any,
    files: dict[str, bytes],
    overrides: dict[str, Any],
    accepted: bool,
) -> None:
    bundle = bundle_of(alice, acme, files)
    body = program_body(bundle.sha256, **overrides)
    response = token_client(alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == (201 if accepted else 400), response.json()
    if not accepted:
        assert list(response.json()["errors"]) == ["entrypoint"], response.json()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"entrypoint": "missing.py"}, "entrypoint"),
        ({"entrypoint": "/etc/passwd.py"}, "entrypoint"),
        ({"entrypoint": "../train.py"}, "entrypoint"),
        ({"entrypoint": "train.sh"}, "entrypoint"),
        ({"entrypoint": "train.py 'unclosed"}, "entrypoint"),
        ({"entrypoint": ""}, "entrypoint"),
        ({"launcher": "mpirun"}, "launcher"),
        ({"launcher": None}, "launcher"),
        ({"env": {"RANK": "3"}}, "env"),
        ({"env": {"EDL_OPTIONS": "{}"}}, "env"),
        ({"env": {"lower": "x"}}, "env"),
        ({"env": {"BIG": "x" * 5000}}, "env"),
        ({"env": {f"V{i}": "1" for i in range(65)}}, "env"),
        ({"env": {"NUM": 3}}, "env"),
        ({"code": "f" * 64}, "code"),
        ({"code": "not-a-sha"}, "code"),
        ({"workload": "mlp-digits"}, "workload"),
        ({"args": {"epochs": 2}}, "args"),
    ],
)
def test_every_bad_program_field_is_a_400_naming_it_and_stores_nothing(
    token_client: Any, alice: Any, acme: Any, overrides: dict[str, Any], field: str
) -> None:
    bundle = bundle_of(alice, acme)
    body = program_body(bundle.sha256)
    body.update(overrides)
    body = {k: v for k, v in body.items() if v is not None}
    response = token_client(alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "name",
    ["LD_AUDIT", "LD_BIND_NOW", "GCONV_PATH", "MALLOC_TRACE", "GLIBC_TUNABLES", "PYTHONSTARTUP",
     "PYTHONWARNINGS", "BASH_ENV", "LOCPATH", "HOSTALIASES", "NODE_OPTIONS", "SSL_CERT_FILE"],
)  # fmt: skip
def test_a_variable_the_loader_libc_or_an_interpreter_reads_is_a_400_naming_it(
    token_client: Any, alice: Any, acme: Any, name: str
) -> None:
    """The attack: ``LD_AUDIT`` naming a library of the tenant's own bundle was loaded
    into the root process that builds the sandbox."""
    bundle = bundle_of(alice, acme)
    body = program_body(bundle.sha256, env={name: "/var/lib/portal/code/x/evil.so"})
    response = token_client(alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert name in str(response.json()["errors"]["env"]), response.json()
    assert Job.objects.count() == 0


def test_training_variables_and_plain_application_names_are_accepted(
    token_client: Any, alice: Any, acme: Any
) -> None:
    env = {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "HF_HOME": "/scratch/hf",
           "WANDB_MODE": "offline", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "LEARNING_RATE": "0.1", "MY_DATASET": "digits"}  # fmt: skip
    bundle = bundle_of(alice, acme)
    response = token_client(alice).post(
        "/api/v1/jobs/", program_body(bundle.sha256, env=env), format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["env"] == env


def test_another_tenants_bundle_is_not_found(
    token_client: Any, alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    theirs = bundle_of(bob, globex, {"train.py": b"print('globex')\n"})
    response = token_client(alice).post("/api/v1/jobs/", program_body(theirs.sha256), format="json")
    assert response.status_code == 400 and "code" in response.json()["errors"]


def test_built_in_workloads_take_no_env_or_other_launcher(token_client: Any, alice: Any) -> None:
    client = token_client(alice)
    response = client.post("/api/v1/jobs/", job_body(env={"A": "1"}), format="json")
    assert response.status_code == 400 and "env" in response.json()["errors"]
    response = client.post("/api/v1/jobs/", job_body(launcher="torchrun"), format="json")
    assert response.status_code == 400 and "launcher" in response.json()["errors"]
    assert client.post("/api/v1/jobs/", job_body(launcher="edl"), format="json").status_code == 201


def submit_program(user: Any, tenant: Any, launcher: str, lo: int, hi: int, gpus: int) -> Job:
    bundle = bundle_of(user, tenant)
    data = program_body(bundle.sha256, launcher=launcher, gpus=gpus, min_gpus=lo, max_gpus=hi)
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def commands_of(nodes: list[str]) -> list[dict[str, Any]]:
    return [c for cmds in drain_all(nodes).values() for c in cmds]


def exited(job: Job, worker: str, outcome: str, code: int, generation: int, **extra: Any) -> str:
    return handle_report(
        {
            "type": "worker_exited",
            "node": "n",
            "job": f"job-{job.pk}",
            "worker_id": worker,
            "slot": 0,
            "exit_code": code,
            "outcome": outcome,
            "generation": generation,
            **extra,
        }
    )


def test_torchrun_job_starts_with_ranks_resizes_by_restart_and_completes_on_exits(
    alice: Any, acme: Any
) -> None:
    nodes = demo_cluster({"leaves": 1, "spines": 1, "servers_per_leaf": 2, "gpus_per_server": 2})
    drain_all(nodes)  # what earlier tests left on the agents' queues
    acme.profile_jobs = False
    acme.save()
    job = submit_program(alice, acme, "torchrun", lo=1, hi=4, gpus=2)
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert job.state == "running" and job.generation == 1
    starts = [c for c in commands_of(nodes) if c["type"] == "start_workers"]
    ranks = sorted(w["rank"] for c in starts for w in c["workers"])
    assert ranks == list(range(job.parallelism))
    assert {c["program"]["generation"] for c in starts} == {1}
    assert all(c["program"]["launcher"] == "torchrun" for c in starts)

    # Another job arrives: the elastic policy takes GPUs back: torchrun restarts smaller.
    other = submit_program(alice, acme, "torchrun", lo=2, hi=2, gpus=2)
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    other.refresh_from_db()
    assert other.state == "running"
    assert job.state == "scaling" and job.generation == 2
    sent = commands_of(nodes)
    mine = [c for c in sent if c["job"] == f"job-{job.pk}"]
    assert {c["type"] for c in mine} == {"stop_job", "start_workers"}
    assert all(c["program"]["generation"] == 2 for c in mine if c["type"] == "start_workers")
    assert "restarting at 2 as run 2" in " ".join(job.events.values_list("reason", flat=True))

    # The old run's processes exit (SIGTERM): that changes nothing.
    assert exited(job, "w0", "clean", 0, generation=1) == "earlier run"
    started = {"type": "started", "node": "n", "job": f"job-{job.pk}", "command_id": "c-1",
               "workers": []}  # fmt: skip
    assert handle_report(started) == "restarted"
    job.refresh_from_db()
    assert (job.state, job.parallelism) == ("running", 2)

    workers = [f"w{g}" for g in job.allocation["gpus"]]
    assert exited(job, workers[0], "clean", 0, generation=2) == "worker done"
    assert exited(job, workers[1], "clean", 0, generation=2) == "completed"
    job.refresh_from_db()
    assert job.state == "completed" and not job.gpu_slots.exists()


def test_a_crashed_torchrun_worker_fails_the_job_with_the_reason(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    drain_all(nodes)
    job = submit_program(alice, acme, "torchrun", lo=2, hi=2, gpus=2)
    run_tick(policy="fifo")
    commands_of(nodes)
    job.refresh_from_db()
    outcome = exited(
        job, "w0", "crashed", 1, generation=1, reason="memory limit reached (SANDBOX_MEMORY_MB=64)"
    )
    assert outcome == "failed"
    job.refresh_from_db()
    assert job.state == "failed" and "memory limit reached" in job.failure_reason
    stops = [c for c in commands_of(nodes) if c["type"] == "stop_job"]
    assert stops  # what may still run of it is stopped


def test_an_edl_program_crashing_before_any_progress_fails(alice: Any, acme: Any) -> None:
    demo_cluster()
    job = submit_program(alice, acme, "edl", lo=2, hi=2, gpus=2)
    run_tick(policy="fifo")
    tail = "Traceback...\nModuleNotFoundError: No module named 'nope'\n"
    assert exited(job, "w0", "crashed", 1, generation=0, log_tail=tail) == "failed"
    job.refresh_from_db()
    assert job.state == "failed" and "No module named 'nope'" in job.failure_reason
