"""GPU types and node selectors in the pure pass (issue 38): a job holds GPUs of one type it
accepts, on servers its selector matches, in every policy; quotas per type; the reasons."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.forecast import forecast
from scheduler.gpu_types import (
    GpuType,
    is_typed,
    never_satisfiable,
    parse_selector,
    parse_type_numbers,
    split_by_type,
    weighted_gpu_seconds,
)
from scheduler.pipeline import CountBind, PolicyDecide, QuotaHoldBack, TypeHoldBack, snapshot_pass
from scheduler.policies import get_policy
from scheduler.quota import QuotaBook
from scheduler.tests.builders import cluster, queued, running, snapshot, typed_cluster
from scheduler.throughput import curve, type_speedup
from scheduler.types import Decision, JobView, Scale, Snapshot, Start

POLICIES = ("tiresias", "elastic-tiresias", "fifo", "srtf")
A100, H100 = "a100", "h100"
#: Two A100 servers (GPUs 0-7), one H100 server (GPUs 8-11).
POOLS = ((A100, 2), (H100, 1))
LINEAR = {n: 100.0 * n for n in range(1, 13)}


def _types_of(decision: Decision, clu_pools: tuple[tuple[str, int], ...] = POOLS) -> set[str]:
    gpus = {g.id: g.gpu_type for g in typed_cluster(clu_pools).gpus}
    return {gpus[g] for g in getattr(decision, "gpus", ())}


def _gpus_by_job(decisions: list[Decision]) -> dict[str, tuple[int, ...]]:
    return {d.job: d.gpus for d in decisions if isinstance(d, Start | Scale)}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_asking_for_h100_never_gets_a100_even_when_only_a100_is_free(policy: str) -> None:
    busy = dict.fromkeys(range(8, 12), "x")  # the H100 server is full
    clu = typed_cluster(POOLS, busy=busy)
    snap = snapshot(
        0,
        clu,
        running("x", (8, 9, 10, 11), gpu_types=(H100,), remaining_work=1e6),
        queued("b", 2, submit=1, gpu_types=(H100,)),
        queued("any", 2, submit=2),
    )
    decisions = get_policy(policy).schedule(snap)
    placed = _gpus_by_job(decisions)
    assert "b" not in placed  # it waits for H100s rather than take A100s
    assert _types_of(Start("any", placed["any"])) == {A100}


@pytest.mark.parametrize("policy", POLICIES)
def test_each_start_is_of_one_type_it_accepts(policy: str) -> None:
    clu = typed_cluster(POOLS)
    snap = snapshot(
        0,
        clu,
        queued("h", 4, gpu_types=(H100,)),
        queued("pref-a", 4, submit=1, gpu_types=(A100, H100)),
        queued("big", 8, submit=2),  # fits only the A100s
    )
    decisions = get_policy(policy).schedule(snap)
    placed = _gpus_by_job(decisions)
    assert _types_of(Start("h", placed["h"])) == {H100}
    assert _types_of(Start("p", placed["pref-a"])) == {A100}
    assert "big" not in placed or _types_of(Start("b", placed["big"])) == {A100}
    for d in decisions:
        assert len(_types_of(d)) <= 1


def test_elastic_scale_out_takes_only_its_own_type_and_the_other_stays_idle() -> None:
    # An H100 job allowed 12 GPUs on a linear curve: 8 A100s are idle, it still grows
    # only to the 4 H100s (never straddles types).
    clu = typed_cluster(POOLS, busy={8: "h"})
    view = running("h", (8,), throughput=LINEAR, max_gpus=12, remaining_work=1e5)
    decisions = get_policy("elastic-tiresias").schedule(snapshot(0, clu, view))
    (scale,) = decisions
    assert isinstance(scale, Scale) and sorted(scale.gpus) == [8, 9, 10, 11]


def test_an_elastic_start_of_any_type_gets_extras_of_its_start_type_only() -> None:
    clu = typed_cluster(POOLS)
    view = queued("e", 2, gpu_types=(H100, A100), min_gpus=1, max_gpus=12, throughput=LINEAR)
    decisions = get_policy("elastic-tiresias").schedule(snapshot(0, clu, view))
    (start,) = decisions
    assert isinstance(start, Start) and _types_of(start) == {H100} and len(start.gpus) == 4


def test_reclaim_takes_extras_only_from_the_newcomers_type() -> None:
    # "a" holds all 4 H100s as extras over its 1 requested; "b" on the A100s holds 8 as
    # extras over 1.  A queued H100 job of 2 reclaims from "a", never from "b".
    clu = typed_cluster(
        POOLS, busy={**dict.fromkeys(range(8), "b"), **dict.fromkeys(range(8, 12), "a")}
    )
    a = running("a", (8, 9, 10, 11), requested_gpus=1, min_gpus=1, max_gpus=4,
                throughput=LINEAR, remaining_work=1e5)  # fmt: skip
    b = running("b", tuple(range(8)), requested_gpus=1, min_gpus=1, max_gpus=8,
                throughput=LINEAR, remaining_work=1e5)  # fmt: skip
    c = queued("c", 2, submit=5, gpu_types=(H100,))
    decisions = get_policy("elastic-tiresias").schedule(snapshot(10, clu, a, b, c))
    touched = {d.job for d in decisions}
    assert "b" not in touched and "a" in touched
    placed = _gpus_by_job(decisions)
    assert _types_of(Start("c", placed["c"])) == {H100}


def test_one_type_and_no_request_is_not_typed_so_the_pass_is_todays() -> None:
    snap = snapshot(0, cluster(2), queued("a", 4))
    assert not is_typed(snap) and split_by_type(snap) is None
    named = typed_cluster(((A100, 2),))
    assert not is_typed(snapshot(0, named, queued("a", 4)))
    assert is_typed(snapshot(0, named, queued("a", 4, gpu_types=(A100,))))


def _pass(quota: dict[str, int] | None, type_quota: dict[str, dict[str, int]] | None):  # type: ignore[no-untyped-def]
    return snapshot_pass(
        TypeHoldBack(QuotaHoldBack(quota, type_quota)),
        PolicyDecide(get_policy("tiresias")),
        CountBind(),
    )


def test_a_per_type_quota_holds_and_the_other_type_stays_open() -> None:
    # Tenant t may hold 4 H100s (and 16 GPUs in all): it holds 4 on H100; a second H100
    # job waits with the reason, an any-type job of t starts on A100s.
    clu = typed_cluster(((A100, 2), (H100, 2)), busy=dict.fromkeys(range(8, 12), "r"))
    views = (
        running("r", (8, 9, 10, 11), tenant="t", gpu_types=(H100,), remaining_work=1e6),
        queued("h", 4, submit=1, tenant="t", gpu_types=(H100,)),
        queued("any", 4, submit=2, tenant="t"),
    )
    result = _pass({"t": 16}, {"t": {H100: 4}}).run(snapshot(0, clu, *views))
    started = _gpus_by_job(result.decisions)
    assert "h" not in started
    assert result.waits["h"] == "tenant t holds 4 of its 4-GPU quota of h100"
    assert _types_of(Start("any", started["any"]), ((A100, 2), (H100, 2))) == {A100}


def test_the_quota_check_cuts_starts_of_one_type_to_its_quota() -> None:
    # Two H100 jobs of 4 fit the 8 free H100s, but t's H100 quota is 4: one starts.
    clu = typed_cluster(((A100, 2), (H100, 2)))
    views = (
        queued("h1", 4, tenant="t", gpu_types=(H100,)),
        queued("h2", 4, submit=1, tenant="t", gpu_types=(H100,)),
    )
    result = _pass(None, {"t": {H100: 4}}).run(snapshot(0, clu, *views))
    assert set(_gpus_by_job(result.decisions)) == {"h1"}
    assert "quota of h100" in result.waits["h2"]


def test_a_selector_that_matches_no_server_waits_with_the_reason() -> None:
    labels = {0: (("pool", "train"),), 2: (("pool", "train"),)}
    clu = typed_cluster(POOLS, labels=labels)
    job = queued("s", 2, selector=parse_selector("pool=interactive"))
    result = _pass(None, None).run(snapshot(0, clu, job))
    assert result.decisions == []
    assert result.waits["s"] == "no server has GPUs of any type on servers with pool=interactive"
    assert never_satisfiable(clu, (), job.selector, 2) == result.waits["s"]
    assert never_satisfiable(clu, (H100,), parse_selector("pool=train"), 4) is None
    assert never_satisfiable(clu, (H100,), (), 5) == (
        "needs 5 GPUs of one type (h100); the most there are is 4"
    )


def test_a_selector_places_only_on_matching_servers() -> None:
    labels = {1: (("rack", "r2"),)}  # only the second A100 server (GPUs 4-7)
    clu = typed_cluster(POOLS, labels=labels)
    job = queued("s", 2, selector=(("rack", "r2"),))
    for policy in POLICIES:
        placed = _gpus_by_job(get_policy(policy).schedule(snapshot(0, clu, job)))
        assert set(placed["s"]) <= {4, 5, 6, 7}


@pytest.mark.parametrize("text", ["pool", "=x", "pool="])
def test_a_bad_selector_names_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"^selector: "):
        parse_selector(text)


def test_type_numbers_parse_and_refuse_bad_input() -> None:
    assert parse_type_numbers("a100:48,h100:16", "cluster types") == {A100: 48, H100: 16}
    with pytest.raises(ValueError, match="cluster types"):
        parse_type_numbers("a100:x", "cluster types")


def test_fair_share_weights_per_type_count_an_h100_hour_as_two() -> None:
    types = {H100: GpuType(H100, speed=2.0, weight=2.0), A100: GpuType(A100)}
    assert weighted_gpu_seconds({A100: 3600.0, H100: 3600.0}, types) == 3 * 3600.0
    assert weighted_gpu_seconds({"v100": 10.0}, types) == 10.0
    with pytest.raises(ValueError, match="weight"):
        GpuType("x", weight=0.0)


def test_the_forecast_starts_an_h100_job_when_the_h100s_free_not_when_a100s_idle() -> None:
    # The A100s are idle all along; the H100 job waits for the running H100 job to end.
    clu = typed_cluster(POOLS, busy=dict.fromkeys(range(8, 12), "r"))
    snap = snapshot(
        100.0,
        clu,
        running("r", (8, 9, 10, 11), remaining_work=300.0),
        queued("h", 4, submit=50.0, gpu_types=(H100,), remaining_work=120.0),
        queued("a", 4, submit=60.0, gpu_types=(A100,), remaining_work=60.0),
    )
    for policy in ("fifo", "tiresias"):
        result = forecast(snap, get_policy(policy))
        assert result.estimates["h"].start == pytest.approx(300.0)
        assert result.estimates["a"].start == pytest.approx(0.0)


def _random_typed_snapshot(rng: random.Random) -> Snapshot:
    """A mixed cluster of 2-3 types with running jobs each on one type, and queued jobs
    asking for some types (or none), some elastic."""
    names = rng.sample(["a100", "h100", "l4"], rng.randint(2, 3))
    pools = tuple((name, rng.randint(1, 3)) for name in names)
    base = typed_cluster(pools)
    free = {name: [g.id for g in base.gpus if g.gpu_type == name] for name in names}
    busy: dict[int, str] = {}
    views: list[JobView] = []
    for k in range(rng.randint(0, 4)):
        name = rng.choice(names)
        take = free[name][: rng.randint(1, 4)]
        if not take:
            continue
        free[name] = free[name][len(take) :]
        job = f"r{k}"
        busy.update(dict.fromkeys(take, job))
        views.append(running(job, tuple(take), submit=k, remaining_work=rng.uniform(10, 1e4),
                             attained_service=rng.uniform(0, 1e4), min_gpus=1,
                             max_gpus=rng.choice((0, 8)), throughput=LINEAR))  # fmt: skip
    for k in range(rng.randint(1, 6)):
        accepts = tuple(rng.sample(names, rng.randint(0, len(names))))
        views.append(queued(f"q{k}", rng.choice((1, 2, 4)), submit=10 + k, gpu_types=accepts,
                            remaining_work=rng.uniform(10, 1e4), min_gpus=rng.choice((0, 1)),
                            max_gpus=rng.choice((0, 8)), throughput=LINEAR))  # fmt: skip
    return snapshot(20.0, typed_cluster(pools, busy=busy), *views)


@pytest.mark.parametrize("policy", POLICIES)
def test_random_typed_snapshots_never_straddle_types_nor_leave_a_jobs_type(policy: str) -> None:
    rng = random.Random(f"types-{policy}")
    for _ in range(150):
        snap = _random_typed_snapshot(rng)
        types = {g.id: g.gpu_type for g in snap.cluster.gpus}
        views = {v.id: v for v in snap.jobs}
        given: list[int] = []
        for decision in get_policy(policy).schedule(snap):
            if not isinstance(decision, Start | Scale):
                continue
            view = views[decision.job]
            held = {types[g] for g in decision.gpus}
            assert len(held) == 1, (decision, held)
            if view.gpus:
                assert held == {types[view.gpus[0]]}  # a running job stays on its type
            elif view.gpu_types:
                assert held <= set(view.gpu_types)
            given.extend(g for g in decision.gpus if g not in view.gpus)
        assert len(given) == len(set(given))  # no GPU handed out twice


def test_a_job_scales_out_by_its_curve_on_the_type_it_runs_on() -> None:
    # Linear on A100s, flat past 2 GPUs on the (faster) H100s: on the H100s it grows to 2.
    flat_after_2 = {n: 300.0 * min(n, 2) for n in range(1, 13)}
    clu = typed_cluster(POOLS, busy={8: "h"})
    view = running("h", (8,), throughput=LINEAR, max_gpus=12, remaining_work=1e5,
                   throughput_by_type={H100: flat_after_2, A100: LINEAR})  # fmt: skip
    (scale,) = get_policy("elastic-tiresias").schedule(snapshot(0, clu, view))
    assert isinstance(scale, Scale) and len(scale.gpus) == 2
    untyped = dataclasses.replace(view, throughput_by_type=None)
    (scale,) = get_policy("elastic-tiresias").schedule(snapshot(0, clu, untyped))
    assert isinstance(scale, Scale) and len(scale.gpus) == 4  # the linear curve: all 4


def test_throughput_curves_per_type_come_from_the_speed() -> None:
    ref = curve("vgg16", 16)
    fast = curve("vgg16", 16, speed=2.0)
    assert fast[1] == pytest.approx(ref[1] * type_speedup("vgg16", 1, speed=2.0))
    assert fast[16] / fast[1] < ref[16] / ref[1]  # the faster type scales worse


def test_a_request_above_the_quota_of_every_type_it_accepts_is_not_admitted() -> None:
    book = QuotaBook(quota={"t": 16}, type_quota={"t": {H100: 4, A100: 8}})
    assert not book.admits("t", 6, (H100,))
    assert book.admits("t", 6, (H100, A100))
    assert book.admits("t", 6, ("l4",))  # no quota of that type: the total bounds it
    assert not book.admits("t", 20, ("l4",))
    assert book.admits("t", 6)
