"""Inside an environment build's sandbox: a TCP port on loopback that leads to the agent's proxy.

An environment build runs in a network namespace with loopback only; the
agent's index proxy (``workers.agent.index_proxy``) listens on a Unix socket
bound into the sandbox, and uv speaks to proxies over TCP.  This script
listens on ``127.0.0.1:PORT``, carries each connection to that socket, runs
the command given after ``--`` and exits with its status::

    python build_relay.py SOCKET PORT -- uv pip install ...

It runs as the build's own uid, inside the sandbox: it grants nothing the
proxy does not.  Standard library only (it runs as a script, off the
portal's import path); the agent's proxy (``workers.agent.index_proxy``)
uses its ``relay`` too.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

CHUNK = 1 << 16


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` closes, then close ``sink``'s sending side."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways between ``a`` and ``b`` until both directions have ended."""
    back = threading.Thread(target=pump, args=(b, a), daemon=True)
    back.start()
    pump(a, b)
    back.join()


def _carry(client: socket.socket, path: str) -> None:
    with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(path)
        except OSError:
            return
        relay(client, upstream)


def _listen(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_carry, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    """Relay ``127.0.0.1:PORT`` to ``SOCKET`` while the command after ``--`` runs."""
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: build_relay.py SOCKET PORT -- COMMAND...\n")
        return 2
    path, port, command = argv[0], int(argv[1]), argv[3:]
    listener = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=_listen, args=(listener, path), daemon=True).start()
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
