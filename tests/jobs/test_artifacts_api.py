"""GET /api/v1/jobs/{id}/artifacts/, .../download/ and /metrics/: tenancy, bytes, ranges."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from control.reports import handle_report
from devtools.job_steps import move
from jobs.api.downloads import (
    ByteRange,
    ObjectMismatch,
    RangeNotSatisfiable,
    etag_matches,
    parse_range,
)
from jobs.models import Artifact, Job
from tests.jobs.outputs_helpers import (
    event_id,
    metrics,
    put_object,
    stored,
    submit,
)
from workers.protocol import Progress

pytestmark = pytest.mark.django_db

DATA = bytes(range(256)) * 40 + b"tail"  # 10244 bytes


@pytest.fixture
def job(alice: Any, acme: Any) -> Job:
    return submit(alice, acme)


@pytest.fixture
def final(job: Job, store_dir: Path) -> Artifact:
    path = "checkpoints/step-000000100.pt"
    put_object(store_dir, job, path, DATA)
    stored(job, path, DATA, step=100, kind="final")
    return Artifact.objects.get(job=job)


def download(client: APIClient, artifact: Artifact, **headers: str) -> Any:
    url = f"/api/v1/jobs/{artifact.job_id}/artifacts/{artifact.pk}/download/"
    return client.get(url, headers=headers)


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


# --------------------------------------------------------------------------- pure parsing


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("bytes=0-9", ByteRange(0, 10, 100)),
        ("bytes=90-", ByteRange(90, 100, 100)),
        ("bytes=-10", ByteRange(90, 100, 100)),
        ("bytes=-500", ByteRange(0, 100, 100)),
        ("bytes=95-200", ByteRange(95, 100, 100)),
        ("bytes=99-99", ByteRange(99, 100, 100)),
        ("bytes = 1-2", ByteRange(1, 3, 100)),
        ("bytes=0-1,5-6", None),  # several ranges: the whole object
        ("items=0-1", None),
        ("bytes=5-2", None),
        ("bytes=-", None),
        ("bytes=a-b", None),
    ],
)
def test_parse_range(header: str | None, expected: ByteRange | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    ("header", "size"), [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=0-", 0)]
)
def test_parse_range_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, size)


HUGE = "9" * 5000  # past Python's 4300-digit int() limit, and past any object's size


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"bytes=0-{HUGE}", ByteRange(0, 100, 100)),  # a last byte past the end: to the end
        (f"bytes=-{HUGE}", ByteRange(0, 100, 100)),  # a suffix longer than the object: all
        (f"bytes={'0' * 5000}5-9", ByteRange(5, 10, 100)),  # leading zeros are still 5
        (f"bytes=5-{'0' * 5000}9", ByteRange(5, 10, 100)),
        (f"bytes={HUGE}-5", None),  # last before first: not a valid range, ignored
        ("bytes=" + "1-2," * 5000 + "3-4", None),  # many ranges: the whole object
        ("bytes=0-9" + " " * 10_000, ByteRange(0, 10, 100)),  # length alone is no problem
    ],
)
def test_parse_range_of_huge_numbers_is_bounded(header: str, expected: ByteRange | None) -> None:
    """RFC 9110 14.1.2: positions are unbounded digits; a server must not fail on them."""
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize("header", [f"bytes={HUGE}-", f"bytes={HUGE}-{HUGE}"])
def test_parse_range_starting_past_any_end_is_unsatisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 100)


def test_byte_range_headers() -> None:
    span = ByteRange(10, 20, 100)
    assert (span.length, span.content_range) == (10, "bytes 10-19/100")


def test_etag_matching() -> None:
    assert etag_matches('"abc"', '"abc"')
    assert etag_matches('"x", W/"abc"', '"abc"')
    assert etag_matches("*", '"abc"')
    assert not etag_matches('"abd"', '"abc"')
    assert not etag_matches(None, '"abc"')


# --------------------------------------------------------------------------- the endpoints


def test_the_list_names_each_object_with_its_download_url(
    token_client: Any, alice: Any, job: Job, final: Artifact
) -> None:
    response = token_client(alice).get(f"/api/v1/jobs/{job.pk}/artifacts/")
    assert response.status_code == 200
    (row,) = response.json()["results"]
    assert row["kind"] == "final"
    assert row["path"] == "checkpoints/step-000000100.pt"
    assert row["name"] == "step-000000100.pt"
    assert (row["step"], row["size"]) == (100, len(DATA))
    assert row["sha256"] == hashlib.sha256(DATA).hexdigest()
    assert row["download_url"].endswith(f"/api/v1/jobs/{job.pk}/artifacts/{final.pk}/download/")


def test_another_tenants_job_and_artifact_are_not_found(
    token_client: Any, bob: Any, alice: Any, acme: Any, job: Job, final: Artifact
) -> None:
    client = token_client(bob)
    assert client.get(f"/api/v1/jobs/{job.pk}/artifacts/").status_code == 404
    assert download(client, final).status_code == 404
    # an artifact of another job, asked through one's own job, is not found either
    mine = submit(alice, acme, "second")
    url = f"/api/v1/jobs/{mine.pk}/artifacts/{final.pk}/download/"
    assert token_client(alice).get(url).status_code == 404


def test_the_whole_object_streams_with_length_etag_and_name(
    token_client: Any, alice: Any, final: Artifact
) -> None:
    response = download(token_client(alice), final)
    assert response.status_code == 200
    assert body(response) == DATA
    assert response["Content-Length"] == str(len(DATA))
    assert response["ETag"] == f'"{hashlib.sha256(DATA).hexdigest()}"'
    assert response["Accept-Ranges"] == "bytes"
    assert response["Content-Disposition"] == 'attachment; filename="step-000000100.pt"'


def test_a_known_etag_is_not_modified(token_client: Any, alice: Any, final: Artifact) -> None:
    response = download(token_client(alice), final, **{"If-None-Match": f'"{final.sha256}"'})
    assert response.status_code == 304
    assert response["ETag"] == f'"{final.sha256}"'
    assert response.content == b""


@pytest.mark.parametrize(
    ("header", "start", "stop"),
    [
        ("bytes=0-99", 0, 100),
        ("bytes=10000-", 10000, len(DATA)),
        ("bytes=-4", len(DATA) - 4, len(DATA)),
    ],
)
def test_a_range_is_partial_content(
    token_client: Any, alice: Any, final: Artifact, header: str, start: int, stop: int
) -> None:
    response = download(token_client(alice), final, Range=header)
    assert response.status_code == 206
    assert body(response) == DATA[start:stop]
    assert response["Content-Length"] == str(stop - start)
    assert response["Content-Range"] == f"bytes {start}-{stop - 1}/{len(DATA)}"


def test_a_range_past_the_end_is_416(token_client: Any, alice: Any, final: Artifact) -> None:
    response = download(token_client(alice), final, Range=f"bytes={len(DATA)}-")
    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{len(DATA)}"


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"bytes={HUGE}-", 416),  # first byte past the end (RFC 9110 14.1.2): unsatisfiable
        (f"bytes=0-{HUGE}", 206),  # last byte past the end: up to the end
        (f"bytes=-{HUGE}", 206),  # the whole object, as a range
        ("bytes=" + "9" * 100_000, 200),  # not a range at all: ignored, the whole object
    ],
)
def test_a_range_of_thousands_of_digits_is_never_a_500(
    token_client: Any, alice: Any, final: Artifact, header: str, status: int
) -> None:
    response = download(token_client(alice), final, Range=header)
    assert response.status_code == status
    if status == 416:
        assert response["Content-Range"] == f"bytes */{len(DATA)}"
    else:
        assert body(response) == DATA


def test_a_missing_object_is_a_clear_404(
    token_client: Any, alice: Any, final: Artifact, store_dir: Path
) -> None:
    (store_dir / final.path).unlink()
    response = download(token_client(alice), final)
    assert response.status_code == 404
    assert "missing from the artifact store" in response.json()["message"]


def test_a_corrupt_object_aborts_the_stream_before_its_end(
    token_client: Any, alice: Any, final: Artifact, store_dir: Path, caplog: Any
) -> None:
    flipped = bytearray(DATA)
    flipped[5000] ^= 0xFF
    (store_dir / final.path).write_bytes(bytes(flipped))
    response = download(token_client(alice), final)
    received = bytearray()
    with caplog.at_level(logging.ERROR), pytest.raises(ObjectMismatch):
        for piece in response.streaming_content:
            received += piece
    assert len(received) < len(DATA)
    assert "download aborted" in caplog.text


def test_metrics_give_progress_and_logged_series(
    token_client: Any, alice: Any, bob: Any, job: Job
) -> None:
    metrics(job, [(1, {"acc": 0.5, "lr": 0.1}), (2, {"acc": 0.75})])
    metrics(job, [(3, {"acc": 0.8})])
    client = token_client(alice)
    answer = client.get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    assert answer["metrics"] == {"acc": [[1, 0.5], [2, 0.75], [3, 0.8]], "lr": [[1, 0.1]]}
    assert answer["progress"] == []
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=2)
    progress = Progress(
        node="node-0", job=f"job-{job.pk}", event_id=event_id(), step=3, samples_per_s=120.0,
        world=2, loss=0.25,
    )  # fmt: skip
    assert handle_report(progress.to_dict()) == "progress"
    (point,) = client.get(f"/api/v1/jobs/{job.pk}/metrics/").json()["progress"]
    assert {k: point[k] for k in ("step", "samples_per_s", "parallelism", "loss")} == {
        "step": 3,
        "samples_per_s": 120.0,
        "parallelism": 2,
        "loss": 0.25,
    }
    later = client.get(f"/api/v1/jobs/{job.pk}/metrics/?since_step=2").json()
    assert later["metrics"] == {"acc": [[3, 0.8]]}
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics/?since_step=x").status_code == 400
    assert token_client(bob).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 404
