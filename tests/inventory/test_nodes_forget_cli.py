"""``portalctl``'s side of forgetting a pending server: the path ``portalctl.nodes`` names,
posted by the real client to the real portal (Django's live server), and the node
cell of ``nodes --pending`` saying that a server came back after being forgotten."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from inventory.models import PendingServer
from portalctl.cli import main
from portalctl.client import Client, PortalError
from portalctl.nodes import forget_path
from tenancy.token_services import do_issue_token
from tests.inventory.test_registration import beat, empty_fabric
from workers.tests.fake_nvml import FakeNvml, fake_gpus

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_client_forgets_by_the_path_and_the_pending_list_says_it_came_back(
    live_server: Any, make_user: Callable[..., Any], tmp_path: Any
) -> None:
    empty_fabric()
    nvml = FakeNvml(fake_gpus("loner", 2))
    beat("loner", nvml)
    pending = PendingServer.objects.get()
    token = do_issue_token(user=make_user("root", staff=True))
    with Client(live_server.url, token) as client:
        assert client.request("POST", forget_path(pending.pk)).status_code == 204
        with pytest.raises(PortalError) as missing:
            client.request("POST", forget_path(pending.pk))  # forgotten and silent: gone
        assert missing.value.status == 404
        assert client.json("GET", "/api/v1/servers/pending/") == []
    beat("loner", nvml)
    env = {"PORTAL_URL": live_server.url, "PORTAL_TOKEN": token, "XDG_CONFIG_HOME": str(tmp_path)}
    shown = CliRunner().invoke(main, ["nodes", "--pending"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "loner" in shown.output and "(forgotten)" in shown.output  # the cell may wrap
    as_json = CliRunner().invoke(main, ["nodes", "--pending", "-o", "json"], env=env)
    assert "forgotten by root" in as_json.output
    again = PendingServer.objects.get()
    forgot = CliRunner().invoke(main, ["nodes", "--forget", str(again.pk)], env=env)
    assert forgot.exit_code == 0, forgot.output
    assert f"pending server {again.pk} forgotten" in forgot.output
    missing_cli = CliRunner().invoke(main, ["nodes", "--forget", str(again.pk)], env=env)
    assert missing_cli.exit_code == 4 and "Not found" in missing_cli.output  # 404: exit 4
    assert (
        CliRunner().invoke(main, ["nodes", "--pending", "-o", "json"], env=env).output.strip()
        == "[]"
    )


@pytest.mark.parametrize("bad", [0, -3, True, "7"])
def test_a_bad_id_is_refused_before_any_request(bad: Any) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        forget_path(bad)
