"""Management commands that automation relies on: createtenant and issuetoken."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

from tenancy.models import Membership, Role, Tenant

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_createtenant_creates_owner_and_tenant() -> None:
    output = run(
        "createtenant",
        "vision",
        "--owner",
        "vera",
        "--password",
        "s3cret-pass",
        "--gpu-quota",
        "16",
    )
    assert "created tenant vision" in output
    tenant = Tenant.objects.get(slug="vision")
    assert tenant.gpu_quota == 16
    assert Membership.objects.get(tenant=tenant).role == Role.OWNER
    assert authenticate(username="vera", password="s3cret-pass") is not None


def test_createtenant_reuses_existing_user_and_refuses_bad_input() -> None:
    get_user_model().objects.create_user("olga", password="x")
    assert "existing user" in run("createtenant", "nlp", "--owner", "olga")
    with pytest.raises(CommandError, match="already exists"):
        run("createtenant", "nlp", "--owner", "olga")
    with pytest.raises(CommandError, match="invalid tenant slug"):
        run("createtenant", "Not A Slug", "--owner", "olga")
    with pytest.raises(CommandError, match="quota"):
        run("createtenant", "neg", "--owner", "olga", "--gpu-quota", "-1")
    assert Tenant.objects.count() == 1


def test_issuetoken_prints_a_stable_token_on_one_line() -> None:
    get_user_model().objects.create_user("tom")
    first = run("issuetoken", "tom")
    assert first.count("\n") == 1
    key = first.strip()
    assert Token.objects.get(user__username="tom").key == key
    assert run("issuetoken", "tom").strip() == key
    with pytest.raises(CommandError, match="no user"):
        run("issuetoken", "nobody")
