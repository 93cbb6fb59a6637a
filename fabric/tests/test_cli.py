"""``python -m fabric``: allocate, check, collisions, and bad input (exit status 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.cli import main

TOPO = {"leaves": 4, "spines": 4, "servers_per_leaf": 2, "gpus_per_server": 4}
JOBS = [
    {"job": "a", "gpus": 12},
    {"job": "b", "gpus": 8},
    {"job": "c", "gpus": 16},
    {"release": ["a"]},
    {"job": "d", "gpus": 24},
    {"job": "e", "gpus": 64},
]


def write(tmp: Path, name: str, data: object) -> str:
    path = tmp / name
    path.write_text(json.dumps(data))
    return str(path)


def test_allocate_json_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = write(tmp_path, "t.json", TOPO)
    assert (
        main(["allocate", "--topology", topo, "--jobs", write(tmp_path, "j.json", JOBS), "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    by_job = {r["job"]: r for r in out}
    assert by_job["a"]["leaves"] == [0, 1, 2] and by_job["a"]["released"] is True
    assert by_job["a"]["routes"]["0"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    assert by_job["b"]["spines"] == [] and by_job["b"]["routes"] == {}
    assert by_job["c"]["code"] == "insufficient_gpus" and "error" in by_job["c"]
    assert len(by_job["d"]["gpus"]) == 24
    assert by_job["e"]["code"] == "too_large"
    allocs = write(tmp_path, "a.json", out)
    for pattern in ("ring", "hd", "a2a"):
        assert (
            main(
                [
                    "check",
                    "--topology",
                    topo,
                    "--allocations",
                    allocs,
                    "--pattern",
                    pattern,
                    "--json",
                ]
            )
            == 0
        )
        report = json.loads(capsys.readouterr().out)
        assert report["together"]["max_flows"] == 1
        assert all(j["contended_steps"] == 0 for j in report["jobs"].values())
    assert (
        main(
            [
                "check",
                "--topology",
                topo,
                "--allocations",
                allocs,
                "--pattern",
                "hd",
                "--routing",
                "ecmp",
                "--json",
            ]
        )
        == 0
    )
    ecmp = json.loads(capsys.readouterr().out)
    assert ecmp["together"]["max_flows"] >= 2  # hashing puts flows of job d together


def test_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = write(tmp_path, "t.json", TOPO)
    assert main(["allocate", "--topology", topo, "--jobs", write(tmp_path, "j.json", JOBS)]) == 0
    out = capsys.readouterr().out
    assert "c: not placed (insufficient_gpus)" in out and "free GPUs: 0 of 32" in out


@pytest.mark.parametrize(
    ("topo", "jobs", "fragment"),
    [
        ({"leaves": 2, "spines": 3, "servers_per_leaf": 1, "gpus_per_server": 4}, [], "evenly"),
        (TOPO, {"job": "a"}, "list"),
        (TOPO, [{"job": "a", "gpus": 0}], "positive"),
        (TOPO, [{"job": "a", "gpus": 1}, {"job": "a", "gpus": 1}], "twice"),
        (TOPO, [{"release": ["zz"]}], "unknown"),
        (TOPO, [{"job": "a", "gpus": 1, "extra": 1}], "must be"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], topo: object, jobs: object, fragment: str
) -> None:
    rc = main(
        [
            "allocate",
            "--topology",
            write(tmp_path, "t.json", topo),
            "--jobs",
            write(tmp_path, "j.json", jobs),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and fragment in captured.err


def test_overlapping_allocations_are_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = write(tmp_path, "t.json", TOPO)
    clash = [{"job": "x", "gpus": [0, 1], "leaves": [0]}, {"job": "y", "gpus": [1], "leaves": [0]}]
    assert (
        main(["check", "--topology", topo, "--allocations", write(tmp_path, "a.json", clash)]) == 2
    )
    assert "already held" in capsys.readouterr().err


def test_missing_file_and_bad_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allocate", "--topology", "/nonexistent.json", "--jobs", "/nonexistent.json"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert main(["collisions", "--leaves", "2,x"]) == 2


def test_collisions_command_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "collisions", "--leaves", "2", "--trials", "5", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {(r["placement"], r["routing"]) for r in rows} == {
        ("random", "ecmp"),
        ("vclos", "ecmp"),
        ("vclos", "source"),
    }
