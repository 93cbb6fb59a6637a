"""Sweeps on the real control plane: the real tick starts the trials' jobs, the reports agents
send (metrics, exits) end them, and the sweep promotes, resumes and stops trials.

Trials are torchrun programs here (one exit ends the job); each finished job's
checkpoint is written into its store prefix with the runtime's own
``Checkpoints``, so a promotion's ``resume_from`` copies a real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from control.tick import run_tick
from jobs.artifacts import artifact_store, prefix_of
from jobs.errors import JobConflictError, JobValidationError
from jobs.models import Job, Sweep, Trial
from jobs.services import check_job_spec, do_submit_job
from jobs.sweeps import check_sweep_spec, do_cancel_sweep, do_submit_sweep
from tests.jobs.control_helpers import demo_cluster
from tests.jobs.outputs_helpers import metrics
from tests.jobs.test_arrays import finish
from tests.jobs.test_programs import bundle_of, program_body
from tests.jobs.workflow_helpers import quiet_demo_cluster
from workers.elastic.checkpoint import Checkpoints

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]

LRS = [0.8, 0.1, 0.4, 0.2]  # the loss is |lr - 0.15| below: trial 1 best, then 3, 2, 0


def sweep_body(code: str, **overrides: Any) -> dict[str, Any]:
    body = program_body(
        code,
        name="lr-search",
        gpus=1,
        env={"EPOCHS": "3"},
        search_space={"lr": {"type": "grid", "values": LRS}},
        metric="loss",
        mode="min",
        strategy="asha",
        eta=2,
        min_steps=10,
        max_steps=40,
        max_trials=4,
    )
    body.update(overrides)
    return body


def submit_sweep(user: Any, tenant: Any, **overrides: Any) -> Sweep:
    bundle = bundle_of(user, tenant)
    spec = check_sweep_spec(tenant=tenant, data=sweep_body(bundle.sha256, **overrides))
    return do_submit_sweep(user=user, tenant=tenant, spec=spec)


def trials(sweep: Sweep) -> list[Trial]:
    return list(Trial.objects.filter(sweep=sweep).select_related("job").order_by("index"))


def train(job: Job, steps: int) -> str:
    """What the trial's program does: log its loss at its last step, checkpoint, exit."""
    lr = float(job.env["HP_LR"])
    assert metrics(job, [(steps, {"loss": abs(lr - 0.15) + 1.0 / steps})]) == "metrics"
    Checkpoints(artifact_store().child(prefix_of(job))).save(
        steps, {"w": torch.tensor([lr])}, final=True
    )
    return finish(job)


def run_to_rung_end(sweep: Sweep, order: list[int]) -> None:
    """Start what is queued, then let the trials' running jobs finish in ``order``."""
    run_tick(policy="fifo")
    for index in order:
        trial = Trial.objects.select_related("job").get(sweep=sweep, index=index)
        assert trial.job is not None
        trial.job.refresh_from_db()
        assert trial.job.state == "running", (index, trial.job.state)
        assert train(trial.job, int(trial.job.env["TRIAL_MAX_STEPS"])) == "completed"


