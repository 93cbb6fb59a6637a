"""Each session's lab on a host of its own: the ``LAB_HOST_TEMPLATE`` and what it names (pure).

A JupyterLab page runs script its user does not vet (a notebook's outputs, an
extension's). Served on the portal's origin, that script could call the portal's API
with the viewer's portal session; served on a host of its own, the browser's
same-origin rule keeps it to its own lab::

    LAB_HOST_TEMPLATE = "{id}.labs.example.com"     (locally: "lab-{id}.localhost")

    session 42's lab:  https://42.labs.example.com/sessions/42/lab/
    the portal:        https://portal.example.com/      (its cookie is host-only)

``{id}`` stands in the template's first label, so every lab has its own host (and its
own host-only cookie); the rest of the template is the labs' domain, which
``ALLOWED_HOSTS`` gains as ``.labs.example.com``. Pick a domain that is not a subdomain of
the portal's, ideally another registrable domain: cookies a lab's script sets for a
parent domain then reach neither the portal nor its CSRF cookie.
"""

from __future__ import annotations

import re
from typing import NamedTuple

FIELD = "{id}"
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_MAX_ID_DIGITS = 18


class LabHostError(ValueError):
    """A ``LAB_HOST_TEMPLATE`` that cannot name one host per session."""


def check_template(template: str) -> str:
    """``template`` lowered, or ``LabHostError`` saying what is wrong with it.

    It is a host name (no scheme, port or path) whose first label holds ``{id}`` once, with
    at least one more label after it: ``lab-{id}.localhost``, ``{id}.labs.example.com``.
    """
    text = template.strip().lower()
    if text.count(FIELD) != 1:
        raise LabHostError(f"LAB_HOST_TEMPLATE must hold {FIELD} exactly once: {template!r}")
    if any(c in text for c in ":/@?# "):
        raise LabHostError(
            f"LAB_HOST_TEMPLATE is a host name, without scheme, port or path: {template!r}"
        )
    first, _, domain = text.partition(".")
    if FIELD not in first or not domain:
        raise LabHostError(
            f"LAB_HOST_TEMPLATE needs {FIELD} in its first label and a domain after it "
            f"(lab-{{id}}.localhost, {{id}}.labs.example.com): {template!r}"
        )
    labels = [first.replace(FIELD, "1"), *domain.split(".")]
    if not all(_LABEL.match(label) for label in labels):
        raise LabHostError(f"LAB_HOST_TEMPLATE is not a valid host name: {template!r}")
    return text


def lab_domain(template: str) -> str:
    """The labs' domain as an ``ALLOWED_HOSTS`` entry: ``.labs.example.com``."""
    return "." + check_template(template).partition(".")[2]


def lab_host(template: str, job_id: int) -> str:
    """The host of session ``job_id``'s lab."""
    return check_template(template).replace(FIELD, str(int(job_id)))


def job_id_for_host(template: str, host: str) -> int | None:
    """The session whose lab ``host`` (a ``Host`` header, port allowed) names; None when it
    names none (the portal's own host, another name under the labs' domain)."""
    name = host.strip().lower()
    if name.startswith("["):
        return None  # an IPv6 address is never a lab
    name = name.rsplit(":", 1)[0] if ":" in name else name
    before, _, after = check_template(template).partition(FIELD)
    if len(name) <= len(before) + len(after):
        return None
    if not (name.startswith(before) and name.endswith(after)):
        return None
    digits = name[len(before) : len(name) - len(after)]
    if not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_ID_DIGITS:
        return None
    if digits.startswith("0"):
        return None  # one host per session: 042 is not 42's
    return int(digits)


LAB_PATH = re.compile(r"^/sessions/([0-9]{1,18})/lab/")
"""A lab's paths (its Jupyter's ``base_url``), on whichever host serves it."""


def lab_path_job(path: str) -> int | None:
    """The session whose lab ``path`` is under, or None."""
    found = LAB_PATH.match(path)
    return int(found[1]) if found else None


class Route(NamedTuple):
    """Where a request goes: ``portal`` (the portal's pages, or a lab on the portal's
    origin when no template is set), ``lab`` (session ``job_id``'s lab, on its own host),
    ``reopen`` (a lab path asked of the portal's host: open it through the portal) or
    ``not_found`` (anything else a lab host, or a stray name under the labs' domain, is
    asked)."""

    kind: str
    job_id: int | None = None


def route(template: str, host: str, path: str, *, portal_host: bool) -> Route:
    """Where a request for ``path`` on ``host`` goes under ``template`` (empty: every lab
    on the portal's origin); ``portal_host``: whether ``host`` is one of the portal's."""
    if not template:
        return Route("portal")
    path_job = lab_path_job(path)
    host_job = job_id_for_host(template, host)
    if host_job is not None:
        return Route("lab", host_job) if path_job == host_job else Route("not_found")
    if not portal_host:
        return Route("not_found")
    if path_job is not None:
        return Route("reopen", path_job)
    return Route("portal")
