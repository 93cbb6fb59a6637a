"""Single sign-on in a real browser: the login page's button, the provider, the mapped role.

    Chromium ──> portal (daphne, OIDC_* set) ──302──> provider (loopback thread)
        <── sign-in form; the user signs in there ──302──> portal /oidc/callback/
    portal ──HTTP──> provider: token (code + PKCE verifier), JWKS, userinfo

The portal of this module is its own (the session's portal has SSO off): started
with ``OIDC_*`` pointing at ``tests.tenancy.oidc_provider``, and seeded as the
harness seeds (tenants acme and globex).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.browser import start_portal
from tests.browser.conftest import Server, screenshot, watch_csp
from tests.tenancy.oidc_provider import Provider

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

ROLE_MAP = "ml-team:acme:member,auditors:acme:viewer"


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    served = Provider().start()
    served.add_user("carol", "pw", groups=["ml-team"], email="carol@example.org")
    served.add_user("dave", "pw", groups=["auditors"])
    served.add_user("erin", "pw", groups=["strangers"])
    yield served
    served.stop()


@pytest.fixture(scope="module")
def sso_server(
    browser: Any, provider: Provider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A portal with single sign-on on, against ``provider`` (after ``browser``: none without it)."""
    env = {
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": provider.client_id,
        "OIDC_CLIENT_SECRET": provider.client_secret,
        "OIDC_ROLE_MAP": ROLE_MAP,
    }
    data_dir: Path = tmp_path_factory.mktemp("sso-portal")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        server, driver, _ = start_portal(data_dir)
    try:
        yield server
    finally:
        driver.close()
        server.stop()


def sso_sign_in(browser: Any, server: Server, provider: Provider, username: str) -> Any:
    """Click "Sign in with SSO", sign in at the provider; returns the page back at the portal."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=server.url)
    context.set_default_timeout(15_000)
    watch_csp(context)
    page = context.new_page()
    page.goto("/login/")
    page.click("text=Sign in with SSO")
    page.wait_for_url(re.compile(re.escape(provider.issuer) + r"/authorize\?"))
    page.fill("#username", username)
    page.fill("#password", "pw")
    page.click("#provider-sign-in")
    page.wait_for_url(server.url + "/")
    return page


def test_a_member_signs_in_through_the_provider_and_can_submit(
    browser: Any, sso_server: Server, provider: Provider
) -> None:
    carol = sso_sign_in(browser, sso_server, provider, "carol")
    assert carol.locator("#live-dashboard h1").inner_text().startswith("Acme ML")
    screenshot(carol, "sso-dashboard")
    carol.goto("/jobs/new/")
    carol.fill("#id_name", "from-sso")
    carol.select_option("#id_workload", "mlp-digits")
    carol.fill("#id_gpus", "1")
    carol.fill("#id_min_gpus", "1")
    carol.fill("#id_max_gpus", "1")
    carol.click("#job-form button[type=submit]")
    carol.wait_for_url(re.compile(r"/jobs/\d+/$"))
    assert "from-sso" in carol.locator("h1").inner_text()
    carol.context.close()


def test_a_viewer_lands_on_the_tenant_but_cannot_submit(
    browser: Any, sso_server: Server, provider: Provider
) -> None:
    dave = sso_sign_in(browser, sso_server, provider, "dave")
    assert dave.locator("#live-dashboard h1").inner_text().startswith("Acme ML")
    dave.goto("/jobs/new/")
    assert dave.locator("#job-form").count() == 0
    assert "You cannot submit jobs" in dave.locator("main").inner_text()
    dave.context.close()


def test_unmapped_groups_sign_in_with_no_tenant(
    browser: Any, sso_server: Server, provider: Provider
) -> None:
    erin = sso_sign_in(browser, sso_server, provider, "erin")
    assert erin.locator("h1").first.inner_text() == "No tenant yet"
    erin.context.close()


def test_the_login_page_keeps_password_sign_in_beside_sso(browser: Any, sso_server: Server) -> None:
    context = browser.new_context(base_url=sso_server.url)
    watch_csp(context)
    page = context.new_page()
    page.goto("/login/")
    screenshot(page, "login-sso")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.wait_for_url(sso_server.url + "/")
    assert page.locator("#live-dashboard h1").inner_text().startswith("Acme ML")
    context.close()