def test_asha_promotes_the_best_resumes_it_from_its_checkpoint_and_stops_the_worst(
    alice: Any, acme: Any
) -> None:
    quiet_demo_cluster(acme)
    sweep = submit_sweep(alice, acme)
    first = trials(sweep)
    assert [t.params for t in first] == [{"lr": lr} for lr in LRS]
    env = first[1].job.env if first[1].job else {}
    assert (env["HP_LR"], env["TRIAL_MAX_STEPS"], env["EPOCHS"]) == ("0.1", "10", "3")
    assert json.loads(env["SWEEP_PARAMS"]) == {"lr": 0.1}
    assert all(t.job is not None and t.job.sched_weight == 1.0 for t in first)

    run_to_rung_end(sweep, [0, 1, 2, 3])
    after_rung0 = trials(sweep)
    # 0 (worst) waits alone; 1 beats 0 on two results; then 3 is in the top 2 of 4
    assert [(t.index, t.status, t.rung) for t in after_rung0] == [
        (0, "stopped", 0),
        (1, "running", 1),
        (2, "stopped", 0),
        (3, "running", 1),
    ]
    stopped = after_rung0[0]
    assert stopped.reason == "lost at rung 0: not in the top 1/2 of its results"
    assert stopped.job is not None
    assert stopped.job.events.filter(reason__contains="stopped trial 0").exists()
    promoted = after_rung0[1]
    assert promoted.job is not None and promoted.job.trial_id == promoted.pk
    assert promoted.job.env["TRIAL_MAX_STEPS"] == "20" and promoted.job.sched_weight == 2.0
    previous = Job.objects.filter(trial=promoted).order_by("pk").first()
    assert previous is not None and promoted.job.resumed_from_id == previous.pk
    copied, _ = Checkpoints(artifact_store().child(prefix_of(promoted.job))).manifests()
    assert [(m.step, m.final) for m in copied] == [(10, False)]  # resumes at step 10
    assert promoted.job.step == 10
    assert promoted.job.artifacts.filter(kind="checkpoint", step=10).exists()

    # rung 1: 3 reports first and waits; 1 beats it and goes on to the top rung
    run_to_rung_end(sweep, [3, 1])
    assert [(t.index, t.status, t.rung) for t in trials(sweep)] == [
        (0, "stopped", 0),
        (1, "running", 2),
        (2, "stopped", 0),
        (3, "stopped", 1),
    ]
    top = trials(sweep)[1].job
    assert top is not None and top.sched_weight == 4.0 and top.env["TRIAL_MAX_STEPS"] == "40"
    run_to_rung_end(sweep, [1])
    final = trials(sweep)
    assert [(t.index, t.status) for t in final] == [
        (0, "stopped"),
        (1, "completed"),
        (2, "stopped"),
        (3, "stopped"),
    ]
    sweep.refresh_from_db()
    assert sweep.state == "completed"
    assert final[1].results == {
        "0": pytest.approx(0.15),
        "1": pytest.approx(0.1),
        "2": pytest.approx(0.075),
    }
    assert Job.objects.filter(trial=final[1]).count() == 3  # one job per rung


def test_a_failed_trial_job_fails_the_trial_and_the_sweep_goes_on(alice: Any, acme: Any) -> None:
    quiet_demo_cluster(acme)
    sweep = submit_sweep(alice, acme, strategy="random", max_trials=2, min_steps=None)
    run_tick(policy="fifo")
    one, two = trials(sweep)
    assert one.job is not None and two.job is not None
    assert finish(one.job, "crashed") == "failed"
    assert train(two.job, 20) == "completed"
    assert [(t.status, t.reason) for t in trials(sweep)] == [
        ("failed", f"job {one.job.pk} failed"),
        ("completed", ""),
    ]
    sweep.refresh_from_db()
    assert sweep.state == "completed"


def test_cancel_stops_every_live_trial_and_cancels_their_jobs(alice: Any, acme: Any) -> None:
    demo_cluster()
    sweep = submit_sweep(alice, acme)
    do_cancel_sweep(user=alice, sweep_id=sweep.pk)
    assert {(t.status, t.job.state if t.job else "") for t in trials(sweep)} == {
        ("stopped", "cancelled")
    }
    with pytest.raises(JobConflictError):
        do_cancel_sweep(user=alice, sweep_id=sweep.pk)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"strategy": "bayes"}, "strategy"),
        ({"eta": 1}, "eta"),
        ({"min_steps": 50}, "min_steps"),
        ({"search_space": {"lr": {"type": "normal"}}}, "search_space.lr"),
        ({"search_space": []}, "search_space"),
        ({"metric": ""}, "metric"),
        ({"mode": "best"}, "mode"),
        ({"max_trials": 0}, "max_trials"),
        ({"max_gpu_hours": -1}, "max_gpu_hours"),
        ({"max_gpu_hours": "ten"}, "max_gpu_hours"),
        ({"eta": "3"}, "eta"),
        ({"max_running": 0}, "max_running"),
        ({"env": {"HP_LR": "1"}}, "env"),
        ({"env": {"TRIAL_MAX_STEPS": "1"}}, "env"),
        ({"after": [{"kind": "after_ok", "job": 1}]}, "after"),
        ({"strategy": "grid", "search_space": {"lr": {"type": "uniform", "low": 0, "high": 1}}},
         "search_space.lr"),
    ],
)  # fmt: skip
def test_bad_sweeps_name_the_field_and_create_nothing(
    alice: Any, acme: Any, overrides: dict[str, Any], field: str
) -> None:
    bundle = bundle_of(alice, acme)
    with pytest.raises(JobValidationError) as caught:
        check_sweep_spec(tenant=acme, data=sweep_body(bundle.sha256, **overrides))
    assert field in caught.value.errors, caught.value.errors
    assert not Sweep.objects.exists() and not Job.objects.exists()


