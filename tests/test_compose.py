"""docker-compose.yml cannot run here, so we read it: services, wiring, real entry points."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import yaml
from django.core.management import get_commands

from tests.architecture.imports import LAYERS

ROOT = Path(__file__).resolve().parent.parent


def load() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_present_and_wired() -> None:
    compose = load()
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= set(services)
    for name in ("web", "worker", "beat", "agent", "migrate"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["DJANGO_SETTINGS_MODULE"] == "portal.settings.prod"
        assert set(services[name]["depends_on"]) == {"postgres", "redis"}
    pg = services["postgres"]["environment"]
    url = f"postgres://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    assert services["web"]["environment"]["DATABASE_URL"] == url
    assert "8000:8000" in services["web"]["ports"]


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
