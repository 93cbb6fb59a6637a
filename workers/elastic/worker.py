"""Entry point of one elastic training worker: ``python -m workers.elastic.worker ...``.

Exit status: 0 when the job's training finished or this worker was asked to
leave; 2 on a bad command line; 1 on any other error.
"""

from __future__ import annotations

import os
import sys
import traceback

from workers.elastic import phases
from workers.elastic.cli import WorkerArgumentError, parse_options


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the named workload elastically, return the exit status."""
    phases.mark("python_up")
    try:
        options = parse_options(argv)
    except WorkerArgumentError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    from workers.elastic.runtime import run_worker  # torch is imported only past parsing

    phases.mark("imported")

    try:
        return run_worker(options)
    except Exception:  # any other error: say what, exit 1 (the agent reports it)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: destroying live gloo groups and daemon threads there can
    # abort the process (std::terminate) after training already ended cleanly.
    os._exit(code)
