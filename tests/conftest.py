"""Shared fixtures: tenants, users with roles, API clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from devtools.stack import free_port, stack_env, start_stack, stop_stack, wait_http
from devtools.stack import manage as run_manage
from portal.celery import app
from portal.cluster_timeline import forget as forget_timelines
from tenancy.models import Role, Tenant
from tenancy.services import do_add_member, do_create_tenant
from tenancy.token_services import do_issue_token


@pytest.fixture(scope="session", autouse=True)
def empty_agent_queues() -> None:
    """Agents' command queues start the run empty.

    The machine's Redis outlives test runs: commands an earlier run left on
    ``agent.<node>`` were signed long ago, and a test that reads them would
    fail on a stale signature rather than on what it tests.
    """
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match="agent.*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One real stack (``manage.py runstack``) for every end-to-end test that can share it.

    A boot costs half a minute; the REST API tests (tests/test_e2e.py) and the CLI's
    (tests/cli/test_cli_e2e.py) work on the same 8-slot cluster as tenant ``e2e`` (owner
    ``eve``, a quota of 8), and run one after the other at the end of the session
    (``pytest_collection_modifyitems``), so the stack runs only while they do.

    Yields ``url``, eve's ``token``, the stack's ``log`` (open for reading), its
    environment ``env`` and its ``data_dir`` (``PORTAL_DATA_DIR``).
    """
    data_dir = tmp_path_factory.mktemp("e2e")
    port = free_port()
    # No straggler marks a GPU suspect here: on two loaded cores a worker is slowed by the
    # machine, not its GPU, and a mark (600 s) took one of the 8 slots from the tests after
    # it (the torchrun program found 1 free slot, not 2, and waited until Tiresias demoted
    # a blocker). tests/test_e2e_straggler.py tests the marks on a stack of its own.
    # The operator's local wheel directory beside the index (PyPI): the environment test puts
    # a source package there whose build script tries to leave the sandbox.
    (data_dir / "links").mkdir()
    env, drop_db = stack_env(
        data_dir,
        redis_db=11,
        STRAGGLER_COOLDOWN_SECONDS="0",
        ENVIRONMENT_FIND_LINKS=str(data_dir / "links"),
        # Each session's lab on its own origin (Chromium resolves *.localhost to loopback).
        LAB_HOST_TEMPLATE="lab-{id}.localhost",
    )
    proc = start_stack(data_dir, port, env)
    log = (data_dir / "stack.log").open()
    try:
        wait_http(f"http://127.0.0.1:{port}/login/", timeout=120)

        def manage(*args: str) -> str:
            return run_manage(env, *args)

        # The tenant and eve's token in one Django start, not two.
        made = manage(
            "shell",
            "-c",
            "from django.core.management import call_command as c; "
            "c('createtenant', 'e2e', '--owner', 'eve', '--gpu-quota', '8', '--no-profile'); "
            "c('issuetoken', 'eve')",
        )
        yield {
            "url": f"http://127.0.0.1:{port}",
            "token": made.splitlines()[-1].strip(),
            "log": log,
            "env": env,
            "data_dir": data_dir,
            "manage": manage,
        }
    finally:
        log.close()
        stop_stack(proc, data_dir)
        drop_db()


def uses_shared_stack(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the session's ``stack`` (not a module's own fixture of that name)."""
    module = getattr(item, "module", None)
    return "stack" in getattr(item, "fixturenames", ()) and not hasattr(module, "stack")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared stack run last and together, each file in its usual order.

    The stack's agents, workers and 1 s ticks would otherwise keep both cores busy under
    the tests collected between its users (the fault suite, the browser tests).
    """
    items.sort(key=uses_shared_stack)  # stable: every other test keeps its place


@pytest.fixture(autouse=True)
def fresh_cluster_timeline() -> Iterator[None]:
    """Each test's cluster view replays its own events (a kept replay is per process)."""
    forget_timelines()
    yield
    forget_timelines()


@pytest.fixture
def make_tenant(db: None) -> Callable[..., Tenant]:
    """Create a tenant with an owner user named ``<slug>-owner``."""

    def make(slug: str, quota: int = 8) -> Tenant:
        return do_create_tenant(
            slug=slug, owner_username=f"{slug}-owner", password="pw-" + slug, gpu_quota=quota
        ).tenant

    return make


@pytest.fixture
def make_user(db: None) -> Callable[..., Any]:
    """Create a user, optionally a member of ``tenant`` with ``role``."""

    def make(
        username: str, tenant: Tenant | None = None, role: str = Role.MEMBER, staff: bool = False
    ) -> Any:
        user = get_user_model().objects.create_user(username, password="pw", is_staff=staff)
        if tenant is not None:
            do_add_member(tenant=tenant, user=user, role=role)
        return user

    return make


@pytest.fixture
def token_client() -> Callable[[Any], APIClient]:
    """An API client authenticated with the user's token (the real header path)."""

    def make(user: Any) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {do_issue_token(user=user)}")
        return client

    return make


@pytest.fixture
def acme(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant("acme", quota=8)


@pytest.fixture
def globex(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant("globex", quota=4)


@pytest.fixture
def alice(make_user: Callable[..., Any], acme: Tenant) -> Any:
    """A member of acme."""
    return make_user("alice", acme)


@pytest.fixture
def bob(make_user: Callable[..., Any], globex: Tenant) -> Any:
    """A member of globex."""
    return make_user("bob", globex)


def job_body(**overrides: Any) -> dict[str, Any]:
    """A valid submission body."""
    body: dict[str, Any] = {"name": "train", "workload": "mlp-digits", "gpus": 2}
    body.update(overrides)
    return body


def emptied_queue(name: str) -> Iterator[Any]:
    """The real broker's queue ``name``, emptied before and after (a fixture's body)."""
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(name)
        queue.clear()
        try:
            yield queue
        finally:
            queue.clear()
            queue.close()


@pytest.fixture
def whatif_queue() -> Iterator[Any]:
    """The real broker's ``whatif`` queue, emptied before and after."""
    yield from emptied_queue("whatif")
