"""The ``--device cuda`` paths, checked on a machine without a GPU: what gets built, and where.

Nothing here needs CUDA: it checks the choices (backend, devices, command
lines) that the GPU run makes, so that ``bench/device_check.sh`` on a GPU
machine runs what was meant. A build of torch without NCCL says so clearly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

# torch.distributed re-exports it from here; its stub does not say so.
from torch._C._distributed_c10d import HashStore

from devtools.elastic import JobRun, check_devices, cuda_layout, device_layout
from workers.elastic import comm
from workers.elastic.cli import WorkerArgumentError, communicator_backend, parse_options

BASE = ["--job", "j", "--worker", "w0", "--workload", "mlp-digits", "--batch-size", "8",
        "--store-url", "/tmp/x", "--redis-url", "redis://h/0"]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "choice", "backend"),
    [
        ("cpu", "auto", "gloo"),
        ("cuda:0", "auto", "nccl"),
        ("cuda:3", "nccl", "nccl"),
        ("cuda:0", "gloo", "gloo"),  # several workers on one GPU
        ("cpu", "gloo", "gloo"),
    ],
)
def test_the_backend_follows_device_and_comm(device: str, choice: str, backend: str) -> None:
    assert communicator_backend(device, choice) == backend
    options = parse_options([*BASE, "--device", device, "--comm", choice])
    assert (options.device, options.backend) == (device, backend)


def test_nccl_without_a_cuda_device_is_refused() -> None:
    with pytest.raises(WorkerArgumentError, match="--comm nccl needs a CUDA --device"):
        parse_options([*BASE, "--comm", "nccl"])
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse_options([*BASE, "--comm", "mpi"])


@pytest.mark.skipif(dist.is_nccl_available(), reason="this torch has NCCL: nothing to refuse")
def test_an_nccl_group_without_nccl_fails_with_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="NCCL is not available"):
        comm.build_group(HashStore(), 0, 0, 1, torch.device("cuda:0"), 5.0, "nccl")


def test_job_run_puts_workers_where_the_device_says(redis_url: str, tmp_path: Path) -> None:
    one_gpu = JobRun(redis_url, "dev1", tmp_path / "a", device="cuda:0", comm="gloo")
    cmd = one_gpu.command("w3", 4, [])
    assert cmd[cmd.index("--device") + 1] == "cuda:0" and cmd[cmd.index("--comm") + 1] == "gloo"
    spread = JobRun(redis_url, "dev2", tmp_path / "b", device="cuda", comm="nccl")
    gpus = max(1, torch.cuda.device_count())
    assert spread.device_for("w5") == f"cuda:{5 % gpus}"
    assert JobRun(redis_url, "dev3", tmp_path / "c").device_for("w1") == "cpu"
    options = parse_options(one_gpu.command("w3", 4, [])[3:])
    assert (options.device, options.backend) == ("cuda:0", "gloo")


def test_the_benchmark_on_cuda_spreads_workers_over_gpus_or_shares_one_by_gloo() -> None:
    assert cuda_layout(1, 6) == ("cuda:0", "gloo")
    assert cuda_layout(5, 6) == ("cuda:0", "gloo")
    assert cuda_layout(8, 6) == ("cuda", "nccl")
    with pytest.raises(SystemExit, match="no CUDA device"):
        cuda_layout(0, 6)
    assert device_layout("cpu", 6) == ("cpu", "gloo")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            device_layout("cuda", 6)


def test_the_benchmark_refuses_a_run_whose_models_were_not_on_the_device() -> None:
    on_cuda = [{"device": "cuda:0"}, {"device": "cuda:0"}]
    assert check_devices(on_cuda, "cuda") == ["cuda:0"]
    with pytest.raises(SystemExit, match="not on cuda"):
        check_devices([*on_cuda, {"device": "cpu"}], "cuda")
    with pytest.raises(SystemExit):
        check_devices([{}], "cpu")  # a record without the field: not checked
