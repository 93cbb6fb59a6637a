"""An environment build runs a package's own code: in the job's sandbox, with the index as its
only network (``workers.agent.build_sandbox``, ``workers.agent.index_proxy``).

The attacks are real source distributions whose in-tree build backend (no
index needed to build them) tries, while uv builds it, to leave: write on the
host, read the agent's secrets, reach services on the host's loopback, reach
the network past the proxy.  What it saw is compiled into the package it
builds, so the test reads the attempt's results from the installed module.
"""

from __future__ import annotations

import ast
import http.server
import io
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.agent.build_sandbox import SandboxedBuilds, reclaim
from workers.agent.config import AgentConfig, SandboxSettings
from workers.agent.environments import EnvironmentCache, EnvironmentFailed, EnvironmentSettings
from workers.agent.index_proxy import (
    PYPI_HOSTS,
    IndexProxy,
    Refused,
    allowed_hosts,
    parse_request,
    public_addresses,
)
from workers.agent.sandbox import sandbox_problem
from workers.environment import check_environment
from workers.tests.escapee import escapee_sdist

ALLOWED = frozenset({("pypi.org", 443), ("127.0.0.1", 8080)})

# --------------------------------------------------------------------------- the proxy's rule


def test_a_tunnel_goes_only_to_an_allowed_host() -> None:
    request = parse_request(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443", ALLOWED)
    assert request.tunnel and (request.host, request.port) == ("pypi.org", 443)
    for target in ("pypi.org:22", "169.254.169.254:443", "localhost:8080", "PYPI.org.evil:443"):
        with pytest.raises(Refused, match="not the operator's package index"):
            parse_request(f"CONNECT {target} HTTP/1.1".encode(), ALLOWED)
    with pytest.raises(Refused, match="host:port"):
        parse_request(b"CONNECT pypi.org HTTP/1.1", ALLOWED)


def test_a_plain_request_is_sent_on_for_one_exchange_only() -> None:
    head = (
        b"GET http://127.0.0.1:8080/simple/x/?a=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
        b"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*"
    )
    request = parse_request(head, ALLOWED)
    assert not request.tunnel and request.port == 8080
    lines = request.head.decode().split("\r\n")
    assert lines[0] == "GET /simple/x/?a=1 HTTP/1.1"
    assert "Accept: */*" in lines and "Connection: close" in lines
    assert not [line for line in lines if line.lower().startswith("proxy-")]
    assert request.head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    "head",
    [
        b"GET https://pypi.org/simple/ HTTP/1.1",  # https is a tunnel's, not a plain request's
        b"GET /simple/ HTTP/1.1",  # not a proxy request
        b"GET http://127.0.0.1:9/ HTTP/1.1",  # another port of the same host
        b"GET http://127.0.0.1:8080/ SPDY/3",
        "GET http://127.0.0.1:8080/\u00e9 HTTP/1.1".encode(),
        b"GET http://127.0.0.1:99999/ HTTP/1.1",
    ],
)
def test_anything_else_is_refused(head: bytes) -> None:
    with pytest.raises(Refused):
        parse_request(head, ALLOWED)


def test_the_allowed_hosts_are_the_operators_index_and_nothing_for_a_local_one() -> None:
    assert allowed_hosts("", (), "", False) == frozenset(PYPI_HOSTS)
    assert allowed_hosts("", (), "/srv/wheels", True) == frozenset()
    assert allowed_hosts("file:///srv/simple", (), "", False) == frozenset()
    hosts = allowed_hosts(
        "https://pypi.internal/simple", ("http://mirror:8080/simple",), "", False, ("cdn.internal",)
    )
    assert hosts == {("pypi.internal", 443), ("mirror", 8080), ("cdn.internal", 443)}


# --------------------------------------------------------------------------- reclaiming


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid's files need root")
def test_reclaim_takes_a_build_back_without_following_its_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the build's")
    os.chown(outside, 12345, 12345)
    site = tmp_path / "site"
    site.mkdir()
    planted = site / "tool"
    planted.write_text("#!/bin/sh\n")
    os.chown(planted, 200001, 200001)
    os.chmod(planted, 0o6777)  # set-uid, set-gid, writable by all
    (site / "link").symlink_to(outside)
    os.chown(site, 200001, 200001)
    reclaim((site,))
    info = planted.stat()
    assert (info.st_uid, info.st_gid) == (0, 0)
    assert stat.S_IMODE(info.st_mode) == 0o755  # no set-id bit, nobody else writes
    assert (site / "link").lstat().st_uid == 0 and outside.stat().st_uid == 12345


