"""The API token page: list, create (secret shown once), revoke; only the user's own tokens."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tenancy.models import ApiToken
from tenancy.token_services import do_create_token
from tenancy.tokens import hash_secret

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_create_shows_the_secret_once_then_lists_it(alice: Any) -> None:
    client = logged_in(alice)
    empty = client.get("/account/token/")
    assert empty.status_code == 200 and b"No tokens yet." in empty.content
    form = {"name": "ci", "scope": "read", "expires_in_days": "7"}
    page = client.post("/account/token/", form).content.decode()
    token = ApiToken.objects.get(user=alice)
    secret = page.split('<code id="token">')[1].split("</code>")[0]
    assert hash_secret(secret) == token.key_hash
    lifetime = token.expires_at - token.created_at
    assert (token.name, token.scope, lifetime.days) == ("ci", "read", 7)
    assert APIClient(HTTP_AUTHORIZATION=f"Token {secret}").get("/api/v1/me/").status_code == 200

    listed = client.get("/account/token/").content.decode()
    assert secret not in listed
    assert "ci" in listed and f"{token.prefix}…" in listed and "read" in listed
    assert token.expires_at.strftime("%Y-%m-%d") in listed


def test_a_taken_name_and_bad_fields_are_form_errors(alice: Any) -> None:
    do_create_token(user=alice, name="ci")
    client = logged_in(alice)
    taken = client.post("/account/token/", {"name": "ci", "scope": "write", "expires_in_days": "9"})
    assert taken.status_code == 400 and b"you already have a token named" in taken.content
    bad = client.post("/account/token/", {"name": "x", "scope": "root", "expires_in_days": "0"})
    assert bad.status_code == 400 and b'data-for="scope"' in bad.content
    assert b'data-for="expires_in_days"' in bad.content
    assert ApiToken.objects.count() == 1


def test_revoke_own_but_not_anothers(alice: Any, bob: Any) -> None:
    mine = do_create_token(user=alice, name="ci").token
    theirs = do_create_token(user=bob, name="bobs").token
    client = logged_in(alice)
    assert b"bobs" not in client.get("/account/token/").content
    assert client.post(f"/account/token/{theirs.pk}/revoke/").status_code == 404
    response = client.post(f"/account/token/{mine.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == "/account/token/"
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None and theirs.revoked_at is None
    assert b"revoked" in client.get("/account/token/").content
    assert Client().get("/account/token/").status_code == 302  # to the login page
