"""Django's mail settings from ``EMAIL_URL`` or the usual ``EMAIL_HOST``/``EMAIL_PORT``/... variables."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class MailSettings:
    """Where and how Django's SMTP backend sends mail."""

    host: str
    port: int
    user: str
    password: str
    use_tls: bool
    use_ssl: bool


def mail_settings(
    *, url: str, host: str, port: int, user: str, password: str, use_tls: bool, use_ssl: bool
) -> MailSettings:
    """``url`` (``smtp://user:pw@host:587?tls=1`` or ``smtps://...``) when set, else the rest.

    A URL with a scheme other than smtp/smtps, or both TLS and SSL on, is refused at start.
    """
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps"):
            raise ValueError(f"EMAIL_URL must start with smtp:// or smtps://, not {url!r}")
        query = parse_qs(parts.query)
        use_ssl = parts.scheme == "smtps" or query.get("ssl", ["0"])[0].lower() in TRUE_WORDS
        use_tls = query.get("tls", ["0"])[0].lower() in TRUE_WORDS
        host = parts.hostname or "localhost"
        port = parts.port or (465 if use_ssl else 25)
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if use_tls and use_ssl:
        raise ValueError("EMAIL_USE_TLS and EMAIL_USE_SSL (smtps) exclude each other")
    return MailSettings(host, port, user, password, use_tls, use_ssl)
