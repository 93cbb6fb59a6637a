"""``portalctl shell``: a terminal (or one command) in a running job's worker, over the portal.

::

    portalctl ──WebSocket /ws/jobs/<job>/shell/ (Authorization: Token)──> portal ──> agent
       stdin ──binary frames──>            resize on SIGWINCH, eof at end of stdin
       stdout <──binary frames──           {"type": "exit", "code": N} ──> exit status N

With a terminal on stdin, the local terminal is put in raw mode, so every key
(Ctrl-C included) goes to the remote PTY, which turns it into a signal there.  The exit
status is the remote command's (a signal N gives 128 + N); 255 when portalctl itself
could not run it (refused, unreachable, the shell ended with no status), as ``ssh`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import aiohttp

EXIT_OWN_FAILURE = 255
READ_CHUNK = 4096
"""Bytes of stdin per frame (the portal takes up to ``SHELL_MAX_FRAME_BYTES``, 16 KiB)."""


class ShellFailed(Exception):
    """The shell could not be opened or ended without a status: the portal's message."""


@dataclass(frozen=True)
class ShellRequest:
    """What to open: the job, its worker (None: the first), the command (empty: a shell)."""

    job_id: int
    worker: str | None = None
    argv: tuple[str, ...] = ()
    term: str = "xterm-256color"
    rows: int = 24
    cols: int = 80

    def open_message(self) -> dict[str, Any]:
        """The socket's first frame."""
        message: dict[str, Any] = {
            "type": "open",
            "argv": list(self.argv),
            "term": self.term,
            "rows": self.rows,
            "cols": self.cols,
        }
        if self.worker:
            message["worker"] = self.worker
        return message


def socket_url(base: str, job_id: int) -> str:
    """The shell socket of ``job_id`` on the portal at ``base`` (http -> ws, https -> wss)."""
    base = base.rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws/jobs/{job_id}/shell/"


def exit_status(code: int | None) -> int:
    """portalctl's exit status for the shell's: -N (signal N) is 128 + N."""
    if code is None:
        return EXIT_OWN_FAILURE
    return 128 - code if code < 0 else code & 0xFF


def refusal_text(frame: dict[str, Any]) -> str:
    """A refusal frame as one line."""
    field_name = frame.get("field")
    where = f" ({field_name})" if field_name else ""
    return f"{frame.get('status', '')} {frame.get('message', 'refused')}{where}".strip()


def say(stream: TextIO, text: str) -> None:
    """One line of portalctl's own on ``stream`` (``\r\n``: the terminal may be raw)."""
    stream.write(f"portalctl: {text}\r\n")
    stream.flush()


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[bool]:
    """The terminal on ``fd`` in raw mode while inside (True), or nothing when it is none."""
    if not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@dataclass
class _Session:
    """One open socket: pumps stdin to it and its frames to stdout."""

    ws: aiohttp.ClientWebSocketResponse
    stdin_fd: int
    stdout: BinaryIO
    stderr: TextIO
    tasks: list[asyncio.Future[Any]] = field(default_factory=list)

    async def send_input(self) -> None:
        """stdin to the shell; end of stdin becomes end of input."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        try:
            loop.add_reader(self.stdin_fd, lambda: chunks.put_nowait(self._read()))
        except (PermissionError, OSError, ValueError):  # a file or /dev/null: it never blocks
            while chunk := self._read():
                await self.ws.send_bytes(chunk)
            await self.ws.send_json({"type": "eof"})
            return
        try:
            while chunk := await chunks.get():
                await self.ws.send_bytes(chunk)
            await self.ws.send_json({"type": "eof"})
        finally:
            loop.remove_reader(self.stdin_fd)

    def _read(self) -> bytes:
        try:
            return os.read(self.stdin_fd, READ_CHUNK)
        except OSError:
            return b""

    def resize(self) -> None:
        """Tell the shell the local terminal's new size (on SIGWINCH)."""
        size = shutil.get_terminal_size()
        message = {"type": "resize", "rows": size.lines, "cols": size.columns}
        self.tasks.append(asyncio.ensure_future(self.ws.send_json(message)))

    async def receive(self) -> int:
        """Output until the exit frame; the exit status."""
        async for frame in self.ws:
            if frame.type == aiohttp.WSMsgType.BINARY:
                self.stdout.write(frame.data)
                self.stdout.flush()
            elif frame.type == aiohttp.WSMsgType.TEXT:
                message = json.loads(frame.data)
                if message.get("type") == "exit":
                    if message.get("reason"):
                        say(self.stderr, f"shell ended: {message['reason']}")
                    return exit_status(message.get("code"))
                if message.get("type") == "error":
                    say(self.stderr, refusal_text(message))
        raise ShellFailed("the portal closed the shell without an exit status")


async def run_shell(
    base_url: str,
    token: str,
    request: ShellRequest,
    *,
    stdin_fd: int,
    stdout: BinaryIO,
    stderr: TextIO,
) -> int:
    """Open the shell, pump both ways until it exits; its exit status (``exit_status``)."""
    headers = {"Authorization": f"Token {token}", "Origin": base_url.rstrip("/")}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(socket_url(base_url, request.job_id), headers=headers) as ws,
    ):
        await ws.send_json(request.open_message())
        first = await ws.receive()
        if first.type != aiohttp.WSMsgType.TEXT:
            raise ShellFailed(f"the portal closed the socket ({ws.close_code})")
        opened = json.loads(first.data)
        if opened.get("type") != "opened":
            raise ShellFailed(refusal_text(opened))
        session = _Session(ws, stdin_fd, stdout, stderr)
        sender = asyncio.ensure_future(session.send_input())
        loop = asyncio.get_running_loop()
        if os.isatty(stdin_fd):
            loop.add_signal_handler(signal.SIGWINCH, session.resize)
        try:
            return await session.receive()
        finally:
            sender.cancel()
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGWINCH)


def shell(base_url: str, token: str, request: ShellRequest) -> int:
    """``portalctl shell``: run it on this process's terminal; the exit status to exit with."""
    stdin_fd = sys.stdin.fileno()
    if os.isatty(stdin_fd):
        size = shutil.get_terminal_size()
        request = ShellRequest(
            request.job_id, request.worker, request.argv, os.environ.get("TERM") or request.term,
            size.lines, size.columns,
        )  # fmt: skip
    try:
        with raw_terminal(stdin_fd):
            return asyncio.run(
                run_shell(
                    base_url,
                    token,
                    request,
                    stdin_fd=stdin_fd,
                    stdout=sys.stdout.buffer,
                    stderr=sys.stderr,
                )
            )
    except ShellFailed as failed:
        say(sys.stderr, str(failed))
    except (aiohttp.ClientError, OSError) as exc:
        say(sys.stderr, f"cannot reach the portal: {exc}")
    return EXIT_OWN_FAILURE
