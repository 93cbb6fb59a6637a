"""An owner invites a member on the members page, changes their role and removes them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_an_owner_manages_members_on_the_page(browser: Any, server: Server, driver: Driver) -> None:
    # nora exists (she owns a tenant of her own) but is not in acme
    driver(
        "call",
        path="tenancy.services:do_create_tenant",
        kwargs={"slug": "newcomers", "owner_username": "nora", "password": "pw"},
    )
    alice = login(browser, server, "alice")  # acme's owner
    alice.click("#members-link")
    alice.wait_for_url(server.url + "/tenants/acme/members/")
    assert alice.locator("#members tr:has-text('nora')").count() == 0

    alice.fill("#id_identifier", "nora")
    alice.select_option("#id_role", "viewer")
    alice.click("#invite-form button[type=submit]")
    row = alice.locator("#members tbody tr:has-text('nora')")
    row.wait_for()
    assert row.get_attribute("data-role") == "viewer"
    assert "Added nora as viewer" in alice.inner_text(".messages")

    nora = login(browser, server, "nora")
    nora.goto("/tenants/acme/members/")
    assert "alice" in nora.inner_text("#members")
    assert nora.locator("#invite-form").count() == 0  # a viewer sees, cannot change

    row.locator("select[name=role]").select_option("member")
    row.locator("button[type=submit]").click()
    alice.wait_for_load_state()
    assert (
        alice.locator("#members tbody tr:has-text('nora')").get_attribute("data-role") == "member"
    )
    screenshot(alice, "tenant-members")

    # the last owner cannot step down: the page says why and nothing changes
    own = alice.locator("#members tbody tr:has-text('alice')")
    own.locator("select[name=role]").select_option("viewer")
    own.locator("button[type=submit]").click()
    alice.locator("#members-error").wait_for()
    assert "last owner" in alice.inner_text("#members-error")

    alice.goto("/tenants/acme/members/")
    alice.locator("#members tbody tr:has-text('nora') a.remove-link").click()
    alice.locator("#remove-form").wait_for()
    assert "Remove nora?" in alice.inner_text("h1")
    alice.click("#remove-form button[type=submit]")
    alice.wait_for_url(server.url + "/tenants/acme/members/")
    assert alice.locator("#members tr:has-text('nora')").count() == 0

    gone = nora.goto("/tenants/acme/members/")
    assert gone is not None and gone.status == 404
    alice.context.close()
    nora.context.close()


def test_an_admin_creates_a_tenant_and_sets_its_quota_on_the_pages(
    browser: Any, server: Server
) -> None:
    root = login(browser, server, "root")
    root.click("nav a:has-text('Tenants')")
    root.wait_for_url(server.url + "/tenants/")
    root.click("a:has-text('New tenant')")
    root.fill("#id_slug", "browser-made")
    root.fill("#id_owner", "bob")
    root.fill("#id_gpu_quota", "3")
    root.click("#tenant-form button[type=submit]")
    root.wait_for_url(server.url + "/tenants/")
    row = root.locator("tr[data-tenant='browser-made']")
    assert row.locator("[data-field=quota]").inner_text() == "0 / 3"
    assert row.locator("[data-field=members]").inner_text() == "1"

    row.locator("a:has-text('Settings')").click()
    root.fill("#id_gpu_quota", "6")
    root.fill("#id_default_max_restarts", "4")
    root.fill("#id_max_restarts_ceiling", "2")
    root.click("#tenant-form button[type=submit]")
    assert "must not exceed" in root.inner_text("#tenant-form .error")  # refused, shown
    root.fill("#id_max_restarts_ceiling", "")
    root.click("#tenant-form button[type=submit]")
    root.wait_for_url(server.url + "/tenants/")
    assert root.locator("tr[data-tenant='browser-made'] [data-field=quota]").inner_text() == "0 / 6"
    screenshot(root, "tenants-admin")
    root.context.close()
