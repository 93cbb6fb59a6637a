"""``portalctl shell``'s pure parts: the socket's address, the exit status, the open frame."""

from __future__ import annotations

import pytest

from portalctl.shell import ShellRequest, exit_status, refusal_text, socket_url


@pytest.mark.parametrize(
    "base,url",
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/jobs/7/shell/"),
        ("https://portal.example/", "wss://portal.example/ws/jobs/7/shell/"),
    ],
)
def test_the_socket_of_a_jobs_shell(base: str, url: str) -> None:
    assert socket_url(base, 7) == url


@pytest.mark.parametrize("code,status", [(0, 0), (3, 3), (-2, 130), (-9, 137), (None, 255)])
def test_the_exit_status_is_the_commands_and_a_signal_is_128_plus_it(
    code: int | None, status: int
) -> None:
    assert exit_status(code) == status


def test_the_open_frame_names_the_worker_only_when_chosen() -> None:
    assert "worker" not in ShellRequest(job_id=1).open_message()
    frame = ShellRequest(job_id=1, worker="w3", argv=("id",)).open_message()
    assert frame == {"type": "open", "worker": "w3", "argv": ["id"], "term": "xterm-256color",
                     "rows": 24, "cols": 80}  # fmt: skip
    refusal = {"status": 404, "field": "job", "message": "no job 1"}
    assert refusal_text(refusal) == "404 no job 1 (job)"
