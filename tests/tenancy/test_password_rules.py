"""``createtenant`` applies Django's four standard password validators."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def createtenant(*args: str) -> str:
    out = StringIO()
    call_command("createtenant", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("short1", "too short"),
        ("password123", "too common"),
        ("83920571946", "entirely numeric"),
        ("vera-lindqvist", "too similar to the username"),
    ],
)
def test_weak_owner_password_is_refused_and_nothing_is_made(password: str, why: str) -> None:
    with pytest.raises(CommandError, match=why):
        createtenant("vision", "--owner", "vera-lindqvist", "--password", password)
    assert not Tenant.objects.exists()
    assert not get_user_model().objects.filter(username="vera-lindqvist").exists()


def test_existing_users_attributes_are_compared_too() -> None:
    get_user_model().objects.create_user("olga", email="olga.petrova@example.com")
    with pytest.raises(CommandError, match="too similar to the email address"):
        createtenant("nlp", "--owner", "olga", "--password", "olga.petrova")
    assert not Tenant.objects.exists()


def test_strong_password_is_accepted() -> None:
    createtenant("vision", "--owner", "vera", "--password", "tangerine-orbit-42")
    assert authenticate(username="vera", password="tangerine-orbit-42") is not None


def test_no_password_still_makes_an_owner_who_cannot_sign_in() -> None:
    createtenant("vision", "--owner", "vera")
    assert not get_user_model().objects.get(username="vera").has_usable_password()
