"""Speed factors per GPU type and the mixed-cluster simulator (issue 38)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.policies import get_policy
from scheduler.policies.elastic import curve_limit
from scheduler.sim_types import TypePool, assign_types, parse_pools, simulate_mixed
from scheduler.simulator import SimConfig, simulate
from scheduler.throughput import speedup_over_one, type_speedup
from scheduler.traces import TraceJob, load_tiresias, poisson_workload


def test_a_faster_type_gains_its_speed_on_one_gpu_and_less_where_the_network_binds() -> None:
    one = type_speedup("vgg16", 1, speed=2.0)
    many = type_speedup("vgg16", 64, speed=2.0)
    assert 1.8 < one < 2.0  # the fixed per-iteration overhead does not speed up
    assert 1.0 < many < one
    assert type_speedup("vgg16", 64) == 1.0


def test_a_faster_type_reaches_its_network_limit_at_fewer_gpus() -> None:
    def limit(speed: float) -> int:
        return curve_limit(lambda n: speedup_over_one("inception3", n, 8, speed), 1, 512)

    assert limit(2.0) == 8 < limit(1.0) == 124  # the faster type stops at one server


def test_a_job_alone_on_a_faster_type_ends_sooner_by_its_type_speedup() -> None:
    trace = [TraceJob("a", 0.0, 2, 1000.0, model="resnet50")]
    for policy in ("tiresias", "elastic-tiresias"):
        cfg = SimConfig(total_gpus=2, gpu_speed=2.0)
        jct = simulate(trace, get_policy(policy), cfg).jobs[0].jct
        assert jct == pytest.approx(1000.0 / type_speedup("resnet50", 2, speed=2.0))


def _trace() -> list[TraceJob]:
    return list(poisson_workload(jobs=120, total_gpus=16, load=0.9, sizes=(1, 2, 4),
                                 size_weights=(0.5, 0.3, 0.2), seed=3).jobs)  # fmt: skip


def test_each_job_runs_on_the_pool_of_its_type() -> None:
    trace = _trace()
    types = assign_types(trace, {"a100": 0.75, "h100": 0.25}, seed=38)
    assert types == assign_types(trace, {"a100": 0.75, "h100": 0.25}, seed=38)
    pools = parse_pools("a100:12,h100:4", "h100:2")
    result = simulate_mixed(trace, lambda: get_policy("tiresias"), SimConfig(total_gpus=16),
                            pools, types)  # fmt: skip
    for name, sim in result.by_type.items():
        assert {job.id for job in sim.jobs} == {j for j, t in types.items() if t == name}
    summary = result.summary()
    assert summary["jobs"] == len(trace)
    assert summary["by_type"]["h100"]["speed"] == 2.0


def test_one_pool_of_speed_one_is_the_plain_simulator() -> None:
    trace = _trace()
    cfg = SimConfig(total_gpus=16)
    for policy in ("tiresias", "elastic-tiresias"):
        make = functools.partial(get_policy, policy)
        mixed = simulate_mixed(trace, make, cfg, (TypePool("", 16),),
                               dict.fromkeys((j.id for j in trace), ""))  # fmt: skip
        assert mixed.by_type[""].summary == simulate(trace, get_policy(policy), cfg).summary


@pytest.mark.parametrize(
    ("types", "speeds", "words"),
    [("a100:x", "", "cluster types"), ("a100:1.5", "", "whole number"),
     ("a100:8", "h100:2", "must name a cluster type"), ("a100:8", "a100:0", "speed > 0")],
)  # fmt: skip
def test_bad_pools_are_one_line_errors_naming_the_option(
    types: str, speeds: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        parse_pools(types, speeds)


def test_a_job_of_a_type_no_pool_has_is_refused() -> None:
    trace = _trace()[:3]
    with pytest.raises(ValueError, match="v100"):
        simulate_mixed(trace, lambda: get_policy("fifo"), SimConfig(total_gpus=4),
                       (TypePool("a100", 4),), dict.fromkeys((j.id for j in trace), "v100"))  # fmt: skip


def test_a_trace_column_types_its_jobs_and_the_mix_types_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "job_id,num_gpu,submit_time,duration,gpu_type\n1,1,0,100,h100\n2,2,5,100,\n3,1,9,100,a100\n"
    )
    trace = load_tiresias(path).jobs
    assert [j.gpu_type for j in trace] == ["h100", "", "a100"]
    types = assign_types(trace, {"v100": 1.0}, seed=0)
    assert types == {"1": "h100", "2": "v100", "3": "a100"}
    with pytest.raises(ValueError, match="job 2 has no gpu_type"):
        assign_types(trace, {}, seed=0)


def test_a_mixed_replay_is_by_count_and_says_so() -> None:
    trace = _trace()[:3]
    with pytest.raises(ValueError, match="replays by count"):
        simulate_mixed(trace, lambda: get_policy("fifo"), SimConfig(total_gpus=4, placement="vclos"),
                       (TypePool("a100", 4),), dict.fromkeys((j.id for j in trace), "a100"))  # fmt: skip


def test_the_command_line_runs_a_mixed_cluster_per_type(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--trace-format", "poisson", "--jobs", "60", "--servers", "2",
            "--gpus-per-server", "8", "--max-gpus", "4", "--policies", "tiresias,elastic-tiresias",
            "--cluster-types", "a100:12,h100:4", "--speeds", "h100:2",
            "--gpu-mix", "a100:0.75,h100:0.25", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    for policy in ("tiresias", "elastic-tiresias"):
        summary = out["results"][policy]
        by_type = summary["by_type"]
        assert by_type["h100"]["speed"] == 2.0 and by_type["a100"]["gpus"] == 12
        assert by_type["a100"]["jobs"] + by_type["h100"]["jobs"] == summary["jobs"] > 40


@pytest.mark.parametrize(
    ("extra", "words"),
    [(["--speeds", "h100:2"], "need --cluster-types"),
     (["--cluster-types", "a100:8", "--placement", "vclos"], "replays by count"),
     (["--cluster-types", "a100:x"], "cluster types")],
)  # fmt: skip
def test_bad_type_options_are_one_line_errors(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace-format", "poisson", "--jobs", "10", "--servers", "1",
            "--gpus-per-server", "8", *extra]  # fmt: skip
    assert main(argv) == 2
    assert words in capsys.readouterr().err
