"""Tenant fair share: exact decayed usage, the tenant key, and its effect on every policy."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli import main
from scheduler.fairshare import FAIR_SHARE_HALF_LIFE, FairShare, parse_weights
from scheduler.policies import REGISTRY, get_policy
from scheduler.simulator import SimConfig, SimResult, simulate
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.traces import TraceJob
from scheduler.types import Scale, Snapshot, Start, TenantShare

H = 3600.0


def test_default_half_life_is_seven_days() -> None:
    assert FAIR_SHARE_HALF_LIFE == 7 * 24 * 3600


def test_usage_halves_after_one_half_life_and_saturates_at_g_h_over_ln2() -> None:
    fs = FairShare({"a": 1}, {"a": 100.0}, half_life_s=H)
    fs.advance(H, {})
    assert fs.usage["a"] == pytest.approx(50.0)
    fs = FairShare({"a": 1}, half_life_s=H)
    fs.advance(60 * H, {"a": 4})
    assert fs.usage["a"] == pytest.approx(4 * H / math.log(2))
    fs = FairShare({"a": 1}, half_life_s=H)
    fs.advance(1.0, {"a": 3})  # short step: about g x dt
    assert fs.usage["a"] == pytest.approx(3.0, rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.floats(min_value=0.1, max_value=5000.0), min_size=1, max_size=20),
    gpus=st.integers(min_value=0, max_value=64),
    start=st.floats(min_value=0.0, max_value=1e6),
)
def test_integration_is_exact_whatever_the_step(
    steps: list[float], gpus: int, start: float
) -> None:
    one = FairShare({"a": 1}, {"a": start}, half_life_s=H)
    many = FairShare({"a": 1}, {"a": start}, half_life_s=H)
    t = 0.0
    for dt in steps:
        t += dt
        many.advance(t, {"a": gpus})
    one.advance(t, {"a": gpus})
    assert many.usage["a"] == pytest.approx(one.usage["a"], rel=1e-9, abs=1e-6)


def test_key_is_usage_share_over_weight_share() -> None:
    fs = FairShare({"a": 2, "b": 1, "z": 0}, {"a": 200.0, "b": 100.0})
    assert fs.key("a") == pytest.approx(1.0) and fs.key("b") == pytest.approx(1.0)
    fs = FairShare({"a": 2, "b": 1, "z": 0}, {"a": 100.0, "b": 100.0})
    assert fs.key("a") < 1.0 < fs.key("b")
    assert fs.key("z") == math.inf  # weight 0: always last
    assert FairShare({"a": 1}).key("a") == 0.0  # nobody used anything: all equal


@pytest.mark.parametrize(
    ("weights", "usage", "half_life"),
    [
        ({"a": -1.0}, {}, H),
        ({"a": math.nan}, {}, H),
        ({"a": 1.0}, {"a": -5.0}, H),
        ({"a": 1.0}, {}, 0.0),
    ],
)
def test_bad_fair_share_input_is_refused(
    weights: dict[str, float], usage: dict[str, float], half_life: float
) -> None:
    with pytest.raises(ValueError):
        FairShare(weights, usage, half_life_s=half_life)


def test_parse_weights() -> None:
    assert parse_weights("a=2, b=1") == {"a": 2.0, "b": 1.0}
    for bad in ("", "a", "a=x", "a=-1", "=2", "a=inf"):
        with pytest.raises(ValueError):
            parse_weights(bad)


def _with_tenants(snap: Snapshot, tenants: dict[str, TenantShare]) -> Snapshot:
    return replace(snap, tenants=tenants)


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_tenant_below_its_share_starts_first(policy: str) -> None:
    snap = snapshot(
        100.0,
        cluster(1, 4),
        queued("heavy_job", 4, submit=0.0, tenant="heavy", remaining_work=10.0),
        queued("light_job", 4, submit=5.0, tenant="light", remaining_work=10.0),
    )
    pol = get_policy(policy)
    assert [d.job for d in pol.schedule(snap) if isinstance(d, Start)] == ["heavy_job"]
    shares = {"heavy": TenantShare(1.0, 5000.0), "light": TenantShare(1.0, 100.0)}
    fair = _with_tenants(snap, shares)
    assert [d.job for d in pol.schedule(fair) if isinstance(d, Start)] == ["light_job"]
    assert pol.queue_order(fair) == ["light_job", "heavy_job"]
    # weight 0 puts a tenant last even with no usage at all
    zero = _with_tenants(snap, {"heavy": TenantShare(1.0, 5000.0), "light": TenantShare(0.0, 0.0)})
    assert pol.queue_order(zero) == ["heavy_job", "light_job"]


def test_one_tenant_with_weights_decides_as_without() -> None:
    snap = snapshot(
        100.0,
        cluster(1, 8, busy=dict.fromkeys(range(4), "r")),
        running("r", (0, 1, 2, 3), submit=0.0, tenant="a", attained_service=9000.0),
        queued("q1", 4, submit=1.0, tenant="a"),
        queued("q2", 2, submit=2.0, tenant="a"),
        queued("q3", 8, submit=3.0, tenant="a"),
    )
    fair = _with_tenants(snap, {"a": TenantShare(1.0, 1e6), "b": TenantShare(5.0, 0.0)})
    for policy in REGISTRY:
        pol = get_policy(policy)
        assert pol.schedule(fair) == pol.schedule(snap), policy
        assert pol.queue_order(fair) == pol.queue_order(snap), policy


def test_elastic_reclaims_from_the_tenant_most_above_its_share_first() -> None:
    linear = {n: float(n) for n in range(1, 9)}
    sub = {n: float(min(n, 4)) + (0.5 * (n - 4) if n > 4 else 0.0) for n in range(1, 9)}
    clu = cluster(
        1, 12, busy={**dict.fromkeys(range(6), "over"), **dict.fromkeys(range(6, 12), "under")}
    )
    snap = snapshot(
        100.0,
        clu,
        # "under" gains least from its extras: by speedup alone it would lose them first
        running(
            "over",
            tuple(range(6)),
            requested_gpus=4,
            max_gpus=8,
            tenant="a",
            throughput=linear,
            queue_since=1.0,
        ),
        running(
            "under",
            tuple(range(6, 12)),
            requested_gpus=4,
            max_gpus=8,
            tenant="b",
            throughput=sub,
            queue_since=2.0,
        ),
        queued("new", 2, submit=99.0, tenant="b"),
    )
    pol = get_policy("elastic-tiresias")
    assert Scale("under", tuple(range(6, 10))) in pol.schedule(snap)
    fair = _with_tenants(snap, {"a": TenantShare(1.0, 9000.0), "b": TenantShare(1.0, 1000.0)})
    decisions = pol.schedule(fair)
    assert Scale("over", tuple(range(4))) in decisions
    assert not any(d.job == "under" for d in decisions)


def test_elastic_scale_out_gives_idle_gpus_to_the_tenant_most_below_first() -> None:
    linear = {n: float(n) for n in range(1, 9)}
    clu = cluster(
        1, 10, busy={**dict.fromkeys(range(4), "a_job"), **dict.fromkeys(range(4, 8), "b_job")}
    )
    snap = snapshot(
        100.0,
        clu,
        running("a_job", (0, 1, 2, 3), max_gpus=8, tenant="a", throughput=linear),
        running("b_job", (4, 5, 6, 7), max_gpus=8, tenant="b", throughput=linear),
    )
    pol = get_policy("elastic-tiresias")
    assert pol.schedule(snap) == [Scale("a_job", (0, 1, 2, 3, 8, 9))]  # ties: arrival order
    fair = _with_tenants(snap, {"a": TenantShare(1.0, 9000.0), "b": TenantShare(1.0, 1000.0)})
    assert pol.schedule(fair) == [Scale("b_job", (4, 5, 6, 7, 8, 9))]


def _backlogged_two_tenants(policy: str) -> tuple[SimResult, float]:
    trace = [
        TraceJob(f"{t}{i}", 0.0, 1, 60.0, tenant=t, model="resnet50")
        for i in range(300)
        for t in ("a", "b")
    ]
    cfg = SimConfig(total_gpus=8, tenant_weights={"a": 2.0, "b": 1.0})
    res = simulate(trace, get_policy(policy), cfg)
    both_backlogged = min(max(j.end for j in res.jobs if j.tenant == t) for t in "ab")
    return res, both_backlogged


@pytest.mark.parametrize("policy", ["tiresias", "elastic-tiresias", "fifo"])
def test_weights_two_to_one_get_gpu_time_two_to_one(policy: str) -> None:
    res, until = _backlogged_two_tenants(policy)
    held = {"a": 0.0, "b": 0.0}
    for j in res.jobs:  # GPU-seconds held while both tenants still had jobs waiting
        held[j.tenant] += max(0.0, min(j.end, until) - j.start) * j.gpus
    assert held["a"] / held["b"] == pytest.approx(2.0, rel=0.10)
    assert res.summary["by_tenant"]["a"]["avg_jct"] < res.summary["by_tenant"]["b"]["avg_jct"]
    assert res.summary["by_tenant"]["a"]["gpu_seconds"] == pytest.approx(300 * 60.0)


def test_without_weights_the_same_tenants_split_evenly() -> None:
    trace = [TraceJob(f"{t}{i}", 0.0, 1, 60.0, tenant=t) for i in range(100) for t in ("a", "b")]
    res = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=8))
    ends = {t: max(j.end for j in res.jobs if j.tenant == t) for t in "ab"}
    assert ends["a"] == ends["b"]
    assert "by_tenant" not in res.summary


def test_cli_reports_classes_and_tenants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs_csv = tmp_path / "jobs.csv"

    args = ["simulate", "--trace", "60_job.csv", "--servers", "2", "--gpus-per-server", "8",
            "--priority-share", "high=0.2,low=0.3", "--tenant-weights", "a=2,b=1",
            "--half-life", "86400", "--json", "--jobs-csv", str(jobs_csv)]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["by_class"]) == {"high", "normal", "low"}
    assert set(out["by_tenant"]) == {"a", "b"}
    assert sum(g["jobs"] for g in out["by_class"].values()) == out["jobs"] == 60
    rows = list(csv.DictReader(jobs_csv.open()))
    assert {r["class"] for r in rows} == {"high", "normal", "low"}
    assert {r["tenant"] for r in rows} == {"a", "b"}


@pytest.mark.parametrize(
    "bad",
    [
        ["--tenant-weights", "a=-1"],
        ["--tenant-weights", "a"],
        ["--priority-share", "urgent=0.2"],
        ["--priority-share", "high=0.9,low=0.9"],
        ["--half-life", "0"],
    ],
)
def test_cli_bad_fair_share_or_priority_options_exit_2_in_one_line(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--trace", "60_job.csv", "--servers", "2", "--gpus-per-server", "8", *bad]
    with pytest.raises(SystemExit) as exc:
        code = main(args)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


@pytest.mark.parametrize(
    ("weight", "usage"), [(-1.0, 0.0), (math.nan, 0.0), (1.0, -3.0), (1.0, math.inf)]
)
def test_bad_tenant_share_is_refused_with_a_clear_error(weight: float, usage: float) -> None:
    with pytest.raises(ValueError, match="tenant share"):
        TenantShare(weight, usage)
