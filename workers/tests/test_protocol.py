"""The agent protocol: round trips, and strict refusal of bad messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.protocol import (
    ArtifactStored,
    CachedEnvironment,
    CheckpointSkipped,
    Command,
    CurvePoint,
    EnvironmentCacheReport,
    EnvironmentEvicted,
    EventsDropped,
    EvictEnvironment,
    Failed,
    Finished,
    Heartbeat,
    LabActivity,
    LogLines,
    MetricPoint,
    Metrics,
    Migrate,
    OpenShell,
    Profile,
    ProfileDone,
    Progress,
    ProtocolError,
    Recovered,
    Rejected,
    Report,
    RunningWorker,
    ScaleDone,
    ScaleIn,
    Started,
    StartWorkers,
    StopJob,
    Stopped,
    Straggler,
    WorkerExited,
    WorkerFailed,
    WorkerSlot,
    command_types,
    report_types,
)


def start_dict(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "start_workers",
        "job": "job-1",
        "command_id": "cmd-1",
        "workload": "mlp-digits",
        "args": {"epochs": 1},
        "batch_size": 32,
        "recovery": "consistent",
        "checkpoint_every": 5,
        "workers": [{"worker_id": "w0", "slot": 0}, {"worker_id": "w1", "slot": 1}],
        "initial_world": 2,
    }
    data.update(overrides)
    return data


def start(**overrides: Any) -> StartWorkers:
    command = Command.from_dict(start_dict(**overrides))
    assert isinstance(command, StartWorkers)
    return command


def sample_commands() -> list[Command]:
    return [
        start(),
        start(join=True, initial_world=None, checkpoint_dir="/tmp/ck", max_steps=7),
        ScaleIn(job="job-1", command_id="c2", worker_ids=("w1",), reason="shrink"),
        Migrate(
            job="job-1",
            command_id="c3",
            leaving=("w0",),
            joining=start(join=True, workers=[{"worker_id": "w9", "slot": 3}]),
            joiners=2,
        ),
        StopJob(job="job-1", command_id="c4", grace_seconds=3),
        Profile(job="job-1", command_id="c5", min_workers=1, max_workers=4),
        # the allocation's whole rank order after the change (the runtime orders by it)
        start(
            join=True,
            initial_world=None,
            workers=[{"worker_id": "w1", "slot": 1, "rank": 2}],
            rank_order=["w8", "w9", "w1"],
        ),
        ScaleIn(job="job-1", command_id="c6", worker_ids=("w1",), rank_order=("w9", "w0")),
        Migrate(
            job="job-1",
            command_id="c7",
            leaving=("w0",),
            joining=start(
                join=True, workers=[{"worker_id": "w9", "slot": 3}], rank_order=["w9", "w1"]
            ),
            rank_order=("w9", "w1"),
        ),
        EvictEnvironment(command_id="c8", key="0123456789abcdef0123456789abcdef"),
        OpenShell(
            job="j1", command_id="c9", shell_id="ab" * 16, worker_id="w0", argv=("sh", "-c", "id")
        ),
    ]


def sample_reports() -> list[Report]:
    worker = RunningWorker(job="job-1", worker_id="w0", slot=0, pid=123)
    common: dict[str, Any] = {"node": "gpu-1", "job": "job-1"}
    return [
        Started(**common, command_id="c1", workers=(worker,)),
        Progress(**common, event_id="1-0", step=3, samples_per_s=812.5, loss=1.25, world=2),
        Progress(**common, event_id="1-1", step=4, samples_per_s=800, world=2),
        ScaleDone(**common, event_id="2-0", world=3, step=10, workers=("w0", "w1", "w2")),
        Straggler(**common, event_id="3-0", worker_id="w1", ratio=1.6),
        WorkerFailed(**common, event_id="4-0", worker_id="w1", error="sync timeout"),
        Recovered(
            **common,
            event_id="5-0",
            mode="consistent",
            world=1,
            step=11,
            dead=("w1",),
            restored_step=10,
        ),
        ProfileDone(
            **common,
            event_id="6-0",
            curve=(
                CurvePoint(workers=1, samples_per_s=10),
                CurvePoint(workers=2, samples_per_s=19),
            ),
        ),
        Finished(**common, event_id="7-0", step=40),
        Failed(**common, error="boom"),
        EventsDropped(
            **common, count=3, reason="not JSON", first_event_id="9-0", last_event_id="9-2"
        ),
        WorkerExited(
            **common, worker_id="w0", slot=0, exit_code=-9, outcome="crashed", log_tail="x"
        ),
        LogLines(**common, worker_id="w0", log_id="gpu-1-7-ab", offset=10, text="a\n", rank=0),
        Stopped(**common, command_id="c4"),
        LabActivity(**common, last_activity=1_700_000_000.5, connections=1, kernels=2),
        ArtifactStored(
            **common,
            event_id="9-0",
            kind="final",
            path="checkpoints/step-000000009.pt",
            size=3,
            sha256="0" * 64,
            step=9,
        ),
        CheckpointSkipped(**common, event_id="9-1", step=8, reason="sha256 mismatch"),
        Metrics(**common, event_id="9-2", points=(MetricPoint(step=9, values={"loss": 0.5}),)),
        Rejected(node="gpu-1", error="slot 9 does not exist", command_id="c9", job="job-1"),
        Heartbeat(node="gpu-1", device="cpu", slots=2, free_slots=(1,), workers=(worker,)),
        EnvironmentCacheReport(
            node="gpu-1",
            max_bytes=2**30,
            total_bytes=4096,
            entries=(
                CachedEnvironment(
                    key="0123456789abcdef0123456789abcdef",
                    size_bytes=4096,
                    last_used=1_700_000_000.0,
                    in_use=True,
                    packages=("six==1.16.0",),
                    requirements=("six",),
                    built_at=1_699_999_000.0,
                    build_s=2.5,
                ),
            ),
        ),
        EnvironmentEvicted(
            node="gpu-1",
            command_id="c8",
            key="0123456789abcdef0123456789abcdef",
            outcome="in_use",
            detail="worker w0 of job job-1 runs in it",
        ),
    ]


@pytest.mark.parametrize("command", sample_commands(), ids=lambda c: c.TYPE)
def test_command_round_trip_through_json(command: Command) -> None:
    wire = json.loads(json.dumps(command.to_dict()))
    assert wire["type"] == command.TYPE
    assert Command.from_dict(wire) == command


@pytest.mark.parametrize("report", sample_reports(), ids=lambda r: r.TYPE)
def test_report_round_trip_through_json(report: Report) -> None:
    wire = json.loads(json.dumps(report.to_dict()))
    assert Report.from_dict(wire) == report


def test_every_message_type_is_sampled() -> None:
    assert {c.TYPE for c in sample_commands()} == set(command_types())
    assert {r.TYPE for r in sample_reports()} == set(report_types())


def test_start_workers_fills_in_the_workload_defaults() -> None:
    command = start(args={"epochs": 2})
    assert command.args == {"epochs": 2, "hidden": 128, "lr": 0.05, "seed": 0}
    assert command.worker_ids == ("w0", "w1")
    assert command.workers[1] == WorkerSlot(worker_id="w1", slot=1)


def test_json_lists_become_tuples_and_ints_become_floats() -> None:
    report = Report.from_dict(
        {
            "type": "progress",
            "node": "n1",
            "at": 5,
            "job": "j",
            "event_id": "1-0",
            "step": 1,
            "samples_per_s": 3,
            "world": 1,
        }
    )
    assert isinstance(report, Progress)
    assert report.samples_per_s == 3.0 and isinstance(report.samples_per_s, float)
    assert report.at == 5.0


def scale_in_dict(**overrides: Any) -> dict[str, Any]:
    return {"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": ["w1"], **overrides}


def migrate_dict(**overrides: Any) -> dict[str, Any]:
    joining = start_dict(join=True, workers=[{"worker_id": "w9", "slot": 1}])
    return {
        "type": "migrate",
        "job": "job-1",
        "command_id": "c",
        "leaving": ["w1"],
        "joining": joining,
        **overrides,
    }


BAD_COMMANDS: list[tuple[Any, str]] = [
    (scale_in_dict(rank_order=["w0", "w1"]), "scale_in.rank_order ranks worker(s) that leave: w1"),
    (scale_in_dict(rank_order=["w0", "w0"]), "scale_in.rank_order repeats w0"),
    (scale_in_dict(rank_order=["w 0"]), "scale_in.rank_order[0]"),
    (scale_in_dict(rank_order=[f"w{i}" for i in range(5000)]), "more than 4096 workers"),
    (start_dict(rank_order=["w0"]), "start_workers.rank_order does not rank worker w1"),
    (
        start_dict(workers=[{"worker_id": "w0", "slot": 0, "rank": 1}], rank_order=["w0", "w5"]),
        "worker w0 has rank 1 but place 0 in rank_order",
    ),
    (migrate_dict(rank_order=["w9", "w1"]), "migrate.rank_order ranks worker(s) that leave: w1"),
    (migrate_dict(rank_order=["w0"]), "migrate.rank_order does not rank w9"),
    (
        migrate_dict(
            rank_order=["w9", "w0"],
            joining=start_dict(
                join=True, workers=[{"worker_id": "w9", "slot": 1}], rank_order=["w0", "w9"]
            ),
        ),
        "joining.rank_order differs",
    ),
    ([], "must be a JSON object"),
    ({"job": "j"}, "needs a string field 'type'"),
    ({"type": "reboot", "job": "j", "command_id": "c"}, "unknown command type 'reboot'"),
    ({"type": "scale_in", "job": "j", "command_id": "c"}, "missing field(s) worker_ids"),
    (
        {"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": ["a"], "force": True},
        "unknown field(s) force",
    ),
    ({"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": "a"}, "must be a list"),
    ({"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": []}, "must not be empty"),
    ({"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": ["a", "a"]}, "repeats a"),
    ({"type": "scale_in", "job": "j", "command_id": "c", "worker_ids": [1]}, "must be a string"),
    ({"type": "scale_in", "job": "a b", "command_id": "c", "worker_ids": ["a"]}, "scale_in.job"),
    ({"type": "scale_in", "job": "j", "command_id": "", "worker_ids": ["a"]}, "command_id"),
    ({"type": "stop_job", "job": "j", "command_id": "c", "grace_seconds": -1}, "at least 0"),
    ({"type": "stop_job", "job": "j", "command_id": "c", "grace_seconds": "5"}, "number"),
    (
        {"type": "profile", "job": "j", "command_id": "c", "min_workers": 4, "max_workers": 2},
        "max_workers must be at least min_workers",
    ),
    (
        {"type": "profile", "job": "j", "command_id": "c", "min_workers": True, "max_workers": 2},
        "must be an integer",
    ),
    (start_dict(workload="gpt-9"), "unknown workload 'gpt-9'"),
    (start_dict(args={"epochs": 0}), "'epochs' must be between"),
    (start_dict(args={"depth": 3}), "unknown argument(s) for mlp-digits: depth"),
    (start_dict(args=[1]), "must be an object"),
    (start_dict(batch_size=0), "batch_size must be at least 1"),
    (start_dict(batch_size=32.0), "batch_size must be an integer"),
    (start_dict(recovery="hopeful"), "one of 'consistent', 'approximate'"),
    (start_dict(workers=[]), "workers must not be empty"),
    (start_dict(workers=[{"worker_id": "w0"}]), "workers[0]: missing field(s) slot"),
    (start_dict(workers=[{"worker_id": "w0", "slot": -1}]), "slot must be at least 0"),
    (
        start_dict(workers=[{"worker_id": "w0", "slot": 0}, {"worker_id": "w1", "slot": 0}]),
        "one slot to two workers",
    ),
    (
        start_dict(workers=[{"worker_id": "w0", "slot": 0}, {"worker_id": "w0", "slot": 1}]),
        "repeats w0",
    ),
    (start_dict(initial_world=1), "do not fit an initial world of 1"),
    (start_dict(initial_world=None), "initial_world is required unless join is true"),
    (start_dict(checkpoint_every=-1), "checkpoint_every must be at least 0"),
    (start_dict(checkpoint_dir=" "), "checkpoint_dir must not be blank"),
    (start_dict(join="yes"), "join must be a boolean"),
    (
        {
            "type": "migrate",
            "job": "job-1",
            "command_id": "c",
            "leaving": ["w0"],
            "joining": start_dict(job="other", join=True),
        },
        "joining.job must be the migrating job",
    ),
    (
        {
            "type": "migrate",
            "job": "job-1",
            "command_id": "c",
            "leaving": ["w0"],
            "joining": start_dict(join=False),
        },
        "join: true",
    ),
    (
        {
            "type": "migrate",
            "job": "job-1",
            "command_id": "c",
            "leaving": ["w1"],
            "joining": start_dict(join=True),
        },
        "both leaving and joining: w1",
    ),
    (
        {
            "type": "migrate",
            "job": "job-1",
            "command_id": "c",
            "leaving": ["w5"],
            "joining": start_dict(join=True),
            "joiners": 1,
        },
        "joiners must count at least",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_COMMANDS)
def test_bad_commands_are_refused_with_a_clear_message(data: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        Command.from_dict(data)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_a_report_is_not_a_command_and_back() -> None:
    with pytest.raises(ProtocolError, match="unknown command type 'heartbeat'"):
        Command.from_dict({"type": "heartbeat", "node": "n"})
    with pytest.raises(ProtocolError, match="unknown report type 'stop_job'"):
        Report.from_dict({"type": "stop_job", "job": "j", "command_id": "c"})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "progress", "node": "n", "job": "j", "event_id": "1", "step": 1}, "missing"),
        (
            {
                "type": "progress",
                "node": "n",
                "job": "j",
                "event_id": "1",
                "step": 1,
                "samples_per_s": float("nan"),
                "world": 1,
            },
            "finite",
        ),
        (
            {
                "type": "worker_exited",
                "node": "n",
                "job": "j",
                "worker_id": "w",
                "slot": 0,
                "exit_code": 1,
                "outcome": "exploded",
            },
            "outcome must be one of",
        ),
        ({"type": "heartbeat", "node": "n", "device": "tpu"}, "missing"),
        (
            {
                "type": "heartbeat",
                "node": "n",
                "device": "tpu",
                "slots": 1,
                "free_slots": [],
                "workers": [],
            },
            "device must be one of 'cpu', 'cuda'",
        ),
        (
            {
                "type": "heartbeat",
                "node": "n",
                "device": "cpu",
                "slots": 1,
                "free_slots": [0],
                "workers": [{"job": "j", "worker_id": "w", "slot": 0}],
            },
            "workers[0]: missing field(s) pid",
        ),
    ],
)
def test_bad_reports_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        Report.from_dict(data)
    assert message in str(excinfo.value)


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(ProtocolError, match="worker_ids"):
        ScaleIn(job="j", command_id="c", worker_ids=())
    with pytest.raises(ProtocolError, match="must be a string"):
        ScaleIn(job="j", command_id="c", worker_ids=(3,))  # type: ignore[arg-type]
    # Lists are normalised to tuples, so messages stay immutable and comparable.
    command = ScaleIn(job="j", command_id="c", worker_ids=["a", "b"])  # type: ignore[arg-type]
    assert command.worker_ids == ("a", "b")


def test_messages_are_frozen() -> None:
    command = sample_commands()[2]
    with pytest.raises(AttributeError):
        command.job = "other"  # type: ignore[misc]


names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,10}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    job=names,
    ids=st.lists(names, min_size=1, max_size=6, unique=True),
    batch=st.integers(1, 4096),
    every=st.integers(0, 1000),
    join=st.booleans(),
)
def test_start_workers_round_trip_property(
    job: str, ids: list[str], batch: int, every: int, join: bool
) -> None:
    command = StartWorkers(
        job=job,
        command_id=f"c-{job}",
        workload="resnet18-synthetic",
        args={"steps": 3},
        batch_size=batch,
        recovery="approximate",
        checkpoint_every=every,
        workers=tuple(WorkerSlot(worker_id=w, slot=i) for i, w in enumerate(ids)),
        initial_world=None if join else len(ids),
        join=join,
    )
    assert Command.from_dict(json.loads(json.dumps(command.to_dict()))) == command


@settings(max_examples=100, deadline=None)
@given(
    data=st.dictionaries(
        st.sampled_from(["type", "job", "command_id", "worker_ids", "reason", "x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.text(max_size=5),
            st.lists(st.text(max_size=3), max_size=3),
            st.just("scale_in"),
        ),
    )
)
def test_arbitrary_input_parses_or_raises_protocol_error(data: dict[str, Any]) -> None:
    try:
        command = Command.from_dict(data)
    except ProtocolError:
        return
    assert Command.from_dict(command.to_dict()) == command


def test_log_lines_limits_its_text_and_names_bad_fields() -> None:
    common: dict[str, Any] = {"node": "gpu-1", "job": "job-1", "worker_id": "w0", "log_id": "l1"}
    assert LogLines(**common, offset=0, text="é\n").byte_size == 3
    assert LogLines(**common, offset=0, text="\ufffd", size=1).byte_size == 1
    with pytest.raises(ProtocolError, match=r"log_lines\.text"):
        LogLines(**common, offset=0, text="x" * 65537)
    with pytest.raises(ProtocolError, match=r"log_lines\.offset"):
        LogLines(**common, offset=-1, text="")


def test_text_that_does_not_encode_is_refused_everywhere() -> None:
    """A lone surrogate parses from JSON but cannot be signed, sent or stored: refused."""
    with pytest.raises(ProtocolError, match="does not encode"):
        Report.from_dict({"type": "failed", "node": "gpu-1", "job": "job-1", "error": "\ud800"})
    with pytest.raises(ProtocolError, match="does not encode"):
        ScaleDone(node="gpu-1", job="job-1", event_id="1-0", workers=("\udfff",))
