"""The example in docs/scheduler.md runs and prints what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


def test_interface_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = DOC.read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    exec(compile(block.group(1), str(DOC), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "[Preempt(job='old'), Start(job='new', gpus=(0, 1, 2, 3, 4, 5, 6, 7), base=0)]"
    )
    assert out[1] == "['dlas', 'elastic-tiresias', 'fifo', 'srtf', 'tiresias']"
