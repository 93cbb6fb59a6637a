"""Job files: the API's fields, an unknown key named, code relative to the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from portalctl.jobfile import JobFileError, load_job_file, parse_job_file


def test_a_job_file_gives_the_api_fields() -> None:
    fields = parse_job_file(
        "name: ddp\nentrypoint: train.py --epochs 4\nlauncher: torchrun\ngpus: 2\n"
        "min_gpus: 1\nmax_gpus: 4\nenv: {MODE: offline, N: 3, EMPTY: }\n"
    )
    assert fields == {
        "name": "ddp",
        "entrypoint": "train.py --epochs 4",
        "launcher": "torchrun",
        "gpus": 2,
        "min_gpus": 1,
        "max_gpus": 4,
        "env": {"MODE": "offline", "N": "3", "EMPTY": ""},
    }


def test_an_unknown_key_is_an_error_that_names_it() -> None:
    with pytest.raises(JobFileError, match=r"unknown key\(s\) gpu, min"):
        parse_job_file("name: x\ngpu: 2\nmin: 1\n", source="job.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "expected a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
        ("env: [A=1]\n", "env must be a mapping"),
    ],
)
def test_a_bad_file_is_an_error(text: str, message: str) -> None:
    with pytest.raises(JobFileError, match=message):
        parse_job_file(text)


def test_code_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text("name: x\ncode: src\ngpus: 1\n")
    assert load_job_file(job)["code"] == str(tmp_path / "src")
    job.write_text("name: x\ncode: " + "a" * 64 + "\n")  # a bundle id stays an id
    assert load_job_file(job)["code"] == "a" * 64
    with pytest.raises(JobFileError, match=r"missing\.yaml"):
        load_job_file(tmp_path / "missing.yaml")
