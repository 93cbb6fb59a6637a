"""The embedded Redis keeps its recorded port across quick restarts (the settings read it first)."""

from __future__ import annotations

import socket

from utilities.embedded_redis import _port_is_free


def test_a_port_our_server_just_closed_is_free_but_a_listening_one_is_not() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not _port_is_free(port)  # someone listens there
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server closes first: its side of the port goes to TIME_WAIT
    listener.close()
    client.close()
    # redis-server binds with SO_REUSEADDR, so it could listen here again at once:
    # the recorded port (and the URL the settings read) stays right.
    assert _port_is_free(port)
