"""GPU slots by UUID: the driver's description read, the agent's own restriction obeyed, and
only a program's own GPUs' device nodes in its sandbox.

This machine has no GPU: the driver's ``/proc/driver/nvidia/gpus`` tree and ``/dev`` are laid
out in a temporary directory as the driver makes them.
"""

from __future__ import annotations

from pathlib import Path

from workers.agent.gpus import (
    GpuDevice,
    cuda_visible,
    device_nodes,
    host_gpus,
    parse_information,
    slot_devices,
)
from workers.agent.launch import worker_argv
from workers.agent.programs import (
    JobDirs,
    builtin_env,
    edl_env,
    program_slots,
    torchrun_env,
)
from workers.agent.warm import warm_env
from workers.tests.test_sandbox_units import config, start

INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 0
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.99.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""

GPUS = tuple(GpuDevice(f"GPU-{i}aaaaaaa-0000-1111-2222-33333333333{i}", minor=i) for i in range(4))


def driver_tree(root: Path) -> Path:
    """Four GPUs whose bus order is not their minor order's reverse, as on real hosts."""
    proc = root / "gpus"
    for gpu in GPUS:
        bus = f"0000:{0x18 + 0x10 * gpu.minor:02x}:00.0"
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(
            INFORMATION.format(uuid=gpu.uuid, bus=bus, minor=gpu.minor)
        )
    (proc / "0000:ff:00.0").mkdir()  # a bus whose description cannot be read
    return proc


def test_the_drivers_description_gives_each_gpus_uuid_and_minor(tmp_path: Path) -> None:
    assert parse_information(INFORMATION.format(uuid=GPUS[2].uuid, bus="x", minor=2)) == GPUS[2]
    assert parse_information("Model: something\n") is None
    assert host_gpus(driver_tree(tmp_path)) == list(GPUS)
    assert host_gpus(tmp_path / "missing") == []


def test_slots_follow_the_agents_own_cuda_visible_devices() -> None:
    assert slot_devices(GPUS, None, 2) == GPUS[:2]
    assert slot_devices(GPUS, "2,0", 2) == (GPUS[2], GPUS[0])
    assert slot_devices(GPUS, f"{GPUS[3].uuid},GPU-1aaa", 2) == (GPUS[3], GPUS[1])  # prefixes
    assert slot_devices(GPUS, "1,1", 2) == ()  # one GPU twice: cannot be right
    assert slot_devices(GPUS, "7", 1) == () and slot_devices(GPUS, "GPU-nope", 1) == ()
    assert slot_devices(GPUS, "3", 2) == ()  # fewer GPUs than slots
    assert slot_devices((), None, 2) == ()  # no driver description: fall back


def test_a_sandbox_gets_only_its_gpus_nodes_and_the_control_ones(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    mine = (GPUS[2], GPUS[0])
    assert device_nodes(mine, [1], dev) == (dev / "nvidia0", dev / "nvidiactl", dev / "nvidia-uvm")
    assert device_nodes(mine, [0, 1], dev)[:2] == (dev / "nvidia2", dev / "nvidia0")
    assert len(device_nodes((), [0], dev)) == 6  # unknown GPUs: every /dev/nvidia* as before
    assert cuda_visible(mine, [1, 0]) == f"{GPUS[0].uuid},{GPUS[2].uuid}"
    assert cuda_visible((), [1, 0]) == "1,0"


def test_processes_name_their_gpus_by_uuid_and_see_only_them(tmp_path: Path) -> None:
    """An agent restricted to GPUs 3, 2, 1, 0 (in that order): slot 2 is GPU 1, not GPU 2."""
    cfg = config(tmp_path, device="cuda", gpus=(GPUS[3], GPUS[2], GPUS[1], GPUS[0]))
    command = start()  # workers a (slot 2) and b (slot 3)
    dirs = JobDirs(cfg.job_dir("j1"))
    torchrun = torchrun_env(cfg, command, command.workers[0], dirs)
    assert torchrun["CUDA_VISIBLE_DEVICES"] == f"{GPUS[1].uuid},{GPUS[0].uuid}"
    assert program_slots(command, command.workers[0]) == [2, 3]
    edl = start("edl")
    env = edl_env(cfg, edl, edl.workers[1], dirs, "redis://job@x/0")
    assert env["CUDA_VISIBLE_DEVICES"] == GPUS[0].uuid
    assert program_slots(edl, edl.workers[1]) == [3]
    builtin = start()
    object.__setattr__(builtin, "program", None)
    assert builtin_env(cfg, builtin, "a", "redis://job@x/0")["CUDA_VISIBLE_DEVICES"] == (
        GPUS[1].uuid
    )
    argv = worker_argv(cfg, builtin, builtin.workers[0])
    assert argv[argv.index("--device") + 1] == "cuda:0"  # its one visible GPU
    assert warm_env(cfg, 3)["CUDA_VISIBLE_DEVICES"] == GPUS[0].uuid
    unknown = config(tmp_path, device="cuda")  # no driver description: slot k is cuda:k
    assert worker_argv(unknown, builtin, builtin.workers[0])[argv.index("--device") + 1] == (
        "cuda:2"
    )
