"""The demo accounts of ``make run``: random passwords shown once, none on a real database."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model

from portal.demo import DEMO_ADMIN, ensure_demo_data
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def test_each_demo_account_gets_a_random_password_shown_only_when_created() -> None:
    first = ensure_demo_data(external_database=False)
    admin, tenant = first.accounts
    assert admin.username == DEMO_ADMIN and tenant.username == "demo"
    assert admin.password and tenant.password and admin.password != tenant.password
    assert admin.password != "admin" and tenant.password != "demo"
    assert len(admin.password) >= 16
    assert authenticate(username="admin", password="admin") is None
    assert authenticate(username="demo", password="demo") is None
    user = authenticate(username="admin", password=admin.password)
    assert user is not None and user.is_superuser
    assert authenticate(username="demo", password=tenant.password) is not None
    banner = first.describe()
    assert admin.password in banner and tenant.password in banner

    again = ensure_demo_data(external_database=False)  # every later start of runstack
    assert [a.password for a in again.accounts] == [None, None]
    assert admin.password not in again.describe() and tenant.password not in again.describe()
    assert authenticate(username="admin", password=admin.password) is not None  # unchanged


def test_another_start_makes_other_passwords() -> None:
    first = ensure_demo_data(external_database=False)
    get_user_model().objects.all().delete()
    Tenant.objects.all().delete()
    second = ensure_demo_data(external_database=False)
    assert {a.password for a in first.accounts}.isdisjoint(a.password for a in second.accounts)


def test_no_demo_accounts_on_an_external_database() -> None:
    result = ensure_demo_data(external_database=True)
    assert result.accounts == () and result.skipped
    assert not get_user_model().objects.exists() and not Tenant.objects.exists()
    assert "no demo users" in result.describe()
