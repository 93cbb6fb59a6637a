"""Management commands that automation relies on: createtenant and issuetoken."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from tenancy.models import ApiToken, Membership, Role, Tenant
from tenancy.tokens import hash_secret

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


def test_issuetoken_prints_a_new_working_token_on_one_line() -> None:
    get_user_model().objects.create_user("tom")
    first = run("issuetoken", "tom")
    assert first.count("\n") == 1
    key = first.strip()
    token = ApiToken.objects.get(user__username="tom")
    assert (token.name, token.scope, token.key_hash) == ("default", "write", hash_secret(key))
    second = run("issuetoken", "tom").strip()  # hashed: a new token, the first still works
    assert second != key
    assert ApiToken.objects.get(key_hash=hash_secret(second)).name == "default-2"
    for secret in (key, second):
        client = APIClient(HTTP_AUTHORIZATION=f"Token {secret}")
        assert client.get("/api/v1/me/").json()["username"] == "tom"
    with pytest.raises(CommandError, match="no user"):
        run("issuetoken", "nobody")


def test_issuetoken_name_expiry_and_scope() -> None:
    get_user_model().objects.create_user("tom")
    before = timezone.now()
    key = run("issuetoken", "tom", "--name", "ci", "--expires-in", "7", "--scope", "read").strip()
    token = ApiToken.objects.get(key_hash=hash_secret(key))
    assert (token.name, token.scope) == ("ci", "read")
    assert timedelta(days=7) <= token.expires_at - before < timedelta(days=7, minutes=1)
    with pytest.raises(CommandError, match="already have a token named 'ci'"):
        run("issuetoken", "tom", "--name", "ci")
    with pytest.raises(CommandError, match="at least 1 day"):
        run("issuetoken", "tom", "--name", "x", "--expires-in", "0")
    with pytest.raises(CommandError):
        run("issuetoken", "tom", "--scope", "admin")
    assert ApiToken.objects.count() == 1
