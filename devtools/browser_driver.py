"""Changes the browser tests' server database the way the control plane would.

The browser tests serve the portal from a daphne subprocess with its own
SQLite file; this process runs against the same file and applies changes
through the real services (so events are broadcast after commit, as in
production).  It reads one JSON request per line on stdin and answers one
JSON line on stdout::

    {"op": "seed"}
    {"op": "tenant", "slug": "initech", "owner": "carol"}       one more tenant (password ``pw``)
    {"op": "transition", "job": 3, "state": "running", "parallelism": 2}
    {"op": "parallelism", "job": 3, "parallelism": 4}
    {"op": "call", "path": "module:function", "kwargs": {...}}   any service, by name
    {"op": "cancel_active"}                                       every unfinished job, cancelled

Run as ``python -m devtools.browser_driver`` with the server's environment.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from typing import Any


def seed() -> dict[str, Any]:
    """Two tenants with one member each, and a cluster admin (passwords ``pw``)."""
    from django.contrib.auth import get_user_model

    from tenancy.services import do_create_tenant

    acme = do_create_tenant(slug="acme", name="Acme ML", owner_username="alice", password="pw")
    globex = do_create_tenant(slug="globex", name="Globex", owner_username="bob", password="pw")
    get_user_model().objects.create_user("root", password="pw", is_staff=True, is_superuser=True)
    return {"acme": acme.tenant.pk, "globex": globex.tenant.pk}


def submit(
    user: str,
    tenant: str,
    name: str,
    gpus: int,
    elastic: bool = False,
    gpu_range: tuple[int, int] | None = None,
) -> int:
    """Submit a job as ``user`` through the services (rigid unless ``elastic`` or ``gpu_range``)."""
    from django.contrib.auth import get_user_model

    from jobs.services import check_job_spec, do_submit_job
    from tenancy.models import Tenant

    owner = get_user_model().objects.get(username=user)
    target = Tenant.objects.get(slug=tenant)
    data: dict[str, Any] = {"name": name, "workload": "mlp-digits", "gpus": gpus}
    if gpu_range is not None:
        data.update(min_gpus=gpu_range[0], max_gpus=gpu_range[1])
    elif not elastic:
        data.update(min_gpus=gpus, max_gpus=gpus)
    return do_submit_job(
        user=owner, tenant=target, spec=check_job_spec(tenant=target, data=data)
    ).pk


_EVENT_SEQ = [0]


def report(kind: str, job: int, **fields: Any) -> str:
    """Feed the control plane an agent report about ``job``, as an agent would send it."""
    from control.reports import handle_report
    from jobs.agent_commands import runtime_job_name
    from workers import protocol

    _EVENT_SEQ[0] += 1
    common: dict[str, Any] = {"node": "node-0", "job": runtime_job_name(job)}
    event = {**common, "event_id": f"{int(time.time() * 1000)}-{_EVENT_SEQ[0]}"}
    message: Any
    if kind == "progress":
        message = protocol.Progress(**event, **fields)
    elif kind == "profile":
        curve = tuple(protocol.CurvePoint(workers=n, samples_per_s=v) for n, v in fields["curve"])
        message = protocol.ProfileDone(**event, curve=curve)
    elif kind == "finished":
        message = protocol.Finished(**event, **fields)
    elif kind == "log":
        message = protocol.LogLines(
            **common, worker_id="w0", log_id="node-0-1-browser", offset=0, text=fields["text"]
        )
    else:
        raise ValueError(f"unknown report kind {kind!r}")
    return handle_report(message.to_dict())


def cancel_active() -> list[int]:
    """Cancel every unfinished job, each by its submitter: a test that needs the whole
    fabric (or reloads it) starts from an idle cluster whatever earlier tests left."""
    from jobs.choices import TERMINAL_STATES
    from jobs.models import Job
    from jobs.services import do_cancel_job

    cancelled = []
    for job in Job.objects.exclude(state__in=TERMINAL_STATES).select_related("submitter"):
        do_cancel_job(user=job.submitter, job_id=job.pk, reason="cleared by a browser test")
        cancelled.append(job.pk)
    return cancelled


def handle(request: dict[str, Any]) -> Any:
    """Apply one request and return a JSON-able result."""
    from devtools.job_steps import move
    from jobs.services import do_set_parallelism

    op = request["op"]
    if op == "seed":
        return seed()
    if op == "tenant":
        from tenancy.services import do_create_tenant

        made = do_create_tenant(
            slug=request["slug"],
            name=request["slug"].title(),
            owner_username=request["owner"],
            password="pw",
        )
        return {"tenant": made.tenant.pk}
    if op == "transition":
        started = time.time()
        job = move(
            job_id=request["job"],
            to_state=request["state"],
            reason=request.get("reason", "driven by the browser test"),
            parallelism=request.get("parallelism"),
        )
        return {"job": job.pk, "state": job.state, "t0": started}
    if op == "parallelism":
        started = time.time()  # wall clock: receivers in other processes compare against it
        job = do_set_parallelism(
            job_id=request["job"], parallelism=request["parallelism"], reason="scaled by the test"
        )
        return {"job": job.pk, "parallelism": job.parallelism, "t0": started}
    if op == "submit":
        return {"job": submit(**{k: v for k, v in request.items() if k != "op"})}
    if op == "cancel":
        from django.contrib.auth import get_user_model

        from jobs.services import do_cancel_job

        user = get_user_model().objects.get(username=request["user"])
        return {"state": do_cancel_job(user=user, job_id=request["job"]).state}
    if op == "cancel_active":
        return {"cancelled": cancel_active()}
    if op == "heartbeats":
        from inventory.models import Server
        from inventory.services import do_heartbeat

        nodes = list(Server.objects.values_list("node", flat=True))
        for node in nodes:
            do_heartbeat(node=node, info={"slots": 1})
        return {"nodes": nodes}
    if op == "tick":
        from control.tick import run_tick

        result = run_tick(policy=request.get("policy", "fifo"))
        return {"changed": list(result.changed_jobs), "refused": len(result.refused)}
    if op == "server_state":
        from inventory.services import do_set_server_state

        server = do_set_server_state(node=request["node"], state=request["state"], reason="test")
        return {"node": server.node, "state": server.state}
    if op == "report":
        return {"outcome": report(**{k: v for k, v in request.items() if k != "op"})}
    if op == "call":
        module_name, function_name = request["path"].split(":")
        result = getattr(importlib.import_module(module_name), function_name)(
            **request.get("kwargs", {})
        )
        return {"repr": repr(result)[:500]}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    """Serve requests from stdin until it closes."""
    import django

    django.setup()
    _answer({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = {"ok": True, "result": handle(json.loads(line))}
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc(file=sys.stderr)
        _answer(answer)


def _answer(message: dict[str, Any]) -> None:
    """One JSON line on stdout: the harness reads the driver's answers there."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
