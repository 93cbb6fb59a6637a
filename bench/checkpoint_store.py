"""Benchmark: what a checkpoint in the artifact store costs against a plain ``torch.save``.

Rank 0 of a job saves its snapshot (model + optimizer) every N mini-batches
and a restarted job loads the newest one.  Since issue 12 the snapshot goes
to the job's prefix in the store (a shared directory or S3), with a sha256
manifest, the keep rule, and a verified, ``weights_only`` load.  This
measures, for a ResNet-18-sized snapshot (about 90 MB with SGD momentum):

* baseline: ``torch.save`` to a local file + ``os.replace`` (what the runtime
  did before, minus nothing) and ``torch.load`` back;
* ``file://`` store: ``Checkpoints.save`` / ``Checkpoints.load_latest``;
* ``s3://`` store: the same against moto's S3 server on loopback (an upper
  bound on protocol overhead: moto is a Python server in this process);
* the store door (issue 34): the same ``file://`` store as a program reaches
  it, through its agent's Unix socket (``workers.agent.door``), served by a
  ``StoreDoors`` in this process.

It prints the median of ``--repeat`` rounds per case and the ratio to the
baseline; the last line is one JSON object.

    .venv/bin/python bench/checkpoint_store.py
    .venv/bin/python bench/checkpoint_store.py --repeat 5 --no-s3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from workers.agent.door import StoreDoors  # noqa: E402
from workers.elastic.checkpoint import Checkpoints  # noqa: E402
from workers.store_door import open_store  # noqa: E402


def snapshot() -> dict[str, Any]:
    """A training snapshot the size of ResNet-18's (11.7 M parameters, SGD with momentum)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024), torch.nn.Linear(1024, 1000)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}


def timed(action: Callable[[], object], repeat: int) -> float:
    """The median seconds of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def baseline(directory: Path, state: dict[str, Any], repeat: int) -> tuple[float, float]:
    path = directory / "plain.pt"

    def save() -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(buffer.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    save()
    return timed(save, repeat), timed(lambda: torch.load(path, weights_only=True), repeat)


def in_store(url: str, state: dict[str, Any], repeat: int) -> tuple[float, float]:
    checkpoints = Checkpoints(open_store(url), keep=2)
    steps = iter(range(1, 10_000))
    checkpoints.save(0, state)
    save = timed(lambda: checkpoints.save(next(steps), state), repeat)
    load = timed(checkpoints.load_latest, repeat)
    return save, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 case")
    options = parser.parse_args()
    torch.set_num_threads(1)
    state = snapshot()
    size_mb = len(_bytes(state)) / 2**20
    results: dict[str, Any] = {"snapshot_mb": round(size_mb, 1), "repeat": options.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        base_save, base_load = baseline(Path(tmp), state, options.repeat)
        results["baseline"] = {"save_s": base_save, "load_s": base_load}
        cases = {"file": f"file://{tmp}/store/tenants/t/jobs/1"}
        doors = StoreDoors(Path(tmp) / "doors", "bench")
        cases["file (door)"] = doors.open("job-1", f"file://{tmp}/store/tenants/t/jobs/2", None)
        s3_server = None
        if not options.no_s3:
            from devtools.s3_server import moto_s3

            s3_server = moto_s3("bench")
            s3 = s3_server.__enter__()
            os.environ.update(s3.env)
            cases["s3 (moto)"] = f"{s3.url}/tenants/t/jobs/1"
        try:
            for name, url in cases.items():
                save, load = in_store(url, state, options.repeat)
                results[name] = {
                    "save_s": save,
                    "load_s": load,
                    "save_ratio": save / base_save,
                    "load_ratio": load / base_load,
                }
        finally:
            doors.close_all()
            if s3_server is not None:
                s3_server.__exit__(None, None, None)
    print(f"snapshot {size_mb:.1f} MB, median of {options.repeat}")
    print(f"{'case':<14} {'save s':>8} {'load s':>8} {'save x':>8} {'load x':>8}")
    print(f"{'baseline':<14} {base_save:>8.3f} {base_load:>8.3f} {1:>8.2f} {1:>8.2f}")
    for name in cases:
        row = results[name]
        print(
            f"{name:<14} {row['save_s']:>8.3f} {row['load_s']:>8.3f} "
            f"{row['save_ratio']:>8.2f} {row['load_ratio']:>8.2f}"
        )
    print(json.dumps(results))


def _bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


if __name__ == "__main__":
    main()
