"""``{% shell_terminal job as offer %}``: what the job page's terminal offers its viewer."""

from __future__ import annotations

from typing import Any

from django import template

from jobs.models import Job
from shells.queries import TerminalOffer, terminal_offer

register = template.Library()


@register.simple_tag(takes_context=True)
def shell_terminal(context: dict[str, Any], job: Job) -> TerminalOffer:
    """The terminal the page's user may open on ``job`` (``shells.queries.terminal_offer``)."""
    return terminal_offer(user=context["user"], job=job)
