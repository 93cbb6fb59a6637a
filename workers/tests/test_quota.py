"""A job's quota on a node: the walk (links, hard links, early stop) and the verdict."""

from __future__ import annotations

import os
from pathlib import Path

from workers.agent.quota import MIB, Quota, Usage, measure, verdict

BIG = 1 << 62


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_it_counts_the_blocks_below_every_root_and_a_missing_root_holds_nothing(
    tmp_path: Path,
) -> None:
    write(tmp_path / "a" / "one", 300_000)
    write(tmp_path / "a" / "deep" / "er" / "two", 200_000)
    write(tmp_path / "b" / "three", 100_000)
    usage = measure(
        (tmp_path / "a", tmp_path / "b", tmp_path / "gone"), max_bytes=BIG, max_entries=BIG
    )
    assert usage.complete
    assert 600_000 <= usage.bytes < 600_000 + 6 * 8192  # whole blocks, each file rounded up
    assert usage.entries == 5  # three files and two directories below the roots


def test_a_sparse_file_counts_what_it_holds_not_its_size(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(10 * 2**30)
        f.write(b"x")
    assert measure((tmp_path,), max_bytes=BIG, max_entries=BIG).bytes < MIB


def test_links_are_never_followed_and_a_hard_linked_file_counts_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / "big", 2 * MIB)
    job = tmp_path / "job"
    job.mkdir()
    (job / "to-dir").symlink_to(outside)
    (job / "to-file").symlink_to(outside / "big")
    write(job / "mine", MIB)
    os.link(job / "mine", job / "again")
    usage = measure((job,), max_bytes=BIG, max_entries=BIG)
    assert MIB <= usage.bytes < MIB + 64 * 1024, usage
    assert usage.entries == 4


def test_the_walk_stops_as_soon_as_a_limit_is_passed(tmp_path: Path) -> None:
    for n in range(50):
        (tmp_path / f"f{n}").touch()
    usage = measure((tmp_path,), max_bytes=BIG, max_entries=10)
    assert usage == Usage(0, 11, complete=False)
    write(tmp_path / "sub" / "big", 3 * MIB)
    usage = measure((tmp_path,), max_bytes=MIB, max_entries=BIG)
    assert not usage.complete and usage.bytes > MIB


QUOTA = Quota(disk_bytes=4 * MIB, entries=100, shm_bytes=2 * MIB)


def test_the_verdict_names_the_job_the_node_the_figure_and_the_setting() -> None:
    assert verdict("job-1", "node-0", Usage(4 * MIB, 100), Usage(2 * MIB, 1), QUOTA) is None
    disk = verdict("job-1", "node-0", Usage(5 * MIB, 3, complete=False), Usage(), QUOTA)
    assert disk == (
        "job job-1 on node node-0 holds over 5.0 MiB in its node-local files (scratch, "
        "checkpoints, artifacts, output), over its quota of 4 MiB (SANDBOX_SCRATCH_MB): stopped"
    )
    files = verdict("job-1", "node-0", Usage(0, 101, complete=False), Usage(), QUOTA)
    assert files is not None and "over 101 files" in files and "SANDBOX_SCRATCH_FILES" in files
    shm = verdict("job-1", "node-0", Usage(), Usage(3 * MIB, 1), QUOTA)
    assert shm is not None and "3.0 MiB in its shared memory" in shm and "SANDBOX_SHM_MB" in shm
