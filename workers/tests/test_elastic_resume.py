"""A job whose every worker dies resumes on other nodes from the checkpoints in its store.

The first run trains with two workers in one working directory (node A),
checkpointing to the job's store; all of them are SIGKILLed.  A second run
(node B: another working directory, three workers, the same store) is
launched as the control plane requeues a job: it restores the newest
checkpoint that verifies, trains to the end and writes the final checkpoint
before it reports ``finished``.  Across both runs every step ran over exactly
its global batch (each sample once per epoch), and the final model equals a
single-process run of the same batches.  The same on S3 (moto on loopback).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.elastic import (
    JobRun,
    check_samples,
    max_difference,
    reference_model,
    step_records_of,
)
from devtools.s3_server import S3Server, moto_s3
from workers.elastic.sampler import ElasticSampler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOLERANCE = 1e-6
EVERY = 10
STEPS = 100


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_s3("cluster") as server:
        yield server


@pytest.fixture
def runs() -> Iterator[list[JobRun]]:
    started: list[JobRun] = []
    yield started
    for run in started:
        run.terminate()
    if started:
        started[-1].control.cleanup()


@pytest.mark.parametrize("store_kind", ["file", "s3"])
def test_a_job_killed_everywhere_resumes_from_its_store_elsewhere(
    store_kind: str,
    redis_url: str,
    tmp_path: Path,
    runs: list[JobRun],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env: dict[str, str] = {}
    store_url = str(tmp_path / "shared-store")
    if store_kind == "s3":
        server: S3Server = request.getfixturevalue("s3")
        env = server.env
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        store_url = f"{server.url}/tenants/acme/jobs/{uuid.uuid4().hex[:6]}"
    job_id = f"r{uuid.uuid4().hex[:8]}"

    def run_on(node: str, extra: list[str]) -> JobRun:
        (tmp_path / node).mkdir()
        run = JobRun(redis_url, job_id, tmp_path / node, checkpoint_every=EVERY)
        run.store_url, run.env, run.extra = store_url, env, [*run.extra, *extra]
        runs.append(run)
        return run

    first = run_on("node-a", ["--slow-ms", "30"])  # slow: killed well before STEPS
    first.start_initial(2)
    saved = first.wait_event("checkpoint_saved", 90, lambda e: e["step"] >= 2 * EVERY)
    assert saved["path"] == f"checkpoints/step-{saved['step']:09d}.pt" and not saved["final"]
    first.wait_step(saved["step"] + 3)
    assert first.control.status().step < STEPS - EVERY
    for worker in first.procs:  # every node of the job goes down
        first.kill(worker)
    first.wait_exit()

    # Requeued on other nodes: a fresh launch (its Redis keys cleaned), the same store.
    second = run_on("node-b", ["--max-steps", str(STEPS)])
    second.start_initial(3)
    finished = second.wait_event("finished", 120)
    assert finished["reason"] == "finished" and finished["step"] == STEPS
    codes = second.wait_exit()
    assert set(codes.values()) == {0}, (codes, second.tail())

    resumed_from = min(second.step_records())
    assert resumed_from >= saved["step"] and resumed_from % EVERY == 0, resumed_from
    sampler = ElasticSampler(1797, second.batch_size, second.args["seed"])
    check_samples(step_records_of([first, second]), sampler, STEPS, killed=True)
    expected = reference_model(second.args, second.batch_size, STEPS)
    assert max_difference(second.final_model(), expected) < TOLERANCE

    # rank 0 wrote the final checkpoint before the job reported its end; the keep rule held
    second.poll_events()
    order = [(e["kind"], e.get("step"), e.get("final")) for _id, e in second.events]
    assert order.index(("checkpoint_saved", STEPS, True)) < order.index(("finished", STEPS, None))
    manifests, bad = second.checkpoints.manifests()
    assert bad == [] and [(m.step, m.final) for m in manifests] == [
        (STEPS, True),
        (STEPS - EVERY, False),
        (STEPS - 2 * EVERY, False),
    ]
