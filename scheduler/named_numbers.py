"""``name=number`` lists from the command line (``a=2,b=1``, ``high=0.1,low=0.3``), split once.

The simulator's tenant weights and priority shares are both written this way;
each caller checks the numbers by its own rule and words its own errors.
"""

from __future__ import annotations

from collections.abc import Collection


def named_numbers(
    text: str, what: str, example: str, names: Collection[str] | None = None
) -> list[tuple[str, str, float]]:
    """``(pair as written, name, number)`` for each comma-separated ``name=number``.

    Empty items are skipped.  ValueError (one line, naming ``what``) for an item
    without ``=`` or a name, a name outside ``names`` (when given), or a value
    that is not a number.
    """
    out: list[tuple[str, str, float]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name or (names is not None and name not in names):
            raise ValueError(f"bad {what} {part!r} (use e.g. {example})")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"bad {what} {part!r}: not a number") from None
        out.append((part, name, number))
    return out
