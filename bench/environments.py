"""Benchmark: what a job's own environment costs its start, cold (built now) and warm (cached).

One node agent (the real ``workers.agent.agent.Agent``, sandboxed, on an
embedded Redis of its own) starts the same one-worker program again and
again through its real launch path, from a bundle that declares:

* ``none``: no requirements (the node's base layer only: the baseline);
* ``small``: two small pure-Python packages with a pin (``SMALL``);
* ``medium``: a dozen packages, some with compiled wheels (``MEDIUM``).

For each set, a **cold** round starts on an empty environment cache (uv's
download cache included: everything comes from the package index, as on a
new node) and a **warm** round on the cache the cold round filled.  Figures,
the median over ``--repeat`` rounds:

* ``start_s``: from the start command to the program's first line (a cold
  round includes the build);
* ``imported_s``: to the requirements imported.

It prints each case, then the warm start's cost over ``none`` (target:
<= 1 s) and the cold build of ``small`` (target: <= 20 s); the last line is
one JSON object.  Needs the package index (PyPI, or ``ENVIRONMENT_INDEX_URL``).

    .venv/bin/python bench/environments.py
    .venv/bin/python bench/environments.py --repeat 3 --sets none,small
"""

from __future__ import annotations

import argparse
import json
import os
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
from workers.agent.config import AgentConfig  # noqa: E402
from workers.agent.environments import EnvironmentSettings  # noqa: E402
from workers.protocol import Started  # noqa: E402

SMALL = ("einops==0.8.1", "tabulate")
MEDIUM = (
    *SMALL,
    "humanize",
    "termcolor",
    "toolz",
    "more-itertools",
    "msgpack",
    "orjson",
    "pytz",
    "tzdata",
    "xxhash",
    "zstandard",
)
SETS: dict[str, tuple[str, ...]] = {"none": (), "small": SMALL, "medium": MEDIUM}

PROGRAM = """
import time
first_line = time.time()
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"first_line": first_line, "imported": time.time()}))
"""

MODULES = {
    "einops": "einops",
    "tabulate": "tabulate",
    "humanize": "humanize",
    "termcolor": "termcolor",
    "toolz": "toolz",
    "more-itertools": "more_itertools",
    "msgpack": "msgpack",
    "orjson": "orjson",
    "pytz": "pytz",
    "tzdata": "tzdata",
    "xxhash": "xxhash",
    "zstandard": "zstandard",
}


def bundle(base: Path, name: str, requirements: tuple[str, ...]) -> str:
    """A code bundle of the program and its ``requirements.txt``; its id."""
    code = (name.encode().hex() * 64)[:64]
    where = base / "code" / code
    where.mkdir(parents=True, exist_ok=True)
    (where / "main.py").write_text(textwrap.dedent(PROGRAM))
    if requirements:
        (where / "requirements.txt").write_text("\n".join(requirements) + "\n")
    return code


def start_payload(job: str, code: str, modules: list[str]) -> dict[str, Any]:
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
            "code": code,
            "code_path": f"code/{code}.tar.gz",
            "entrypoint": ["main.py", *modules],
            "launcher": "torchrun",
            "generation": 0,
            "world_size": 1,
            "master_port": 29998,
        },
    }


def run_once(base: Path, redis_url: str, code: str, modules: list[str], cache: Path) -> dict:
    """Start the program once on a fresh agent with the environment cache ``cache``."""
    node = f"bench-{uuid.uuid4().hex[:8]}"
    settings = EnvironmentSettings(
        root=cache,
        index_url=os.environ.get("ENVIRONMENT_INDEX_URL", ""),
        timeout_s=600,
    )
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=1,
        redis_url=redis_url,
        data_dir=base / "data",
        environments=settings,
    )
    job = f"job-{uuid.uuid4().hex[:8]}"
    began, seen, sent = run_program(config, base / "code", start_payload(job, code, modules))
    started = next(r for r in sent if isinstance(r, Started))
    return {
        "start_s": seen["first_line"] - began,
        "imported_s": seen["imported"] - began,
        "environment": started.environment.describe() if started.environment else "",
    }


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the rounds, and the last round's environment line."""
    out: dict[str, Any] = {
        key: statistics.median(r[key] for r in rounds) for key in ("start_s", "imported_s")
    }
    out["environment"] = rounds[-1]["environment"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each case")
    parser.add_argument("--sets", default="none,small,medium", help="which requirement sets")
    args = parser.parse_args(argv)
    names = [name for name in args.sets.split(",") if name]
    base = Path(tempfile.mkdtemp(prefix="portal-env-bench-", dir="/var/tmp"))
    base.chmod(0o755)  # the program's own uid walks down to its code and environment
    figures: dict[str, dict[str, Any]] = {}
    try:
        redis_url = ensure_running(base / "redis")
        for name in names:
            requirements = SETS[name]
            code = bundle(base, name, requirements)
            modules = [MODULES[r.split("=")[0]] for r in requirements]
            cold, warm = [], []
            for round_ in range(args.repeat):
                cache = base / f"envs-{name}-{round_}"  # empty: nothing built or downloaded
                cold.append(run_once(base, redis_url, code, modules, cache))
                warm.append(run_once(base, redis_url, code, modules, cache))
            figures[f"{name} cold"] = median_of(cold)
            figures[f"{name} warm"] = median_of(warm)
    finally:
        stop_owned()
        shutil.rmtree(base, ignore_errors=True)
    for case, each in figures.items():
        print(
            f"{case:>12}: start {each['start_s']:.3f} s, imported {each['imported_s']:.3f} s"
            f"  [{each['environment'] or 'base layer only'}]"
        )
    result: dict[str, Any] = {"repeat": args.repeat, "cases": figures}
    if "none warm" in figures:
        for name in names:
            if name != "none":
                added = figures[f"{name} warm"]["start_s"] - figures["none warm"]["start_s"]
                result[f"{name}_warm_added_s"] = added
                print(
                    f"{name}: a warm start adds {added:+.3f} s over no environment (target <= 1 s)"
                )
    if "small cold" in figures:
        build = figures["small cold"]["start_s"] - figures["small warm"]["start_s"]
        result["small_cold_build_s"] = build
        print(f"small: a cold build takes {build:.2f} s (target <= 20 s)")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
