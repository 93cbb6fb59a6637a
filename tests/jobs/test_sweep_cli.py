"""``portalctl sweep`` against the real portal (its requests go through httpx into this
process's Django application), and the sweep file's fields against the API's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from django.test import Client as DjangoClient

from jobs.artifacts import artifact_store, prefix_of
from jobs.models import Job, Sweep
from portalctl.jobfile import JOB_FILE_FIELDS, JobFileError
from portalctl.sweep import parse_sweep_file
from portalctl.sweep_fields import SWEEP_FIELDS
from tests.cli.in_process import env, run, store
from tests.jobs.test_programs import bundle_of
from workers.elastic.checkpoint import Checkpoints

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["env", "store"]  # tests.cli.in_process's fixtures, used here by name


SWEEP_FILE = """
name: lr-search
code: {code}
entrypoint: train.py
launcher: torchrun
gpus: 1
env: {{EPOCHS: 3}}
search_space:
  lr: {{type: grid, values: [0.1, 0.01]}}
metric: loss
strategy: asha
eta: 2
min_steps: 5
max_steps: 20
max_trials: 2
"""


def test_sweep_create_get_ls_cancel(
    env: dict[str, str], alice: Any, acme: Any, tmp_path: Path
) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP_FILE.format(code=bundle_of(alice, acme).sha256))
    created = run(env, "sweep", "create", "-f", str(path))
    assert created.exit_code == 0, created.output
    sweep = Sweep.objects.get()
    assert created.output.strip() == str(sweep.pk)
    assert (sweep.strategy, sweep.eta, sweep.max_trials, sweep.metric) == ("asha", 2, 2, "loss")
    shown = run(env, "sweep", "get", str(sweep.pk))
    assert shown.exit_code == 0, shown.output
    assert f"sweep {sweep.pk} (lr-search): asha, min loss, 2 trials: running" in shown.output
    assert "lr=0.1" in shown.output and "lr=0.01" in shown.output
    listed = run(env, "sweep", "ls", "-o", "json")
    assert [s["id"] for s in json.loads(listed.output)] == [sweep.pk]
    cancelled = run(env, "sweep", "cancel", str(sweep.pk), "-o", "json")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.output)["state"] == "cancelled"
    again = run(env, "sweep", "cancel", str(sweep.pk))
    assert again.exit_code != 0  # 409: it has ended


def test_a_bad_sweep_file_names_what_is_wrong(
    env: dict[str, str], alice: Any, acme: Any, tmp_path: Path
) -> None:
    with pytest.raises(JobFileError, match="unknown key"):
        parse_sweep_file("search_space: {lr: {type: grid, values: [1]}}\nbogus: 1\n")
    with pytest.raises(JobFileError, match="search_space"):
        parse_sweep_file("metric: loss\n")
    path = tmp_path / "sweep.yaml"
    text = SWEEP_FILE.format(code=bundle_of(alice, acme).sha256).replace("eta: 2", "eta: 1")
    path.write_text(text)
    refused = run(env, "sweep", "create", "-f", str(path))
    assert refused.exit_code != 0 and "eta" in refused.output
    assert not Sweep.objects.exists()


def test_a_sweep_file_sends_only_fields_the_schema_has(client: DjangoClient) -> None:
    schema = yaml.safe_load(client.get("/api/schema/").content)
    body = schema["paths"]["/api/v1/sweeps/"]["post"]["requestBody"]["content"]
    ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(JOB_FILE_FIELDS) | set(SWEEP_FIELDS) == set(
        schema["components"]["schemas"][ref]["properties"]
    )


def test_submit_resume_from_starts_from_the_jobs_checkpoint(
    env: dict[str, str], alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    code = bundle_of(alice, acme).sha256
    first = run(env, "submit", "--code", code, "--entrypoint", "train.py", "--launcher", "edl")
    source = Job.objects.get(pk=int(first.output.strip()))
    Checkpoints(artifact_store().child(prefix_of(source))).save(12, {"w": torch.zeros(1)})
    resumed = run(env, "submit", "--code", code, "--entrypoint", "train.py", "--launcher", "edl",
                  "--resume-from", str(source.pk), "-o", "json")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    assert (json.loads(resumed.output)["resumed_from"], json.loads(resumed.output)["step"]) == (
        source.pk, 12,
    )  # fmt: skip
    foreign = Job.objects.create(
        tenant=globex, submitter=bob, name="theirs", gpus=1, min_gpus=1, max_gpus=1,
        batch_size=1, submitted_at=source.submitted_at,
    )  # fmt: skip
    refused = run(env, "submit", "--code", code, "--entrypoint", "train.py",
                  "--resume-from", str(foreign.pk))  # fmt: skip
    assert refused.exit_code == 4 and f"No job {foreign.pk} in tenant acme" in refused.output
