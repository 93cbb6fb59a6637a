"""PostgreSQL down for "20 minutes" while a job finishes: no report is lost.

The promise (``docs/security.md``, ``control.tasks.agent_report``): a report
that meets a database outage is retried for ``AGENT_REPORT_RETRY_FOR_SECONDS``
(30 min), and its envelope's age is judged at its first receipt, so an outage
longer than the signing window (15 min) still loses no final checkpoint row
and no exit. A CI run cannot wait 20 minutes: every window of the promise is
shrunk by the same factor (``SCALE``), the outage too, so the outage stays
longer than the signing window and shorter than the retry horizon, as the
real one is; ``tests/jobs/test_report_receipt.py`` checks the real defaults.

PostgreSQL is the test's own (``tests/faults/test_postgres_restart.py``),
stopped with every connection cut, kept down until the job's processes have
exited and the outage has lasted its (scaled) 20 minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.services import RedisServer, ThrowawayPostgres
from tests.faults.stack import FaultStack, stack_on_postgres
from tests.faults.steplog import attempts_after, read_step_logs

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCALE = 30.0
"""Every window divided by this: 15 min of signing window become 30 s."""
OUTAGE_S = 20 * 60 / SCALE
WINDOWS = {
    "AGENT_MESSAGE_MAX_AGE_SECONDS": 900 / SCALE,
    "AGENT_REPORT_RETRY_FOR_SECONDS": 1800 / SCALE,
    "AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS": 30 / SCALE,
    "BROKER_VISIBILITY_TIMEOUT_SECONDS": 720 / SCALE,
    "AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS": 300 / SCALE,
}


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    own_redis: RedisServer,
    postgres: ThrowawayPostgres,
) -> Iterator[FaultStack]:
    root = Path(tmp_path_factory.mktemp("postgres-outage-stack"))
    windows = {name: str(int(value)) for name, value in WINDOWS.items()}
    with stack_on_postgres(root, own_redis, postgres, windows) as running:
        yield running


def test_a_postgresql_outage_longer_than_the_signing_window_loses_no_report(
    stack: FaultStack, postgres: ThrowawayPostgres, scenario_clock: Callable[[str], None]
) -> None:
    assert (
        WINDOWS["AGENT_MESSAGE_MAX_AGE_SECONDS"]
        < OUTAGE_S
        < WINDOWS["AGENT_REPORT_RETRY_FOR_SECONDS"]
    )
    job_id = stack.submit("postgres-outage")
    stack.wait_running_past_checkpoint(job_id)
    fault_at = time.time()
    postgres.stop()
    stack.wait_processes_gone([job_id], timeout=120)
    scenario_clock("the job's processes exited while PostgreSQL was down")
    # The rest of the (scaled) 20 minutes, whatever the job's end took of them.
    stack.wait_for("the outage to last", lambda: time.time() - fault_at >= OUTAGE_S, OUTAGE_S + 5)
    outage = time.time() - fault_at
    postgres.start()
    scenario_clock(f"PostgreSQL started again after {outage:.0f} s down")
    after = stack.submit("submitted-after-outage")
    stack.wait_completed([job_id, after])
    stack.wait_processes_gone([after])
    records = read_step_logs(stack.step_dir, f"job-{job_id}")
    assert attempts_after(records, fault_at) > 0, "the job had finished before the outage"
    for job in (job_id, after):
        stack.assert_trained_once(job)
    stack.assert_no_gpu_held()
    log = (stack.root / "stack.log").read_text(errors="replace")
    assert "refused an agent report: stale" not in log, "a retried report was judged stale"
    assert "dropped an agent report" not in log
    assert stack.proc.poll() is None, f"runstack stopped:\n{stack.log_tail()}"
