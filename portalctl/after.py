"""``--after``: what a job waits for, as a user types it.

::

    ok:12            after_ok on job 12 (it completed)
    any:13           after_any on job 13 (it ended, however)
    failed:14        after_failed on job 14 (it failed)
    ok:array:5       after_ok on every task of array 5

Several, comma-separated: ``--after ok:12,any:array:5``.  The long kinds
(``after_ok``) are taken too.  The result is the API's ``after`` list.
"""

from __future__ import annotations

from typing import Any

KINDS = {"ok": "after_ok", "any": "after_any", "failed": "after_failed"}


def parse_after(text: str) -> list[dict[str, Any]]:
    """The API's ``after`` from ``--after`` text; ValueError naming the part it cannot read."""
    found: list[dict[str, Any]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        pieces = part.split(":")
        kind = KINDS.get(pieces[0].removeprefix("after_"))
        what, number = ("job", pieces[1]) if len(pieces) == 2 else (None, "")
        if len(pieces) == 3 and pieces[1] == "array":
            what, number = "array", pieces[2]
        if kind is None or what is None or not number.isdigit() or int(number) < 1:
            raise ValueError(
                f"cannot read {part!r}: write KIND:JOB or KIND:array:ARRAY, KIND one of "
                "ok, any, failed (e.g. ok:12,any:array:5)"
            )
        found.append({"kind": kind, what: int(number)})
    if not found:
        raise ValueError("--after names nothing to wait for")
    return found
