"""The agent's hardware report: NVML (faked at the library boundary), its absence, its failure."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.agent.hardware import HardwareProbe, host_memory_mib, load_nvml, probe_for
from workers.protocol import Heartbeat, ProtocolError, Report
from workers.tests.fake_nvml import FakeNvml, fake_gpus


def test_nvml_reports_each_gpu_with_its_health() -> None:
    nvml = FakeNvml(fake_gpus("n", 2, temperature_c=70, utilization=85, used_mib=2048))
    nvml.gpus[1].ecc_uncorrected = None  # a GPU without ECC: not reported, not 0
    report = HardwareProbe(nvml, cuda=False).report()
    assert (report.source, report.health, len(report.gpus)) == ("nvml", "nvml", 2)
    first, second = report.gpus
    assert (first.model, first.memory_mib, first.uuid) == (
        "NVIDIA A100-SXM4-40GB",
        40960,
        "GPU-n-0000",
    )
    assert first.health is not None and second.health is not None
    assert (first.health.temperature_c, first.health.utilization_pct) == (70.0, 85.0)
    assert (first.health.memory_used_mib, first.health.ecc_uncorrected) == (2048.0, 0)
    assert second.health.ecc_uncorrected is None
    assert report.cpu_cores > 0 and report.memory_mib > 0


def test_an_agent_restricted_to_some_gpus_reports_only_those() -> None:
    nvml = FakeNvml(fake_gpus("n", 4))
    report = HardwareProbe(nvml, cuda=False, only=["GPU-n-0002"]).report()
    assert [g.uuid for g in report.gpus] == ["GPU-n-0002"]


def test_without_nvml_it_says_so_once_and_invents_nothing(caplog: Any) -> None:
    with caplog.at_level(logging.INFO, logger="workers.agent.hardware"):
        probe = HardwareProbe(None, cuda=False)
        reports = [probe.report() for _ in range(3)]
    assert [r.message for r in caplog.records].count(
        "GPU health not reported: NVML (pynvml) is not available on this node"
    ) == 1
    assert all((r.source, r.health, r.gpus) == ("none", "none", ()) for r in reports)


def test_a_failing_nvml_falls_back_to_nothing_reported() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    assert HardwareProbe(Broken(), cuda=False).report().source == "none"


def test_load_nvml_is_an_optional_import() -> None:
    def missing(name: str) -> Any:
        raise ImportError(name)

    assert load_nvml(missing) is None
    fake = FakeNvml(fake_gpus("n", 1))
    assert load_nvml(lambda name: fake if name == "pynvml" else missing(name)) is fake


def test_host_memory_reads_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")
    assert host_memory_mib(meminfo) == 16000
    assert host_memory_mib(tmp_path / "absent") > 0  # the page count


def test_the_heartbeat_carries_it_and_hostile_figures_are_refused() -> None:
    hardware = HardwareProbe(FakeNvml(fake_gpus("n", 1)), cuda=False).report()
    beat = Heartbeat(
        node="n", device="cpu", slots=1, free_slots=(0,), workers=(), hardware=hardware
    )
    data = beat.to_dict()
    assert Report.from_dict(data) == beat
    for path, value in [
        (("gpus", 0, "health", "temperature_c"), 1e9),
        (("gpus", 0, "health", "ecc_uncorrected"), -1),
        (("gpus", 0, "model"), "x" * 97),
        (("gpus", 0, "memory_mib"), "40960"),
        (("cpu_cores",), 10**9),
        (("source",), "made-up"),
    ]:
        bad: Any = Report.from_dict(data).to_dict()
        target = bad["hardware"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(ProtocolError):
            Report.from_dict(bad)
    bad = Report.from_dict(data).to_dict()
    bad["hardware"]["gpus"] = bad["hardware"]["gpus"] * 65
    with pytest.raises(ProtocolError, match="more than 64"):
        Report.from_dict(bad)


def test_which_agents_read_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A --cpu agent reads no GPU unless AGENT_HARDWARE=nvml; none turns every agent off."""
    fake = FakeNvml(fake_gpus("n", 1))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert probe_for("cpu", mode="auto").nvml is None
    assert probe_for("cpu", mode="nvml").nvml is fake
    assert probe_for("cuda", mode="auto").nvml is fake
    assert probe_for("cuda", mode="none").nvml is None
    monkeypatch.setenv("AGENT_HARDWARE", "nvml")
    assert probe_for("cpu").report().source == "nvml"
