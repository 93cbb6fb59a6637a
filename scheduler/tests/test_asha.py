"""The sweep rule (scheduler.asha): search spaces, rungs, and ASHA's exact decisions."""

from __future__ import annotations

import math
from typing import Any

import pytest

from scheduler.asha import (
    ASHA,
    GRID,
    MAXIMIZE,
    MINIMIZE,
    RANDOM,
    Plan,
    Promote,
    SpaceError,
    Stop,
    TrialStatus,
    TrialView,
    best,
    check_space,
    next_moves,
    rung_steps,
    trial_params,
    weight,
)

RUN, WAIT, DONE = TrialStatus.RUNNING, TrialStatus.WAITING, TrialStatus.COMPLETED


def asha(trials: int = 8, mode: str = MINIMIZE, **extra: Any) -> Plan:
    """An ASHA plan: rungs of 10, 20, 40 steps, eta 2."""
    return Plan(ASHA, mode, eta=2, min_steps=10, max_steps=40, max_trials=trials, **extra)


def waiting(index: int, rung: int, *values: float) -> TrialView:
    """A trial that finished ``rung`` with ``values`` at rungs 0..rung."""
    return TrialView(index, rung, WAIT, dict(enumerate(values)))


def running(index: int, rung: int = 0, *values: float) -> TrialView:
    return TrialView(index, rung, RUN, dict(enumerate(values)))


# ------------------------------------------------------------------------ search spaces
def test_grid_points_cycle_in_name_order_and_samples_are_seeded() -> None:
    space = check_space(
        {
            "lr": {"type": "grid", "values": [0.1, 0.01]},
            "act": {"type": "grid", "values": ["relu", "tanh", "gelu"]},
            "drop": {"type": "uniform", "low": 0.0, "high": 0.5},
        }
    )
    assert space.grid_size == 6
    points = [trial_params(space, i, seed=7) for i in range(7)]
    assert [(p["act"], p["lr"]) for p in points[:3]] == [
        ("relu", 0.1),
        ("relu", 0.01),
        ("tanh", 0.1),
    ]
    assert (points[6]["act"], points[6]["lr"]) == ("relu", 0.1)  # the grid cycles
    assert points[0] == trial_params(space, 0, seed=7)  # reproducible
    assert points[0]["drop"] != trial_params(space, 0, seed=8)["drop"]
    assert all(0.0 <= float(p["drop"]) <= 0.5 for p in points)


def test_sampled_dimensions_stay_in_their_ranges() -> None:
    space = check_space(
        {
            "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
            "width": {"type": "int", "low": 16, "high": 18},
            "opt": {"type": "choice", "values": ["sgd", "adam"]},
        }
    )
    draws = [trial_params(space, i, seed=0) for i in range(200)]
    assert all(1e-4 <= float(d["lr"]) <= 1e-1 for d in draws)
    assert {d["width"] for d in draws} == {16, 17, 18}
    assert {d["opt"] for d in draws} == {"sgd", "adam"}
    logs = sorted(math.log10(float(d["lr"])) for d in draws)
    assert logs[100] == pytest.approx(-2.5, abs=0.4)  # uniform in log space: median ~ 10^-2.5


@pytest.mark.parametrize(
    ("raw", "strategy", "field"),
    [
        ([], RANDOM, "search_space"),
        ({}, RANDOM, "search_space"),
        ({"lr": {"type": "gaussian"}}, RANDOM, "search_space.lr"),
        ({"lr": {"type": "loguniform", "low": 0, "high": 1}}, RANDOM, "search_space.lr"),
        ({"lr": {"type": "uniform", "low": 2, "high": 1}}, RANDOM, "search_space.lr"),
        ({"n": {"type": "int", "low": 1.5, "high": 3}}, RANDOM, "search_space.n"),
        ({"c": {"type": "choice", "values": []}}, RANDOM, "search_space.c"),
        ({"c": {"type": "choice", "values": [{"x": 1}]}}, RANDOM, "search_space.c"),
        ({"lr": {"type": "uniform", "low": 0, "high": 1}}, GRID, "search_space.lr"),
        ({"bad-name": {"type": "grid", "values": [1]}}, RANDOM, "search_space.bad-name"),
        ({"x": {"type": "uniform", "low": "a", "high": 1}}, RANDOM, "search_space.x"),
        (
            {"lr": {"type": "grid", "values": [1]}, "LR": {"type": "grid", "values": [2]}},
            RANDOM,
            "search_space.lr",
        ),
    ],
)
def test_bad_spaces_name_their_dimension(raw: object, strategy: str, field: str) -> None:
    with pytest.raises(SpaceError) as caught:
        check_space(raw, strategy)
    assert caught.value.field == field


# ------------------------------------------------------------------------ rungs and weight
def test_rungs_grow_by_eta_up_to_max_steps() -> None:
    assert rung_steps(ASHA, 10, 80, 2) == (10, 20, 40, 80)
    assert rung_steps(ASHA, 10, 100, 3) == (10, 30, 90, 100)
    assert rung_steps(ASHA, 50, 50, 2) == (50,)
    assert rung_steps(GRID, 10, 80, 2) == (80,)
    assert rung_steps(RANDOM, 10, 80, 2) == (80,)


def test_promoted_trials_weigh_more() -> None:
    assert [weight(rung, 3) for rung in range(3)] == [1.0, 3.0, 9.0]


