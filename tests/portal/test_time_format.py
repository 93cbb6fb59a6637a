"""One way to write time (issue 19, item 8): the template filters of ``portal_time``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from portal.templatetags.portal_time import ago, duration, when

MOMENT = datetime(2026, 12, 1, 13, 48, 42, tzinfo=UTC)


def test_when_writes_24_hour_time_with_the_zone() -> None:
    assert when(MOMENT) == "2026-12-01 13:48:42 UTC"
    assert when(MOMENT.isoformat()) == "2026-12-01 13:48:42 UTC"
    assert when(datetime(2026, 12, 1, 23, 5, 0, tzinfo=UTC)) == "2026-12-01 23:05:00 UTC"


@pytest.mark.parametrize("bad", [None, "", "yesterday", 17, object()])
def test_when_says_nothing_for_no_time(bad: object) -> None:
    assert when(bad) == "—"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (44.6, "45 s"),
        (119, "119 s"),
        (150, "3 min"),
        (720, "12 min"),
        (5520, "1 h 32 min"),
        (7200, "2 h"),
        (3 * 86400 + 3 * 3600, "3 d 3 h"),
        (None, "—"),
        ("soon", "—"),
        (True, "—"),
        (float("inf"), "—"),
    ],
)
def test_duration_in_words(seconds: object, words: str) -> None:
    assert duration(seconds) == words


def test_ago_both_ways() -> None:
    assert ago(MOMENT, MOMENT + timedelta(seconds=5)) == "just now"
    assert ago(MOMENT, MOMENT + timedelta(minutes=3)) == "3 min ago"
    assert ago(MOMENT, MOMENT - timedelta(minutes=65)) == "in 1 h 5 min"
    assert ago(None) == "—"


def test_filters_load_in_a_template() -> None:
    page = Template("{% load portal_time %}{{ t|when }} · {{ s|duration }}").render(
        Context({"t": MOMENT, "s": 5520})
    )
    assert page == "2026-12-01 13:48:42 UTC · 1 h 32 min"
