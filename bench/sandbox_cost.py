"""Benchmark: what the sandbox costs a tenant program, start and training speed.

One node agent (the real ``workers.agent.agent.Agent``, on an embedded Redis
of its own) starts the same small torchrun program again and again, through
its real launch path, alternately sandboxed (``SANDBOX=on``: bubblewrap,
the job's own uid, the system-call filter, cgroups) and not
(``SANDBOX=off``: the same cleared environment and limits, no bubblewrap).
The program is an MLP trained on random data with one thread; it reports
when its first line ran, when torch was imported, and its steps per second.

Figures, the median over ``--repeat`` rounds of each:

* ``start_s``: from the start command to the program's first line (what the
  sandbox adds: bubblewrap, its mounts, setpriv, the filter);
* ``ready_s``: to torch imported (the same plus reading torch through the
  sandbox's mounts);
* ``steps_per_s``: training throughput over ``--steps`` mini-batches.

It prints both cases, the difference in start time and the throughput ratio
(target: start +<= 0.5 s, throughput within 2%); the last line is one JSON
object.

    .venv/bin/python bench/sandbox_cost.py
    .venv/bin/python bench/sandbox_cost.py --repeat 7 --steps 600
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.agent_once import run_program  # noqa: E402
from utilities.embedded_redis import ensure_running, stop_owned  # noqa: E402
from workers.agent.config import AgentConfig, SandboxSettings  # noqa: E402

CODE = "5a" * 32

PROGRAM = """
import time
first_line = time.time()
import json, sys
import torch
ready = time.time()
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for _ in range(20):  # warm-up, not timed
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
began = time.perf_counter()
for _ in range(steps):
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
rate = steps / (time.perf_counter() - began)
print(json.dumps({"first_line": first_line, "ready": ready, "steps_per_s": rate}))
"""


def start_payload(job: str, steps: int) -> dict[str, Any]:
    """A one-worker torchrun start command for the benchmark's program."""
    return {
        "type": "start_workers",
        "job": job,
        "command_id": f"c-{job}",
        "batch_size": 64,
        "recovery": "consistent",
        "checkpoint_every": 0,
        "initial_world": 1,
        "workers": [{"worker_id": "w0", "slot": 0, "rank": 0}],
        "program": {
            "code": CODE,
            "code_path": f"code/{CODE}.tar.gz",
            "entrypoint": ["main.py", str(steps)],
            "launcher": "torchrun",
            "generation": 0,
            "world_size": 1,
            "master_port": 29999,
        },
    }


def run_once(base: Path, redis_url: str, mode: str, steps: int) -> dict[str, float]:
    """Start the program once on a fresh agent in ``mode``; its three figures."""
    node = f"bench-{uuid.uuid4().hex[:8]}"
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=1,
        redis_url=redis_url,
        data_dir=base / "data",
        sandbox=SandboxSettings(mode="on" if mode == "sandboxed" else "off"),
    )
    job = f"job-{uuid.uuid4().hex[:8]}"
    began, seen, _sent = run_program(config, base / "code", start_payload(job, steps))
    return {
        "start_s": seen["first_line"] - began,
        "ready_s": seen["ready"] - began,
        "steps_per_s": seen["steps_per_s"],
    }


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over the rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each case")
    parser.add_argument("--steps", type=int, default=400, help="timed mini-batches per run")
    args = parser.parse_args(argv)
    # Under /var/tmp, not /tmp: a sandbox's /tmp is private.
    base = Path(tempfile.mkdtemp(prefix="portal-sandbox-bench-", dir="/var/tmp"))
    base.chmod(0o755)  # the program's own uid walks down to its code
    (base / "code" / CODE).mkdir(parents=True)
    (base / "code" / CODE / "main.py").write_text(textwrap.dedent(PROGRAM))
    rounds: dict[str, list[dict[str, float]]] = {"sandboxed": [], "unsandboxed": []}
    try:
        redis_url = ensure_running(base / "redis")
        run_once(base, redis_url, "sandboxed", 50)  # warm the page cache for both cases
        for _ in range(args.repeat):
            for mode in ("unsandboxed", "sandboxed"):  # alternated: drift hits both
                rounds[mode].append(run_once(base, redis_url, mode, args.steps))
    finally:
        stop_owned()
        shutil.rmtree(base, ignore_errors=True)
    plain, boxed = median_of(rounds["unsandboxed"]), median_of(rounds["sandboxed"])
    result = {
        "repeat": args.repeat,
        "steps": args.steps,
        "unsandboxed": plain,
        "sandboxed": boxed,
        "start_added_s": boxed["start_s"] - plain["start_s"],
        "ready_added_s": boxed["ready_s"] - plain["ready_s"],
        "throughput_ratio": boxed["steps_per_s"] / plain["steps_per_s"],
    }
    for mode, figures in (("unsandboxed", plain), ("sandboxed", boxed)):
        print(
            f"{mode:>12}: start {figures['start_s']:.3f} s, torch ready {figures['ready_s']:.3f} s, "
            f"{figures['steps_per_s']:.1f} steps/s"
        )
    print(
        f"sandbox adds {result['start_added_s']:+.3f} s to the start "
        f"({result['ready_added_s']:+.3f} s to torch ready); "
        f"throughput ratio {result['throughput_ratio']:.3f} (target: +<=0.5 s, >=0.98)"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
