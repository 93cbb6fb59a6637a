"""Server-rendered pages: login, dashboard scoping, submission form, job detail, cancel."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_login_page_and_redirect() -> None:
    client = Client()
    assert client.get("/").status_code == 302
    page = client.get("/login/")
    assert page.status_code == 200 and b"Log in" in page.content


def test_login_with_password(alice: Any) -> None:
    client = Client()
    response = client.post("/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    bad = Client().post("/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200 and b"Please enter a correct" in bad.content


def test_submit_form_with_inline_errors_then_success(alice: Any) -> None:
    client = logged_in(alice)
    form = {
        "tenant": "acme",
        "name": "digits",
        "workload": "mlp-digits",
        "gpus": "2",
        "min_gpus": "4",
        "max_gpus": "2",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "10",
        "args": '{"epochs": 3}',
    }
    page = client.post("/jobs/new/", form)
    assert page.status_code == 200
    assert b'data-for="min_gpus"' in page.content  # the error sits next to its field
    assert Job.objects.count() == 0
    form.update(min_gpus="1", max_gpus="4")
    response = client.post("/jobs/new/", form)
    assert response.status_code == 302
    job = Job.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.args["epochs"] == 3 and (job.min_gpus, job.max_gpus) == (1, 4)
    detail = client.get(response["Location"]).content.decode()
    assert "digits" in detail and "queued" in detail


def test_form_refuses_bad_args_json(alice: Any) -> None:
    page = logged_in(alice).post(
        "/jobs/new/",
        {
            "tenant": "acme",
            "name": "x",
            "workload": "mlp-digits",
            "gpus": "1",
            "priority": "1",
            "recovery": "consistent",
            "checkpoint_interval": "1",
            "args": "{broken",
        },
    )
    assert b'data-for="args"' in page.content
    assert Job.objects.count() == 0


def test_dashboard_and_detail_are_scoped(alice: Any, bob: Any, acme: Any) -> None:
    spec = check_job_spec(
        tenant=acme, data={"name": "acme-secret", "workload": "mlp-digits", "gpus": 1}
    )
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    assert b"acme-secret" in logged_in(alice).get("/").content
    bobs = logged_in(bob)
    assert b"acme-secret" not in bobs.get("/").content
    assert b"acme-secret" not in bobs.get("/?tenant=acme").content
    assert bobs.get(f"/jobs/{job.pk}/").status_code == 404
    assert bobs.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    response = logged_in(alice).post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def program_form(**overrides: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "tenant": "acme",
        "name": "mine",
        "source": "program",
        "entrypoint": "train.py --epochs 2",
        "launcher": "torchrun",
        "env": "MY_FLAG=1\nOTHER=two words",
        "gpus": "2",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "10",
    }
    form.update(overrides)
    return form


def targz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_submit_form_uploads_a_program_and_runs_it(
    alice: Any, tmp_path: Any, settings: Any
) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path}"
    client = logged_in(alice)
    page = client.get("/jobs/new/").content.decode()
    assert 'name="archive"' in page and 'name="entrypoint"' in page and "js/submit.js" in page
    archive = SimpleUploadedFile("code.tgz", targz({"train.py": b"print(1)\n"}))
    response = client.post("/jobs/new/", program_form(archive=archive))
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert job.code is not None and job.entrypoint == "train.py --epochs 2"
    assert job.launcher == "torchrun" and job.env == {"MY_FLAG": "1", "OTHER": "two words"}
    # The bundle is offered again on the next visit, and a job can pick it.
    sha = job.code.sha256
    assert sha[:12] in client.get("/jobs/new/").content.decode()
    again = client.post("/jobs/new/", program_form(code=sha, name="again"))
    assert again.status_code == 302 and Job.objects.count() == 2


def test_submit_form_refuses_a_hostile_archive_at_its_field(
    alice: Any, tmp_path: Any, settings: Any
) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path}"
    archive = SimpleUploadedFile("code.tgz", targz({"../escape.py": b"x"}))
    page = logged_in(alice).post("/jobs/new/", program_form(archive=archive))
    assert page.status_code == 200 and b'data-for="archive"' in page.content
    assert Job.objects.count() == 0 and not any(tmp_path.rglob("*.tar.gz"))


def test_submit_form_program_without_code_says_so(alice: Any) -> None:
    page = logged_in(alice).post("/jobs/new/", program_form())
    assert page.status_code == 200 and b"bundle id" in page.content
    assert Job.objects.count() == 0


def test_job_page_shows_the_program(alice: Any, acme: Any, tmp_path: Any, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path}"
    client = logged_in(alice)
    archive = SimpleUploadedFile("code.tgz", targz({"train.py": b"print(1)\n"}))
    response = client.post("/jobs/new/", program_form(archive=archive, env="SECRET_THING=<b>x</b>"))
    page = client.get(response["Location"]).content.decode()
    job = Job.objects.get()
    assert job.code is not None and job.code.sha256 in page
    assert "torchrun: train.py --epochs 2" in page and "SECRET_THING=&lt;b&gt;x&lt;/b&gt;" in page
