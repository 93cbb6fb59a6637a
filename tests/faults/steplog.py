"""What the runtime's step logs say a job trained: every step once, every sample once per epoch.

A training process appends one line per committed mini-batch to
``<AGENT_STEP_LOG_DIR>/job-<id>.w<gpu>.jsonl`` (``--step-log``). After a fault a
step may be logged more than once: by a generation that failed before it
committed everywhere, by a run replayed from a checkpoint, by a run started
again on the same GPU (the file is appended to, and generations count from 0
again). The attempt that counts is the last one:

    records of step s ──group by (generation, world)──> attempts
                       ──split where records lie more than GAP_S apart──> attempts
                       ──latest──> the step as committed

Records of one attempt of one step are written a moment apart (right after
the same all-reduce); two runs of a step are separated by at least a process
start, several seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GAP_S = 2.0


@dataclass(frozen=True)
class StepRecord:
    """One line of a step log: rank ``rank`` of ``world`` committed ``step`` at wall time ``t``."""

    step: int
    gen: int
    rank: int
    world: int
    worker: str
    t: float
    indices: tuple[int, ...]

    @classmethod
    def parse(cls, line: str) -> StepRecord:
        raw = json.loads(line)
        return cls(
            step=int(raw["step"]), gen=int(raw["gen"]), rank=int(raw["rank"]),
            world=int(raw["world"]), worker=str(raw["worker"]), t=float(raw["t"]),
            indices=tuple(int(i) for i in raw["indices"]),
        )  # fmt: skip


def read_step_logs(directory: Path, job: str) -> list[StepRecord]:
    """Every record of ``job`` (its runtime name, ``job-<id>``), from every worker's file."""
    records = []
    for path in sorted(directory.glob(f"{job}.*.jsonl")):
        text = path.read_text()
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()  # torn by a SIGKILL mid-write: the step was not logged
        records += [StepRecord.parse(line) for line in lines if line.strip()]
    return records


def _attempts(records: Iterable[StepRecord], gap_s: float) -> list[list[StepRecord]]:
    """The attempts at one step, oldest first."""
    by_membership: dict[tuple[int, int], list[StepRecord]] = {}
    for record in records:
        by_membership.setdefault((record.gen, record.world), []).append(record)
    attempts: list[list[StepRecord]] = []
    for group in by_membership.values():
        group.sort(key=lambda r: r.t)
        current = [group[0]]
        for record in group[1:]:
            if record.t - current[-1].t > gap_s:
                attempts.append(current)
                current = []
            current.append(record)
        attempts.append(current)
    return sorted(attempts, key=lambda attempt: attempt[0].t)


def committed_steps(
    records: Iterable[StepRecord], gap_s: float = GAP_S
) -> dict[int, list[StepRecord]]:
    """Per step, the records of its last attempt."""
    by_step: dict[int, list[StepRecord]] = {}
    for record in records:
        by_step.setdefault(record.step, []).append(record)
    return {step: _attempts(recs, gap_s)[-1] for step, recs in sorted(by_step.items())}


def as_sample_records(
    committed: dict[int, list[StepRecord]], gap_s: float = GAP_S
) -> dict[int, list[dict[str, Any]]]:
    """``committed`` in the form ``devtools.elastic.check_samples`` reads.

    Its ``gen`` becomes a run of consecutive steps of one attempt (same
    generation and world, no pause over ``gap_s``): only the last step of such
    a run may lack a record, from a process killed between committing and logging.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    label = 0
    previous: list[StepRecord] | None = None
    for step, recs in committed.items():
        if previous is not None and (
            (recs[0].gen, recs[0].world) != (previous[0].gen, previous[0].world)
            or min(r.t for r in recs) - max(r.t for r in previous) > gap_s
            or step != previous[0].step + 1
        ):
            label += 1
        out[step] = [
            {
                "step": r.step,
                "gen": label,
                "rank": r.rank,
                "world": r.world,
                "indices": list(r.indices),
            }
            for r in recs
        ]
        previous = recs
    return out


def attempts_after(records: Iterable[StepRecord], t: float) -> int:
    """How many steps were committed after wall time ``t`` (a fault landed mid-run if > 0)."""
    return len({r.step for r in records if r.t > t})
