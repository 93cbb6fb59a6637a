"""The refusals every settings module applies: no public secret, no debug pages in public.

A process that would serve with a key anyone can read (the old built-in default) or
show Django's debug pages, with settings and tracebacks, to hosts beyond this machine
does not start; it says which variable to set instead.

    DEBUG off, SECRET_KEY unset   -> refuse (set SECRET_KEY, or DEBUG=1 on a laptop)
    DEBUG on,  SECRET_KEY unset   -> a random key made once in the data directory (0600)
    DEBUG on,  a public host      -> refuse (ALLOWED_HOSTS must be loopback only)
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

# Names that only ever reach this machine; ``testserver`` is Django's test client.
LOOPBACK_NAMES = frozenset({"localhost", "testserver"})


def is_loopback_host(host: str) -> bool:
    """Whether an ``ALLOWED_HOSTS`` entry can only match requests addressed to this machine."""
    name = host.strip().lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):  # RFC 6761: loopback names
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False  # a DNS name, a wildcard ('*', '.example.org'): public


def check_debug_hosts(*, debug: bool, allowed_hosts: Sequence[str]) -> None:
    """Refuse DEBUG when any allowed host reaches beyond this machine."""
    if not debug:
        return
    public = [host for host in allowed_hosts if not is_loopback_host(host)]
    if public:
        raise ImproperlyConfigured(
            f"DEBUG is on and ALLOWED_HOSTS admits {', '.join(public)}: debug pages show "
            "settings and tracebacks to anyone who reaches them. Set DEBUG=0 (and SECRET_KEY) "
            "to serve beyond this machine, or keep ALLOWED_HOSTS to loopback addresses."
        )


def secret_key(*, configured: str, debug: bool, key_file: Path) -> str:
    """The key to sign sessions with: the configured one, else a local one under DEBUG.

    The local key is random, made once and kept in ``key_file`` (readable by this user
    only), so sessions survive a restart of ``make run`` and no key is public.
    """
    if configured:
        return configured
    if not debug:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set SECRET_KEY (a long random string) to run the portal; "
            "on a laptop, beside `make run`, set DJANGO_SETTINGS_MODULE=portal.settings.dev."
        )
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        pass
    # Written aside, then linked into place: a reader never sees a half-written key.
    draft = key_file.with_name(f"{key_file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(50))
    try:
        os.link(draft, key_file)
    except FileExistsError:  # another process of the stack made it first: use theirs
        pass
    finally:
        draft.unlink()
    return key_file.read_text().strip()
