"""docker-compose.yml cannot run here, so we read it: services, wiring, real entry points,
secrets only from the environment; its Redis command and healthcheck run against a real
redis-server."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from django.core.management import get_commands

from tests.architecture.imports import LAYERS
from tests.redis_clients import one_try
from utilities.embedded_redis import server_binary

ROOT = Path(__file__).resolve().parent.parent
SECRETS = (
    "SECRET_KEY",
    "POSTGRES_PASSWORD",
    "REDIS_PASSWORD",
    "AGENT_SIGNING_KEY",
    "AGENT_KEY",
    "AGENT_REDIS_URL",
)
CONTROL_SERVICES = ("migrate", "web", "worker", "tick-worker", "whatif-worker", "beat")
"""The control plane: Django settings, the database, every secret."""
PORTAL_SERVICES = (*CONTROL_SERVICES, "agent")
VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?:(?P<op>:\?|:-)(?P<arg>[^}]*))?\}")


class MissingVariable(LookupError):
    """A ``${VAR:?message}`` whose variable is unset: compose refuses to start."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution (``${V}``, ``${V:-default}``, ``${V:?error}``, ``$$``)."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        if env.get(name):
            return env[name]
        if op == ":?":
            raise MissingVariable(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return VARIABLE.sub(substitute, value)


def raw() -> dict[str, Any]:
    """The file as written, variables not substituted."""
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file as compose sees it with ``env`` (each secret set to a sample by default)."""
    return interpolate(
        raw(), env if env is not None else {name: f"sample-{name}" for name in SECRETS}
    )


def test_services_present_and_wired() -> None:
    compose = load()
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= set(services)
    for name in CONTROL_SERVICES:
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"] == "redis://portal:sample-REDIS_PASSWORD@redis:6379/0"
        assert env["DJANGO_SETTINGS_MODULE"] == "portal.settings.prod"
        assert set(services[name]["depends_on"]) == {"postgres", "redis"}
    pg = services["postgres"]["environment"]
    url = f"postgres://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    assert services["web"]["environment"]["DATABASE_URL"] == url
    assert services["web"]["ports"] == ["8000-8009:8000"]


def test_every_command_names_a_real_entry_point() -> None:
    services = load()["services"]
    django_commands = set(get_commands())
    for name, service in services.items():
        command = service.get("command")
        if command is None or name in ("postgres", "redis"):
            continue
        assert command[0] == "python", name
        if command[1] == "-m":
            module = command[2]
            assert importlib.util.find_spec(module) is not None, (name, module)
            if module == "celery":
                assert command[3:5] == ["-A", "portal"]
                assert command[5] in {"worker", "beat"}
                assert importlib.import_module("portal").celery_app.main == "portal"
            if module == "daphne":
                target = command[-1]
                mod, attr = target.split(":")
                assert importlib.util.find_spec(mod) is not None
                assert f"\n{attr} = " in (ROOT / (mod.replace(".", "/") + ".py")).read_text()
        else:
            assert command[1] == "manage.py", name
            assert command[2] in django_commands, (name, command[2])


def test_dockerfile_copies_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in LAYERS:
        assert f"COPY {package} ./{package}" in dockerfile


def test_restart_unless_stopped_except_the_one_shot_migration() -> None:
    services = load()["services"]
    for name, service in services.items():
        expected = "no" if name == "migrate" else "unless-stopped"
        assert service.get("restart") == expected, name


@pytest.mark.parametrize("missing", SECRETS)
def test_compose_refuses_to_start_without_each_secret(missing: str) -> None:
    env = {name: f"sample-{name}" for name in SECRETS if name != missing}
    with pytest.raises(MissingVariable, match=missing):
        load(env)


def test_no_secret_is_written_in_the_file() -> None:
    """Every secret is a ``${VAR:?}`` reference; no credentials appear literally."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"://[^/\s:@]+:(?!\$\{)[^@\s]+@", text), "credentials in a URL"
    services = raw()["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    for name in CONTROL_SERVICES:
        env = services[name]["environment"]
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert "${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]
        assert "${REDIS_PASSWORD:?" in env["REDIS_URL"]
    # and with the variables set, each lands where it is used
    compose = load()
    web = compose["services"]["web"]["environment"]
    assert web["SECRET_KEY"] == "sample-SECRET_KEY"
    assert ":sample-POSTGRES_PASSWORD@postgres:" in web["DATABASE_URL"]
    pg = compose["services"]["postgres"]["environment"]
    assert pg["POSTGRES_PASSWORD"] == "sample-POSTGRES_PASSWORD"


def test_postgres_healthcheck_authenticates() -> None:
    """Over TCP with the password: the local socket would let anyone in."""
    check = " ".join(load()["services"]["postgres"]["healthcheck"]["test"])
    assert 'PGPASSWORD="$POSTGRES_PASSWORD"' in check  # expanded in the container, not here
    assert "-h 127.0.0.1" in check and "-U portal" in check


def redis_env(password: str) -> dict[str, str]:
    """Every secret set, the Redis password to ``password``."""
    return {**dict.fromkeys(SECRETS, "x"), "REDIS_PASSWORD": password}


@dataclass(frozen=True)
class RunningRedis:
    """The compose file's Redis, running here."""

    port: int
    pid: int


IMAGE_START = "docker-entrypoint.sh redis-server"
"""How the compose file's entrypoint starts the server in the redis image (here: the binary)."""


@contextlib.contextmanager
def compose_redis(tmp_path: Path, password: str) -> Iterator[RunningRedis]:
    """The compose file's redis entrypoint and command, run here on a free port.

    The entrypoint's shell execs the server: the process is the server's.
    """
    from devtools.browser import free_port

    port = free_port()
    service = load(redis_env(password))["services"]["redis"]
    shell, flag, script, name = service["entrypoint"]
    assert (shell, flag) == ("sh", "-c") and IMAGE_START in script
    script = script.replace(IMAGE_START, str(server_binary()))
    argv = [shell, flag, script, name, *service["command"]]
    argv += ["--port", str(port), "--dir", str(tmp_path)]
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "REDIS_PASSWORD": password}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                one_try(port=port, socket_timeout=0.5).ping()
            except redis.AuthenticationError:
                break  # up, and refusing the anonymous client
            except redis.ConnectionError:
                time.sleep(0.1)
        yield RunningRedis(port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_is_bounded_and_never_evicts(tmp_path: Path) -> None:
    """maxmemory with noeviction (full: writes refused, no key of the portal's dropped)."""
    password = secrets.token_hex(16)
    with compose_redis(tmp_path, password) as server:
        client = redis.Redis(
            port=server.port, username="portal", password=password, decode_responses=True
        )
        found = {name: str(value) for name, value in client.config_get("max*").items()}
        command_line = Path(f"/proc/{server.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        assert b"redis-server" in command_line  # the shell exec'd the server: its own argv
        assert password.encode() not in command_line, "the Redis password on a command line"
        assert (tmp_path / "redis-users.conf").stat().st_mode & 0o777 == 0o600
    assert int(found["maxmemory"]) == 4 * 2**30
    assert found["maxmemory-policy"] == "noeviction"
    assert int(found["maxclients"]) > 0
    command = load({**redis_env(password), "REDIS_MAXMEMORY": "512mb"})["services"]["redis"]
    assert "512mb" in command["command"]


def test_redis_requires_the_portal_user_and_password(tmp_path: Path) -> None:
    """Run the compose command: anonymous and default-user clients are refused, REDIS_URL works."""
    password = secrets.token_hex(16)
    with compose_redis(tmp_path, password) as server:
        port = server.port
        with pytest.raises(redis.AuthenticationError):
            one_try(port=port).ping()
        with pytest.raises(redis.AuthenticationError):  # the default user is off
            one_try(port=port, password=password).ping()
        env = redis_env(password)
        url = load(env)["services"]["web"]["environment"]["REDIS_URL"]
        assert redis.Redis.from_url(url.replace("@redis:6379", f"@127.0.0.1:{port}")).ping()

        # the healthcheck, as the container's shell would run it
        check = load(env)["services"]["redis"]["healthcheck"]["test"]
        assert check[0] == "CMD-SHELL"
        cli = f"{server_binary().with_name('redis-cli')} -p {port}"
        script = check[1].replace("redis-cli", cli)

        def healthy(secret: str) -> bool:
            run = subprocess.run(["sh", "-c", script], env={"REDIS_PASSWORD": secret}, timeout=10)
            return run.returncode == 0

        assert healthy(password)
        assert not healthy("wrong")


def test_dockerignore_keeps_local_state_out_of_images() -> None:
    patterns = set((ROOT / ".dockerignore").read_text().split())
    assert {"var/", ".venv/", ".git/", "**/__pycache__/", ".mypy_cache/", ".env"} <= patterns


def test_each_queue_has_its_own_worker_and_the_agent_its_key() -> None:
    """Reports, ticks and simulations never wait behind one another; the agent can sign."""
    services = load()["services"]
    queues = {
        name: service["command"][service["command"].index("-Q") + 1]
        for name, service in services.items()
        if "-Q" in service.get("command", [])
    }
    # heartbeats beside the reports: a backlog of reports never makes them expire unread
    assert sorted(queues.values()) == ["heartbeats,reports,portal", "tick", "webhooks", "whatif"]
    agent = services["agent"]["environment"]
    assert agent["AGENT_KEY"] == "sample-AGENT_KEY"
    assert agent["REDIS_URL"] == "sample-AGENT_REDIS_URL"  # its own user, not the portal's


CONTROL_SECRETS = ("SECRET_KEY", "AGENT_SIGNING_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD")
"""What a node must never hold: a taken-over node would sign as every node, read and change
the database, forge sessions, read every job's Redis password and every agent's commands."""


def test_the_agent_holds_its_own_key_and_nothing_of_the_control_planes() -> None:
    """docs/security.md: a taken-over node speaks only as itself."""
    agent = load()["services"]["agent"]
    env = agent["environment"]
    for name in ("SECRET_KEY", "AGENT_SIGNING_KEY", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
        assert name not in env, f"the agent is handed {name}"
    everything = yaml.safe_dump(agent)
    for name in CONTROL_SECRETS:
        assert f"sample-{name}" not in everything, f"{name}'s value reaches the agent"
    assert set(agent["depends_on"]) == {"redis"}  # no database to wait for
    assert set(env) == {"REDIS_URL", "PORTAL_DATA_DIR", "ARTIFACT_URL", "AGENT_KEY"}
    assert env["ARTIFACT_URL"] == load()["services"]["web"]["environment"]["ARTIFACT_URL"]


def test_the_agent_starts_from_its_environment_alone() -> None:
    """What compose hands the agent is all it reads (no Django settings, no database)."""
    from workers.agent.config import AgentEnvironment

    key = secrets.token_hex(32)
    own = "redis://agent-node-0:sample-password@redis:6379/0"  # manage.py agent_credentials
    samples = {name: f"sample-{name}" for name in SECRETS}
    env = load({**samples, "AGENT_KEY": key, "AGENT_REDIS_URL": own})
    read = AgentEnvironment.read(env["services"]["agent"]["environment"])
    assert read.key == bytes.fromhex(key)
    assert read.redis_url == own
    assert str(read.data_dir) == "/data" and read.artifact_url == "file:///data/artifacts"


# --------------------------------------------------------------------------- replicas

SCALED = {"web": 2, "worker": 2, "tick-worker": 2, "beat": 2}
"""Services that run as several containers by default (docs/scaling.md)."""


def host_ports(spec: str) -> tuple[int, int, int]:
    """``"8000-8009:8000"`` (or ``"8000:8000"``): first and last host port, container port."""
    match = re.fullmatch(r"(?:[\d.]+:)?(\d+)(?:-(\d+))?:(\d+)(?:/tcp)?", spec)
    assert match is not None, spec
    first, last, inner = match.groups()
    return int(first), int(last or first), int(inner)


def test_web_workers_and_beat_scale_with_replicas() -> None:
    services = load()["services"]
    for name, replicas in SCALED.items():
        assert services[name]["deploy"]["replicas"] == replicas, name
    # one-of-a-kind services stay single: a second migration or a second node-0 agent
    # (one key, one queue agent.node-0) would be wrong
    for name in ("migrate", "agent", "postgres", "redis"):
        assert services[name].get("deploy", {}).get("replicas", 1) == 1, name


def test_no_fixed_names_and_no_clashing_host_ports() -> None:
    """``--scale`` refuses a container_name, and N replicas need N host ports."""
    services = load()["services"]
    taken: dict[int, str] = {}
    for name, service in services.items():
        assert "container_name" not in service, name
        assert "hostname" not in service, name  # workers' node names (-n ...@%h) stay unique
        replicas = service.get("deploy", {}).get("replicas", 1)
        for spec in service.get("ports", []):
            first, last, _ = host_ports(str(spec))
            assert last - first + 1 >= max(replicas, 10 if name == "web" else 1), (name, spec)
            for port in range(first, last + 1):
                assert port not in taken, (name, port, taken.get(port))
                taken[port] = name
    assert set(taken.values()) <= {"web"}, taken  # only the ASGI servers are published


def test_every_worker_name_is_unique_per_container() -> None:
    """Celery refuses two workers of one node name: each carries its container's hostname."""
    for name, service in load()["services"].items():
        command = service.get("command", [])
        if "worker" in command and "celery" in command:
            node = command[command.index("-n") + 1]
            assert node.endswith("@%h"), (name, node)


def test_each_beat_keeps_its_schedule_out_of_the_shared_volume() -> None:
    """Two beats writing one shelve file on the shared volume would corrupt it."""
    services = load()["services"]
    beat = services["beat"]["command"]
    schedule = beat[beat.index("--schedule") + 1]
    shared = [volume.split(":")[1] for volume in services["beat"]["volumes"]]
    assert not any(schedule.startswith(mount) for mount in shared), (schedule, shared)
    assert schedule.startswith("/tmp/")


def test_scaling_is_documented_where_the_file_points() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "docs/scaling.md" in text and "--scale" in text
    doc = (ROOT / "docs" / "scaling.md").read_text()
    for needle in ("tick", "advisory lock", "channel layer", "load balancer", "PostgreSQL"):
        assert needle in doc, needle
