"""Restart PostgreSQL under a running stack: jobs running through it finish, nothing is lost.

The cluster is the test's own, made with the machine's PostgreSQL binaries
(``/usr/lib/postgresql/*/bin``: initdb, pg_ctl) in a temporary directory;
as root they run as the ``postgres`` user. The server is stopped
(fast shutdown: every open connection is cut) while a job trains, stays down
until the job's processes have exited, and starts again on the same port and
data: the job's last reports, its final checkpoint and its exit all reach a
control plane that cannot write, and must not be lost.
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


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    own_redis: RedisServer,
    postgres: ThrowawayPostgres,
) -> Iterator[FaultStack]:
    with stack_on_postgres(
        Path(tmp_path_factory.mktemp("postgres-stack")), own_redis, postgres
    ) as running:
        yield running


def test_restart_postgresql_while_a_job_finishes(
    stack: FaultStack, postgres: ThrowawayPostgres, scenario_clock: Callable[[str], None]
) -> None:
    job_id = stack.submit("postgres-restart")
    stack.wait_running_past_checkpoint(job_id)
    fault_at = time.time()
    postgres.stop()
    # The job trains to its end while the database is down: the reports of its last
    # steps, its final checkpoint and its exit reach a control plane that cannot write.
    stack.wait_processes_gone([job_id], timeout=120)
    scenario_clock("the job's processes exited while PostgreSQL was down")
    postgres.start()
    scenario_clock("PostgreSQL started again")
    after = stack.submit("submitted-after-restart")
    stack.wait_completed([job_id, after])
    stack.wait_processes_gone([after])
    records = read_step_logs(stack.step_dir, f"job-{job_id}")
    assert attempts_after(records, fault_at) > 0, "the job had finished before the restart"
    for job in (job_id, after):
        stack.assert_trained_once(job)
    stack.assert_no_gpu_held()
    assert stack.proc.poll() is None, f"runstack stopped:\n{stack.log_tail()}"
