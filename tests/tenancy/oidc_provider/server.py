"""A small OpenID Connect provider for tests: real HTTP on loopback, RS256 ID tokens.

    test ──add_user(claims)──> Provider (thread: ThreadingHTTPServer on 127.0.0.1:<port>)
      GET  /.well-known/openid-configuration   discovery
      GET  /jwks                               its public RSA key
      GET  /authorize                          a sign-in form (username, password)
      POST /authorize                          checks them; 302 redirect_uri?code&state
      POST /token                              client secret (Basic), code once, redirect_uri,
                                               PKCE S256; access token + signed ID token
      GET  /userinfo                           Bearer access token; the user's claims

The authorization-code flow of OpenID Connect Core 1.0 section 3.1, strictly
enough that a client which cuts a corner (no PKCE verifier, a wrong
redirect_uri, a reused code) is refused here.  Tokens are signed with
``joserfc``; the HTTP side is the standard library's.

For the hostile cases a test sets ``id_token_overrides`` (claims that replace the
honest ones, e.g. a wrong ``nonce`` or ``aud``) or ``sign_with`` (a key that is not
in the JWKS, under the JWKS key's id).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import RSAKey

KEY_ID = "test-key-1"


@dataclass(frozen=True)
class ProviderUser:
    """An account at the provider: its password and the claims it asserts."""

    password: str
    claims: dict[str, Any]


@dataclass(frozen=True)
class _Code:
    client_id: str
    redirect_uri: str
    username: str
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None


@dataclass
class Provider:
    """The provider; ``start()`` serves it, ``issuer`` is its URL."""

    client_id: str = "portal"
    client_secret: str = "portal-secret"
    users: dict[str, ProviderUser] = field(default_factory=dict)
    id_token_overrides: dict[str, Any] = field(default_factory=dict)
    sign_with: RSAKey | None = None
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": KEY_ID, "use": "sig"})
        self._codes: dict[str, _Code] = {}
        self._access: dict[str, str] = {}
        self._lock = threading.Lock()
        self._http: ThreadingHTTPServer | None = None
        self.issuer = ""

    # --- the test's side
    def add_user(self, username: str, password: str, **claims: Any) -> str:
        """Register an account; returns its subject (``sub``), stable per username."""
        subject = f"sub-{username}"
        self.users[username] = ProviderUser(
            password=password,
            claims={"sub": subject, "preferred_username": username, **claims},
        )
        return subject

    def start(self) -> Provider:
        """Serve on a free loopback port in a daemon thread."""
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.issuer = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def metadata(self) -> dict[str, Any]:
        """The discovery document."""
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "profile", "email", "groups"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            "code_challenge_methods_supported": ["S256"],
        }

    # --- the protocol
    def issue_code(self, params: dict[str, str], username: str) -> str:
        """A one-time authorization code for ``username`` and the authorize request."""
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = _Code(
                client_id=params["client_id"],
                redirect_uri=params["redirect_uri"],
                username=username,
                nonce=params.get("nonce"),
                code_challenge=params.get("code_challenge"),
                code_challenge_method=params.get("code_challenge_method"),
            )
        return code

    def exchange(self, form: dict[str, str], basic: tuple[str, str] | None) -> dict[str, Any]:
        """The token response for a code, or ``{"error": ...}``."""
        self.token_requests.append(dict(form))
        if basic != (self.client_id, self.client_secret):
            return {"error": "invalid_client"}
        with self._lock:
            grant = self._codes.pop(form.get("code", ""), None)  # a code works once
        if grant is None or form.get("grant_type") != "authorization_code":
            return {"error": "invalid_grant"}
        if grant.client_id != self.client_id or form.get("redirect_uri") != grant.redirect_uri:
            return {"error": "invalid_grant"}
        if grant.code_challenge is not None:
            verifier = form.get("code_verifier", "")
            digest = hashlib.sha256(verifier.encode()).digest()
            expected = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if grant.code_challenge_method != "S256" or expected != grant.code_challenge:
                return {"error": "invalid_grant", "error_description": "PKCE check failed"}
        user = self.users[grant.username]
        access = secrets.token_urlsafe(24)
        with self._lock:
            self._access[access] = grant.username
        now = int(time.time())
        claims = {
            **user.claims,
            "iss": self.issuer,
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
            "auth_time": now,
        }
        if grant.nonce is not None:
            claims["nonce"] = grant.nonce
        claims.update(self.id_token_overrides)
        header = {"alg": "RS256", "kid": KEY_ID}
        id_token = jwt.encode(header, claims, self.sign_with or self.key)
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": 300,
            "id_token": id_token,
            "scope": "openid profile email groups",
        }

    def userinfo(self, access_token: str) -> dict[str, Any] | None:
        """The claims of the access token's user, None for an unknown token."""
        with self._lock:
            username = self._access.get(access_token)
        return None if username is None else dict(self.users[username].claims)


def _form_page(params: dict[str, str], error: str = "") -> bytes:
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
        for k, v in params.items()
    )
    note = f'<p id="error">{html.escape(error)}</p>' if error else ""
    return (
        "<!doctype html><html><head><title>Test provider</title></head><body>"
        f"<h1>Test provider sign-in</h1>{note}"
        f'<form method="post" action="/authorize">{hidden}'
        '<label>User <input id="username" name="username"></label>'
        '<label>Password <input id="password" name="password" type="password"></label>'
        '<button id="provider-sign-in" type="submit">Sign in</button></form></body></html>'
    ).encode()


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes, kind: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode(), "application/json")

        def _form(self) -> dict[str, str]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/.well-known/openid-configuration":
                self._json(200, provider.metadata())
            elif url.path == "/jwks":
                self._json(200, {"keys": [provider.key.as_dict(private=False)]})
            elif url.path == "/authorize":
                if (
                    query.get("client_id") != provider.client_id
                    or "openid" not in query.get("scope", "").split()
                ):
                    self._send(400, b"unknown client or no openid scope", "text/plain")
                    return
                self._send(200, _form_page(query), "text/html; charset=utf-8")
            elif url.path == "/userinfo":
                auth = self.headers.get("Authorization", "")
                claims = provider.userinfo(auth.removeprefix("Bearer ").strip())
                if claims is None or not auth.startswith("Bearer "):
                    self._json(401, {"error": "invalid_token"})
                else:
                    self._json(200, claims)
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            form = self._form()
            if self.path == "/authorize":
                username, password = form.pop("username", ""), form.pop("password", "")
                user = provider.users.get(username)
                if user is None or not secrets.compare_digest(user.password, password):
                    self._send(401, _form_page(form, "Wrong user or password"), "text/html")
                    return
                code = provider.issue_code(form, username)
                target = form["redirect_uri"]
                joiner = "&" if "?" in target else "?"
                answer = urlencode({"code": code, "state": form.get("state", "")})
                self._send(302, b"", "text/plain", Location=f"{target}{joiner}{answer}")
            elif self.path == "/token":
                basic = None
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    user, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                    basic = (unquote(user), unquote(secret))
                answer = provider.exchange(form, basic)
                self._json(400 if "error" in answer else 200, answer)
            else:
                self._send(404, b"not found", "text/plain")

    return Handler
