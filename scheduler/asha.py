"""Hyperparameter sweeps (pure): search spaces, and which trial runs next, is promoted or stops.

::

    search space  {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
                   "layers": {"type": "grid", "values": [2, 4]}, ...}
        check_space(raw)         -> Space          (SpaceError names the dimension)
        trial_params(space, i, seed) -> {name: value}   trial i: grid point i, samples seeded by (seed, i)

    rungs (ASHA, Li et al. 2020)  min_steps * eta**k, capped at max_steps
        min 10, max 80, eta 2:   rung 0 ── 10 steps
                                 rung 1 ── 20 steps
                                 rung 2 ── 40 steps
                                 rung 3 ── 80 steps   (the top: a trial there is complete)

    next_moves(plan, trials, gpu_hours_used) -> Decisions
        1. promote   top rung first: a trial waiting at rung k whose result is in the top
                     floor(n_k / eta) of the n_k results recorded at rung k so far
        2. launch    new trials at rung 0 while the trial budget and max_running allow
        3. stop      once the budget is spent, a waiting trial that nothing can promote any
                     more (no trial still runs at its rung or below) is stopped

A trial "waits" at the rung it finished until the rule promotes or stops it;
asynchronous promotion means an early trial may be promoted on few results
and a late one still gets its chance as results come.  Grid and random
strategies have a single rung of ``max_steps``.  Ties between equal metrics go
to the lower trial index, so every decision is reproducible.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GRID, RANDOM, ASHA = "grid", "random", "asha"
STRATEGIES = (GRID, RANDOM, ASHA)
MINIMIZE, MAXIMIZE = "min", "max"
MODES = (MINIMIZE, MAXIMIZE)

DIMENSION_TYPES = ("grid", "choice", "uniform", "loguniform", "int")
"""``grid`` is enumerated (every strategy); the others are sampled per trial."""

MAX_DIMENSIONS = 32
MAX_VALUES = 1000
MAX_GRID_POINTS = 10_000
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

Value = int | float | str | bool


class SpaceError(ValueError):
    """A search space that cannot be used; ``field`` names the dimension (``search_space.lr``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Dimension:
    """One hyperparameter: enumerated values (grid), choices, or a numeric range."""

    name: str
    kind: str
    values: tuple[Value, ...] = ()
    low: float = 0.0
    high: float = 0.0


@dataclass(frozen=True)
class Space:
    """A checked search space, dimensions in name order (the order never changes a trial)."""

    dimensions: tuple[Dimension, ...]

    @property
    def grid(self) -> tuple[Dimension, ...]:
        """The enumerated dimensions."""
        return tuple(d for d in self.dimensions if d.kind == "grid")

    @property
    def grid_size(self) -> int:
        """How many points the enumerated dimensions make (1 without any)."""
        return math.prod(len(d.values) for d in self.grid)

    @property
    def sampled(self) -> bool:
        """Whether any dimension is drawn at random."""
        return any(d.kind != "grid" for d in self.dimensions)


def _number(raw: Any, field: str, key: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpaceError(field, f"'{key}' must be a finite number.")
    return float(value)


def _values(raw: Mapping[str, Any], field: str) -> tuple[Value, ...]:
    values = raw.get("values")
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_VALUES:
        raise SpaceError(field, f"'values' must be a list of 1 to {MAX_VALUES} values.")
    for value in values:
        if not isinstance(value, int | float | str | bool) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise SpaceError(field, "Each value must be a string, a finite number or a boolean.")
    return tuple(values)


def _dimension(name: str, raw: Any) -> Dimension:
    field = f"search_space.{name}"
    if not name or len(name) > 64 or not set(name) <= NAME_CHARS or name[0].isdigit():
        raise SpaceError(field, "A name of letters, digits and '_' (at most 64, no leading digit).")
    if not isinstance(raw, dict):
        raise SpaceError(field, "Must be an object with a 'type'.")
    kind = raw.get("type")
    if kind not in DIMENSION_TYPES:
        raise SpaceError(field, f"'type' must be one of: {', '.join(DIMENSION_TYPES)}.")
    if kind in ("grid", "choice"):
        return Dimension(name, kind, values=_values(raw, field))
    low, high = _number(raw, field, "low"), _number(raw, field, "high")
    if low > high:
        raise SpaceError(field, "'low' cannot exceed 'high'.")
    if kind == "loguniform" and low <= 0:
        raise SpaceError(field, "A log-uniform range needs 'low' > 0.")
    if kind == "int" and not (low.is_integer() and high.is_integer()):
        raise SpaceError(field, "An int range needs whole 'low' and 'high'.")
    return Dimension(name, kind, low=low, high=high)


def check_space(raw: Any, strategy: str = RANDOM) -> Space:
    """Check a search space (JSON) for ``strategy``; ``SpaceError`` names what is wrong.

    A grid strategy enumerates: it takes only ``grid`` dimensions.
    """
    if not isinstance(raw, dict) or not 1 <= len(raw) <= MAX_DIMENSIONS:
        raise SpaceError("search_space", f"An object of 1 to {MAX_DIMENSIONS} hyperparameters.")
    space = Space(tuple(_dimension(str(name), raw[name]) for name in sorted(raw)))
    seen: dict[str, str] = {}
    for dim in space.dimensions:  # programs read them as HP_<NAME>: one variable each
        if dim.name.upper() in seen:
            raise SpaceError(
                f"search_space.{dim.name}", f"Differs from {seen[dim.name.upper()]!r} only in case."
            )
        seen[dim.name.upper()] = dim.name
    if strategy == GRID:
        for dim in space.dimensions:
            if dim.kind != "grid":
                raise SpaceError(
                    f"search_space.{dim.name}", "A grid sweep takes only 'grid' dimensions."
                )
    if space.grid_size > MAX_GRID_POINTS:
        raise SpaceError("search_space", f"The grid has more than {MAX_GRID_POINTS} points.")
    return space


def _sample(dim: Dimension, rng: random.Random) -> Value:
    if dim.kind == "choice":
        return dim.values[rng.randrange(len(dim.values))]
    if dim.kind == "uniform":
        return rng.uniform(dim.low, dim.high)
    if dim.kind == "loguniform":
        return math.exp(rng.uniform(math.log(dim.low), math.log(dim.high)))
    return rng.randint(int(dim.low), int(dim.high))  # int


def trial_params(space: Space, index: int, seed: int) -> dict[str, Value]:
    """Trial ``index``'s hyperparameters: grid point ``index`` (cycling through the grid, in
    name order, last name fastest) and, for each sampled dimension, a draw from
    ``Random(f"{seed}:{index}")`` — the same trial of the same sweep always gets the same."""
    grid = space.grid
    point: dict[str, Value] = {}
    if grid:
        combos = itertools.product(*(d.values for d in grid))
        chosen = next(itertools.islice(combos, index % space.grid_size, None))
        point = {d.name: v for d, v in zip(grid, chosen, strict=True)}
    rng = random.Random(f"{seed}:{index}")
    for dim in space.dimensions:
        if dim.kind != "grid":
            point[dim.name] = _sample(dim, rng)
    return {d.name: point[d.name] for d in space.dimensions}


def rung_steps(strategy: str, min_steps: int, max_steps: int, eta: int) -> tuple[int, ...]:
    """Each rung's step budget: ``min_steps * eta**k`` below ``max_steps``, then ``max_steps``
    (ASHA); one rung of ``max_steps`` for grid and random."""
    if strategy != ASHA:
        return (max_steps,)
    budgets, steps = [], min_steps
    while steps < max_steps:
        budgets.append(steps)
        steps *= eta
    budgets.append(max_steps)
    return tuple(budgets)


def weight(rung: int, base: float) -> float:
    """A trial's scheduling weight: ``base ** rung`` (the sweep passes ``eta``), so each
    promotion multiplies its claim on idle GPUs by ``base``; rung 0 weighs 1."""
    return float(base**rung)


class TrialStatus(enum.StrEnum):
    """Where a trial stands in the sweep."""

    RUNNING = "running"
    """Its job trains toward its rung's budget (queued or running)."""
    WAITING = "waiting"
    """It finished its rung; not promoted (yet)."""
    COMPLETED = "completed"
    """It finished the top rung."""
    STOPPED = "stopped"
    """The sweep stopped it (lost at its rung, budget spent, or cancelled)."""
    FAILED = "failed"
    """Its job failed or reported no metric."""


@dataclass(frozen=True)
class TrialView:
    """What the rule needs of one trial: its rung, status and results by rung."""

    index: int
    rung: int
    status: TrialStatus
    results: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A sweep's rule: strategy, direction, rungs and budget."""

    strategy: str
    mode: str
    eta: int
    min_steps: int
    max_steps: int
    max_trials: int
    max_gpu_hours: float | None = None
    max_running: int | None = None

    @property
    def rungs(self) -> tuple[int, ...]:
        """Each rung's step budget (``rung_steps``)."""
        return rung_steps(self.strategy, self.min_steps, self.max_steps, self.eta)


@dataclass(frozen=True)
class Promote:
    """Run trial ``index`` on to ``rung`` (``steps`` in all), from its checkpoint."""

    index: int
    rung: int
    steps: int


@dataclass(frozen=True)
class Stop:
    """Stop trial ``index`` for ``reason``."""

    index: int
    reason: str


@dataclass(frozen=True)
class Decisions:
    """What to do now: promotions, new trials (indexes) and stops; ``finished`` once no
    trial runs or waits and none will start."""

    promote: tuple[Promote, ...] = ()
    launch: tuple[int, ...] = ()
    stop: tuple[Stop, ...] = ()
    finished: bool = False


def ranked(plan: Plan, trials: Sequence[TrialView], rung: int) -> list[TrialView]:
    """The trials with a result at ``rung``, best first (ties: lower index first)."""
    sign = 1.0 if plan.mode == MINIMIZE else -1.0
    done = [t for t in trials if rung in t.results]
    return sorted(done, key=lambda t: (sign * t.results[rung], t.index))


def promotable(plan: Plan, trials: Sequence[TrialView]) -> list[Promote]:
    """Waiting trials in the top ``floor(n_k / eta)`` at their rung, top rung first."""
    top = len(plan.rungs) - 1
    found: list[Promote] = []
    for rung in range(top - 1, -1, -1):
        results = ranked(plan, trials, rung)
        for trial in results[: len(results) // plan.eta]:
            if trial.status == TrialStatus.WAITING and trial.rung == rung:
                found.append(Promote(trial.index, rung + 1, plan.rungs[rung + 1]))
    return found


def best(plan: Plan, trials: Sequence[TrialView]) -> TrialView | None:
    """The best trial: the best result at the highest rung any trial reached."""
    for rung in range(len(plan.rungs) - 1, -1, -1):
        results = ranked(plan, trials, rung)
        if results:
            return results[0]
    return None


def _stops(
    plan: Plan, trials: Sequence[TrialView], promote: Sequence[Promote], spent: bool
) -> list[Stop]:
    """Waiting trials nothing can promote any more, once the budget is spent: no trial runs
    (or is being promoted) at their rung or below, so no result that could lift them comes."""
    moved = {p.index for p in promote}
    active = [t.rung for t in trials if t.status == TrialStatus.RUNNING]
    active += [p.rung for p in promote]
    stops = []
    for t in trials:
        if t.status != TrialStatus.WAITING or t.index in moved:
            continue
        if spent:
            stops.append(Stop(t.index, f"stopped at rung {t.rung}: the GPU-hour budget is spent"))
        elif not any(rung <= t.rung for rung in active):
            stops.append(
                Stop(t.index, f"lost at rung {t.rung}: not in the top 1/{plan.eta} of its results")
            )
    return stops


def next_moves(plan: Plan, trials: Sequence[TrialView], gpu_hours_used: float = 0.0) -> Decisions:
    """The sweep's next moves given every trial so far (``trials`` by index, 0 to n-1).

    Promotions come before new trials (ASHA's rule for a free worker); with
    ``max_running`` both fill only the room left by the running trials.
    """
    spent = plan.max_gpu_hours is not None and gpu_hours_used >= plan.max_gpu_hours
    running = sum(1 for t in trials if t.status == TrialStatus.RUNNING)
    room = plan.max_trials if plan.max_running is None else max(plan.max_running - running, 0)
    promote = [] if spent else promotable(plan, trials)
    if plan.max_running is not None:
        promote = promote[:room]
        room -= len(promote)
    launch = [] if spent else list(range(len(trials), min(plan.max_trials, len(trials) + room)))
    exhausted = spent or len(trials) + len(launch) >= plan.max_trials
    stop = _stops(plan, trials, promote, spent) if exhausted and not launch else []
    left = {t.index for t in trials if t.status in (TrialStatus.RUNNING, TrialStatus.WAITING)}
    finished = not launch and not promote and left <= {s.index for s in stop}
    return Decisions(tuple(promote), tuple(launch), tuple(stop), finished)


__all__ = [
    "ASHA",
    "GRID",
    "MAXIMIZE",
    "MINIMIZE",
    "MODES",
    "RANDOM",
    "STRATEGIES",
    "Decisions",
    "Dimension",
    "Plan",
    "Promote",
    "Space",
    "SpaceError",
    "Stop",
    "TrialStatus",
    "TrialView",
    "best",
    "check_space",
    "next_moves",
    "promotable",
    "ranked",
    "rung_steps",
    "trial_params",
    "weight",
]
