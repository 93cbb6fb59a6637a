"""Collecting a program's ARTIFACT_DIR: regular files only, bounded, never following a link."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from workers.agent.collect import collect, reports
from workers.agent.config import CollectLimits
from workers.artifacts import ArtifactStore


def make_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "model.pt").write_bytes(b"weights")
    (out / "sub" / "metrics.csv").write_text("step,loss\n1,0.5\n")
    secret = tmp_path / "secret"
    secret.write_text("agent's own file")
    (out / "link").symlink_to(secret)  # a program pointing at a host file
    (out / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    return out


def test_regular_files_are_uploaded_and_links_and_fifos_are_not(tmp_path: Path) -> None:
    store = ArtifactStore(f"file://{tmp_path / 'store'}")
    collected = collect(store, make_dir(tmp_path), CollectLimits())
    paths = [path for path, _obj in collected.stored]
    assert paths == ["artifacts/model.pt", "artifacts/sub/metrics.csv"]
    obj = dict(collected.stored)["artifacts/model.pt"]
    assert obj.size == 7 and obj.sha256 == hashlib.sha256(b"weights").hexdigest()
    with store.open_read("artifacts/model.pt") as fh:
        assert fh.read() == b"weights"
    stored_files = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert stored_files == ["metrics.csv", "model.pt"]  # nothing behind a link came along


def test_limits_bound_files_and_bytes(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    out = make_dir(tmp_path)
    by_count = collect(store, out, CollectLimits(max_files=1, max_bytes=10**9))
    assert [p for p, _ in by_count.stored] == ["artifacts/model.pt"]
    assert by_count.skipped == (("sub/metrics.csv", "more than 1 files"),)
    by_size = collect(store, out, CollectLimits(max_files=10, max_bytes=10))
    assert [p for p, _ in by_size.stored] == ["artifacts/model.pt"]
    assert "byte limit" in by_size.skipped[0][1]


def test_a_missing_directory_collects_nothing(tmp_path: Path) -> None:
    collected = collect(ArtifactStore(str(tmp_path)), tmp_path / "none", CollectLimits())
    assert collected.stored == () and collected.skipped == ()


def test_reports_name_the_job_relative_path_with_a_stable_event_id(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    collected = collect(store, make_dir(tmp_path), CollectLimits())
    first = reports("node-0", "job-3", collected)
    again = reports("node-0", "job-3", collected)
    assert [r.event_id for r in first] == [r.event_id for r in again]
    assert len({r.event_id for r in first}) == 2
    model = first[0]
    assert (model.kind, model.path, model.name, model.size) == (
        "user", "artifacts/model.pt", "model.pt", 7,
    )  # fmt: skip
