"""The navigation's links reach the pages, not the API routes that share a resource's name."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_navigation_links_the_sweeps_and_sessions_pages(alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert 'href="/sweeps/"' in page
    assert 'href="/sessions/"' in page
    assert "/api/v1/sweeps/" not in page