def test_resume_from_copies_the_newest_verified_checkpoint_and_refuses_a_foreign_job(
    alice: Any, acme: Any, bob: Any, globex: Any, tmp_path: Path
) -> None:
    bundle = bundle_of(alice, acme)
    body = program_body(bundle.sha256, gpus=1)
    source = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=body))
    with pytest.raises(JobValidationError) as none_yet:
        check_job_spec(tenant=acme, data={**body, "resume_from": source.pk})
    assert "no complete checkpoint" in none_yet.value.errors["resume_from"][0]
    checkpoints = Checkpoints(artifact_store().child(prefix_of(source)), keep=3)
    checkpoints.save(10, {"w": torch.tensor([1.0])})
    checkpoints.save(20, {"w": torch.tensor([2.0])})
    newest = tmp_path / "artifacts" / prefix_of(source) / "checkpoints" / "step-000000020.pt"
    newest.write_bytes(newest.read_bytes()[:-3] + b"xyz")  # corrupt: the copy takes step 10
    spec = check_job_spec(tenant=acme, data={**body, "resume_from": source.pk})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    assert job.resumed_from_id == source.pk and job.step == 10
    restored, _ = Checkpoints(artifact_store().child(prefix_of(job))).load_latest()
    assert restored is not None and restored.step == 10
    assert float(restored.state["w"][0]) == 1.0
    assert job.events.filter(reason=f"resumes from job {source.pk}'s checkpoint at step 10")
    # another tenant's job is answered like a missing one
    bob_bundle = bundle_of(bob, globex)
    foreign = {**program_body(bob_bundle.sha256, gpus=1), "resume_from": source.pk}
    with pytest.raises(JobValidationError) as refused:
        check_job_spec(tenant=globex, data=foreign)
    assert refused.value.errors["resume_from"] == [f"No job {source.pk} in tenant globex."]


def test_a_metric_that_arrives_after_the_jobs_end_is_still_its_result(
    alice: Any, acme: Any
) -> None:
    quiet_demo_cluster(acme)
    sweep = submit_sweep(
        alice, acme, strategy="grid", min_steps=None, max_trials=None,
        search_space={"lr": {"type": "grid", "values": [0.1]}},
    )  # fmt: skip
    run_tick(policy="fifo")
    (trial,) = trials(sweep)
    assert trial.job is not None
    assert finish(trial.job) == "completed"  # its metrics report is still on its way
    (trial,) = trials(sweep)
    assert (trial.status, trial.reason) == ("running", f"job {trial.job_id} ended; waiting for "
                                            "its 'loss'")  # fmt: skip
    sweep.refresh_from_db()
    assert sweep.state == "running"
    assert trial.job is not None
    assert metrics(trial.job, [(40, {"loss": 0.25})]) == "metrics"
    (trial,) = trials(sweep)
    assert (trial.status, trial.results) == ("completed", {"0": 0.25})
    sweep.refresh_from_db()
    assert sweep.state == "completed"


def test_resume_from_a_job_whose_only_checkpoint_is_corrupt_starts_from_step_0(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    """The submit reads manifests only; the bytes are verified once, as they are copied."""
    bundle = bundle_of(alice, acme)
    body = program_body(bundle.sha256, gpus=1)
    source = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=body))
    Checkpoints(artifact_store().child(prefix_of(source)), keep=3).save(10, {"w": torch.ones(1)})
    only = tmp_path / "artifacts" / prefix_of(source) / "checkpoints" / "step-000000010.pt"
    only.write_bytes(only.read_bytes()[:-3] + b"xyz")
    spec = check_job_spec(tenant=acme, data={**body, "resume_from": source.pk})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    assert job.resumed_from_id == source.pk and job.step == 0
    assert job.events.filter(
        reason=f"job {source.pk} had no checkpoint left to copy: starts from step 0"
    )
    restored, _ = Checkpoints(artifact_store().child(prefix_of(job))).load_latest()
    assert restored is None
