"""The straggler loop's read-only queries on a stack's SQLite file (the embedded default).

``bench/elastic_scaling.py`` runs the loop on a stack with no ``DATABASE_URL``,
so on SQLite, where ``index`` is a keyword: unquoted, the queries failed there.
"""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from bench.straggler_loop import Db


def test_held_gpus_and_a_suspect_mark_are_read_from_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    until = datetime(2026, 12, 2, 1, 46, 34, tzinfo=UTC)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            'CREATE TABLE portal_gpu (id INTEGER PRIMARY KEY, "index" INTEGER, suspect_until TEXT);'
            "CREATE TABLE jobs_jobgpu (job_id INTEGER, gpu_id INTEGER, rank INTEGER);"
        )
        conn.executemany(
            "INSERT INTO portal_gpu VALUES (?, ?, ?)",
            [(10, 0, None), (11, 1, None), (12, 2, until.isoformat())],
        )
        conn.executemany("INSERT INTO jobs_jobgpu VALUES (7, ?, ?)", [(12, 0), (10, 1)])
        conn.commit()
    db = Db(None, path)
    assert db.held(7) == [2, 0]  # in rank order
    assert db.held(8) == []
    assert db.suspect_until(2) == until
    assert db.suspect_until(1) is None
