"""A warm worker process: imports and model built before it knows its job.

``python -m workers.elastic.warm [--workload W --args JSON --device D --dtype T]``
imports torch and the runtime, builds the named built-in workload if one is
given, then blocks on stdin for its assignment: one line, the JSON list of a
worker's command-line arguments (``workers.elastic.cli``, without the
interpreter and module).  It then runs as that worker — the prepared model is
used when the assignment's workload, arguments, device and dtype match,
otherwise the workload is built as a cold worker would.  An empty stdin (the
agent closed the pipe) ends it with status 0.

Only built-in workloads run this way: a tenant's program runs in its own
sandboxed process (``workers/agent/sandbox.py``), which a warm interpreter of
the agent's own code must not become.  Exit statuses are the worker's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import IO

from workers.elastic import phases
from workers.elastic.cli import WorkerArgumentError, parse_options


def build_parser() -> argparse.ArgumentParser:
    """The arguments of a warm process: what to build ahead (all optional)."""
    p = argparse.ArgumentParser(prog="python -m workers.elastic.warm")
    p.add_argument("--workload", default=None, help="built-in workload to build ahead")
    p.add_argument("--args", default="{}", help="its arguments, a JSON object")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    return p


def read_assignment(stream: IO[str] | None = None) -> list[str] | None:
    """The worker arguments the agent sent (None: the pipe closed); ValueError if malformed."""
    source = sys.stdin if stream is None else stream
    line = source.readline()
    if not line.strip():
        return None
    argv = json.loads(line)
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("the assignment must be a JSON list of strings")
    return argv


def main(argv: list[str] | None = None) -> int:
    """Warm up, wait for the assignment, run as that worker; return the exit status."""
    ns = build_parser().parse_args(argv)
    import torch

    from workers.catalog import WorkloadArgumentError, validate_args
    from workers.elastic.runtime import prepare_builtin, run_worker

    if ns.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ahead = None
    if ns.workload is not None:
        try:
            args = validate_args(ns.workload, json.loads(ns.args))
        except (WorkloadArgumentError, json.JSONDecodeError) as exc:
            sys.stderr.write(f"error: cannot build {ns.workload} ahead: {exc}\n")
            return 2
        key = (ns.workload, json.dumps(args, sort_keys=True), ns.device, ns.dtype)
        ahead = (key, prepare_builtin(ns.workload, args, ns.device, ns.dtype))
    phases.mark("warm")
    try:
        assignment = read_assignment()
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if assignment is None:
        return 0
    phases.mark("assigned")
    try:
        options = parse_options(assignment)
    except WorkerArgumentError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    wanted = (
        options.workload,
        json.dumps(options.args, sort_keys=True),
        options.device,
        options.dtype,
    )
    prepared = ahead[1] if ahead is not None and ahead[0] == wanted else None
    try:
        return run_worker(options, prepared)
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as worker.py: skip the teardown of live gloo groups
