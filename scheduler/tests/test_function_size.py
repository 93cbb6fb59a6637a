"""No function or method in ``scheduler/`` is over 80 lines (issue 37).

A long function in the scheduler is where state shared by closures hides
(the simulator's loop was one of 556 lines); past 80 lines, split it into
named steps.  A function's length runs from its ``def`` line to its last line,
docstring and comments included; its nested functions count in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SCHEDULER = Path(__file__).resolve().parents[1]
MAX_LINES = 80


def long_functions(root: Path = SCHEDULER, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` for each function under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_scheduler_is_over_80_lines() -> None:
    assert long_functions() == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    pass\n")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/long.py:1 long ({MAX_LINES + 1} lines)"]