# --------------------------------------------------------------------------- real builds

needs_sandbox = pytest.mark.skipif(
    sandbox_problem() is not None, reason=f"bubblewrap cannot run here: {sandbox_problem()}"
)


@pytest.fixture
def loopback() -> Iterator[tuple[int, list[str]]]:
    """A service on the host's loopback (the portal's web server, say) that logs who came."""
    came: list[str] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            came.append("connection")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], came
    stop.set()
    thread.join()
    server.close()


def sandboxed_cache(tmp_path: Path, **settings: object) -> tuple[EnvironmentCache, AgentConfig]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    environments = EnvironmentSettings(
        **{"root": data_dir / "envs", "timeout_s": 120.0, **settings}  # type: ignore[arg-type]
    )
    config = AgentConfig(
        node="build-node",
        device="cpu",
        slots=1,
        redis_url="redis://127.0.0.1:1/0",
        data_dir=data_dir,
        sandbox=SandboxSettings(),
        environments=environments,
    )
    return EnvironmentCache(environments, runner=SandboxedBuilds(config)), config


def seen_by(cache: EnvironmentCache, key_path: Path) -> dict[str, object]:
    text = (key_path / "site" / "escapee" / "__init__.py").read_text()
    return dict(json.loads(ast.literal_eval(text.split("=", 1)[1].strip())))


@needs_sandbox
def test_a_build_script_runs_in_the_jobs_sandbox_and_cannot_leave_it(
    tmp_path: Path, loopback: tuple[int, list[str]]
) -> None:
    port, came = loopback
    cache, config = sandboxed_cache(tmp_path, find_links=str(tmp_path / "links"), no_index=True)
    secret = config.data_dir / "agent-secret.txt"
    secret.write_text("the agent's signing key")
    marker = Path("/tmp") / f"escaped-{os.getpid()}"
    escapee_sdist(tmp_path / "links", marker, secret, port)
    log = io.StringIO()
    built = cache.ensure(check_environment({"requirements": ["escapee==1.0"]}), log, job="j1")
    assert built.packages == ("escapee==1.0",)  # the build itself works, sandboxed
    seen = seen_by(cache, built.path)
    if os.geteuid() == 0:
        assert seen["uid"] == SandboxedBuilds(config).identity("j1").uid  # type: ignore[union-attr]
    assert seen["uid"] != 0
    assert not marker.exists()  # its /tmp was its own
    assert seen["data"] != "the agent's signing key" and seen["shadow"] in ("", "PermissionError")
    assert seen["plant"] in ("OSError", "PermissionError", "FileNotFoundError")
    assert not (config.data_dir / "planted").exists()
    assert seen["loopback"] != "connected" and came == []  # no network at all: a local index
    # the agent took its files back: nothing of the build is the job's uid's any more
    assert {p.lstat().st_uid for p in built.path.rglob("*")} == {os.geteuid()}
    assert "[environment]" in log.getvalue()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


