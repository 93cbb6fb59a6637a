"""The waiting note for jobs that only suspect GPUs keep out (pure)."""

from __future__ import annotations

from control.suspect_notes import suspect_waits


def test_only_the_jobs_the_suspect_gpus_would_let_in_get_the_note() -> None:
    notes = suspect_waits({1: 4, 2: 3, 3: 6, 4: 2}, free=2, free_suspect=2)
    assert set(notes) == {1, 2}  # 4 and 3 fit with them; 6 does not; 2 fits without
    assert notes[1] == (
        "2 idle GPUs are out of service for a straggler's cool-down (suspect); "
        "2 are free for new work"
    )


def test_no_idle_suspect_gpu_no_note() -> None:
    assert suspect_waits({1: 4}, free=0, free_suspect=0) == {}


def test_one_of_each_reads_in_the_singular() -> None:
    assert suspect_waits({1: 2}, free=1, free_suspect=1) == {
        1: "1 idle GPU is out of service for a straggler's cool-down (suspect); 1 is free for new work"
    }