# ------------------------------------------------------------------------ ASHA decisions
def test_a_fresh_sweep_launches_its_budget_or_max_running() -> None:
    assert next_moves(asha(8), []).launch == tuple(range(8))
    assert next_moves(asha(8, max_running=3), []).launch == (0, 1, 2)
    capped = next_moves(asha(8, max_running=3), [running(0), running(1), waiting(2, 0, 5.0)])
    assert capped.launch == (3,)


def test_one_result_waits_two_promote_the_better() -> None:
    plan = asha(8)
    first = next_moves(plan, [waiting(0, 0, 0.5), *[running(i) for i in range(1, 8)]])
    assert first.promote == () and first.stop == ()  # floor(1/2) = 0: it waits
    second = next_moves(
        plan, [waiting(0, 0, 0.5), waiting(1, 0, 0.9)] + [running(i) for i in range(2, 8)]
    )
    assert second.promote == (Promote(0, 1, 20),) and second.stop == ()


def test_a_waiting_trial_is_promoted_later_as_results_come() -> None:
    plan = asha(8)
    # trial 0 was promoted on 2 results; now 4 are in: the top 2 include trial 2 (0.3)
    trials = [
        running(0, 1, 0.5),
        waiting(1, 0, 0.9),
        waiting(2, 0, 0.3),
        waiting(3, 0, 0.7),
        *[running(i) for i in range(4, 8)],
    ]
    assert next_moves(plan, trials).promote == (Promote(2, 1, 20),)


def test_maximize_ranks_the_other_way() -> None:
    plan = asha(8, mode=MAXIMIZE)
    trials = [waiting(0, 0, 0.5), waiting(1, 0, 0.9)] + [running(i) for i in range(2, 8)]
    assert next_moves(plan, trials).promote == (Promote(1, 1, 20),)


def test_once_every_trial_reported_the_losers_are_stopped_and_the_sweep_ends() -> None:
    plan = asha(4)
    losses = [0.4, 0.1, 0.8, 0.6]  # trial 1 best, then 0; 2 worst
    rung0 = [waiting(i, 0, v) for i, v in enumerate(losses)]
    d = next_moves(plan, rung0)
    assert d.promote == (Promote(1, 1, 20), Promote(0, 1, 20))
    # every trial reported at rung 0 and the promoted ones run above it: nothing can
    # lift 2 and 3 any more
    assert d.stop == (
        Stop(2, "lost at rung 0: not in the top 1/2 of its results"),
        Stop(3, "lost at rung 0: not in the top 1/2 of its results"),
    )
    d_after = next_moves(
        plan,
        [running(0, 1, 0.4), running(1, 1, 0.1), waiting(2, 0, 0.8), waiting(3, 0, 0.6)],
    )
    assert d_after.promote == () and len(d_after.stop) == 2
    assert not d_after.finished
    # rung 1: 1 beats 0, goes to the top rung; 0 loses there once 1 runs above it
    top = next_moves(
        plan,
        [
            waiting(0, 1, 0.4, 0.3),
            waiting(1, 1, 0.1, 0.05),
            TrialView(2, 0, TrialStatus.STOPPED, {0: 0.8}),
            TrialView(3, 0, TrialStatus.STOPPED, {0: 0.6}),
        ],
    )
    assert top.promote == (Promote(1, 2, 40),)
    assert top.stop == (Stop(0, "lost at rung 1: not in the top 1/2 of its results"),)
    end = [
        TrialView(0, 1, TrialStatus.STOPPED, {0: 0.4, 1: 0.3}),
        TrialView(1, 2, DONE, {0: 0.1, 1: 0.05, 2: 0.01}),
        TrialView(2, 0, TrialStatus.STOPPED, {0: 0.8}),
        TrialView(3, 0, TrialStatus.STOPPED, {0: 0.6}),
    ]
    assert next_moves(plan, end).finished
    winner = best(plan, end)
    assert winner is not None and winner.index == 1


def test_a_trial_running_below_keeps_a_waiter_alive() -> None:
    plan = asha(3)
    trials = [waiting(0, 0, 0.9), waiting(1, 0, 0.8), running(2, 0)]
    d = next_moves(plan, trials)
    assert d.promote == (Promote(1, 1, 20),) and d.stop == ()  # trial 2 may still lift 0


def test_a_spent_gpu_hour_budget_stops_the_waiting_and_promotes_nothing() -> None:
    plan = asha(8, max_gpu_hours=1.0)
    trials = [waiting(0, 0, 0.5), waiting(1, 0, 0.9), running(2)]
    d = next_moves(plan, trials, gpu_hours_used=1.5)
    assert d.promote == () and d.launch == ()
    assert [s.index for s in d.stop] == [0, 1]
    assert "GPU-hour budget" in d.stop[0].reason


def test_grid_and_random_run_each_trial_to_the_end() -> None:
    plan = Plan(GRID, MINIMIZE, 2, 10, 40, max_trials=3)
    assert plan.rungs == (40,)
    d = next_moves(plan, [TrialView(0, 0, DONE, {0: 1.0}), running(1), running(2)])
    assert d.promote == () and d.stop == () and not d.finished
    assert next_moves(plan, [TrialView(i, 0, DONE, {0: 1.0}) for i in range(3)]).finished