@needs_sandbox
def test_a_build_reaches_its_index_through_the_proxy_and_nothing_else(
    tmp_path: Path, loopback: tuple[int, list[str]]
) -> None:
    """The index is an HTTP server on the host (a mirror); the build reaches it through the
    agent's proxy, and the same proxy refuses the host's other loopback service."""
    port, came = loopback
    links = tmp_path / "links"
    served = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0),
        lambda *a: _Quiet(*a, directory=str(links)),
    )
    threading.Thread(target=served.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{served.server_address[1]}/"
    try:
        cache, config = sandboxed_cache(tmp_path, find_links=index, no_index=True)
        escapee_sdist(links, Path("/tmp/unused"), config.data_dir / "none", port)
        log = io.StringIO()
        built = cache.ensure(check_environment({"requirements": ["escapee"]}), log, job="j2")
    finally:
        served.shutdown()
        served.server_close()
    seen = seen_by(cache, built.path)
    assert seen["loopback"] != "connected"  # directly: the namespace has no way out
    assert seen["via_proxy"] == "403"  # through the proxy: not the index
    assert came == []
    assert f"127.0.0.1:{port} is not the operator's package index" in log.getvalue()


@needs_sandbox
def test_a_build_that_fails_in_the_sandbox_says_why(tmp_path: Path) -> None:
    cache, _ = sandboxed_cache(tmp_path, find_links=str(tmp_path / "links"), no_index=True)
    (tmp_path / "links").mkdir()
    with pytest.raises(EnvironmentFailed, match="escapee"):
        cache.ensure(check_environment({"requirements": ["escapee==2.0"]}), job="j3")


def test_the_proxy_serves_an_allowed_host_end_to_end(tmp_path: Path) -> None:
    """Through the Unix socket: an allowed plain request is answered, another port is not."""
    (tmp_path / "hello.txt").write_text("hello from the index")
    served = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0),
        lambda *a: _Quiet(*a, directory=str(tmp_path)),
    )
    threading.Thread(target=served.serve_forever, daemon=True).start()
    port = served.server_address[1]
    try:
        with IndexProxy(tmp_path / "p.sock", frozenset({("127.0.0.1", port)})) as proxy:
            answers = []
            for target in (f"127.0.0.1:{port}/hello.txt", f"127.0.0.1:{port + 1}/"):
                with socket.socket(socket.AF_UNIX) as conn:
                    conn.connect(str(tmp_path / "p.sock"))
                    conn.sendall(f"GET http://{target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    answers.append(b"".join(iter(lambda c=conn: c.recv(4096), b"")))  # type: ignore[misc]
    finally:
        served.shutdown()
        served.server_close()
    assert answers[0].startswith(b"HTTP/1.0 200") and answers[0].endswith(b"hello from the index")
    assert answers[1].startswith(b"HTTP/1.1 403") and len(proxy.refused) == 1


def test_the_operators_extra_hosts_are_checked_when_the_agent_starts() -> None:
    from workers.agent.config import AgentConfigError, AgentEnvironment

    env = {"REDIS_URL": "redis://127.0.0.1:6379/0", "AGENT_NODE": "n", "AGENT_KEY": "00" * 32}
    good = AgentEnvironment.read({**env, "ENVIRONMENT_NETWORK_ALLOW": "cdn.internal mirror:8443"})
    assert good.environments is not None
    assert good.environments.network_allow == ("cdn.internal", "mirror:8443")
    with pytest.raises(AgentConfigError, match="ENVIRONMENT_NETWORK_ALLOW"):
        AgentEnvironment.read({**env, "ENVIRONMENT_NETWORK_ALLOW": "https://cdn/x"})


# --------------------------------------------------------------------------- a job's own index


def test_a_jobs_own_index_is_reached_only_at_public_addresses() -> None:
    def info(address: str) -> tuple[object, ...]:
        return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 443))

    answers = [info(a) for a in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "192.168.0.9")]
    assert public_addresses(answers) == []
    assert public_addresses([*answers, info("8.8.8.8")]) == [info("8.8.8.8")]


def test_the_proxy_refuses_a_jobs_host_that_resolves_to_loopback(tmp_path: Path) -> None:
    """A job's index named ``localhost`` (or a DNS name pointing at the node) reaches nothing."""
    host = ("localhost", 8080)
    proxy = IndexProxy(tmp_path / "p.sock", frozenset({host}), public_only=frozenset({host}))
    with proxy, socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(tmp_path / "p.sock"))
        conn.sendall(b"CONNECT localhost:8080 HTTP/1.1\r\n\r\n")
        answer = b"".join(iter(lambda: conn.recv(4096), b""))
    assert answer.startswith(b"HTTP/1.1 502") and b"no public address" in answer


def test_a_jobs_own_index_is_used_only_where_the_node_allows_it(tmp_path: Path) -> None:
    (tmp_path / "links").mkdir()
    spec = check_environment({"requirements": ["x"], "indexes": ["https://pypi.example.org/s"]})
    refusing = EnvironmentCache(EnvironmentSettings(root=tmp_path / "a", find_links="/nowhere"))
    with pytest.raises(EnvironmentFailed, match="ENVIRONMENT_ALLOW_JOB_INDEX"):
        refusing.ensure(spec)
    local = EnvironmentCache(
        EnvironmentSettings(root=tmp_path / "b", no_index=True, allow_job_index=True)
    )
    with pytest.raises(EnvironmentFailed, match="local wheels only"):
        local.ensure(spec)
    allowing = EnvironmentCache(
        EnvironmentSettings(
            root=tmp_path / "c", allow_job_index=True, extra_index_urls=("https://ops/simple",)
        )
    )
    args = allowing._index_args(spec.indexes)
    assert args == ["--index", "https://ops/simple", "--index", "https://pypi.example.org/s"]
