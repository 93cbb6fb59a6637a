"""The migration to hashed tokens: an old authtoken key keeps working, and is no longer stored."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from tenancy.models import ApiToken
from tenancy.tokens import hash_secret

BEFORE = [("tenancy", "0003_api_tokens"), ("authtoken", "0004_alter_tokenproxy_options")]
OLD_KEY = "0123456789abcdef0123456789abcdef01234567"


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


@pytest.mark.django_db(transaction=True)
def test_an_authtoken_becomes_a_hashed_write_token_named_default() -> None:
    executor = _migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    user = old.get_model("auth", "User").objects.create(username="legacy")
    old.get_model("authtoken", "Token").objects.create(key=OLD_KEY, user=user)

    executor = _migrate(executor.loader.graph.leaf_nodes())
    new = executor.loader.project_state(executor.loader.graph.leaf_nodes()).apps
    assert not new.get_model("authtoken", "Token").objects.exists()  # no clear-text key left
    token = ApiToken.objects.get(user_id=user.pk)
    assert (token.name, token.scope, token.prefix) == ("default", "write", OLD_KEY[:8])
    assert token.key_hash == hash_secret(OLD_KEY) and token.expires_at > token.created_at
    response = APIClient(HTTP_AUTHORIZATION=f"Token {OLD_KEY}").get("/api/v1/me/")
    assert response.status_code == 200 and response.json()["username"] == "legacy"
