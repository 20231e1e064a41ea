"""Who may use the page: the token, the Host and Origin checks and the security headers.

The model of Jupyter's server, tightened:

- A random token, printed once in the URL (``/?token=...``). Opening that URL sets it as
  an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over TLS) and redirects to the
  bare URL, so the token leaves the address bar and the history. Every other request,
  the page's assets included, needs the cookie: 403 otherwise.
- ``Host`` must name this server (an address it listens on, ``localhost``, or a name
  given with ``--allow-host``): a DNS-rebinding page, whose requests carry its own host
  name, is refused before anything else.
- Every request that changes something (any method but GET/HEAD) must carry an
  ``Origin`` equal to this server's own, and the ``X-Sluice-Csrf`` header with a value
  derived from the token that only the page, served to a holder of the cookie, knows.
  A cross-site form or fetch can do neither.
- Every answer carries a Content-Security-Policy without inline script (``script-src
  'self'``), ``nosniff``, no framing and no referrer.

A plain ASGI middleware, so nothing of the app is reachable around it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import parse_qs

COOKIE = "sluice_web"
CSRF_HEADER = "x-sluice-csrf"
# xterm.js measures and positions its cells with inline styles; scripts stay 'self' only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SAFE_METHODS = ("GET", "HEAD")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_value(token: str) -> str:
    """The value the page sends in :data:`CSRF_HEADER`: derived from the token, so it is
    only known to a page served to a holder of the cookie."""
    return hmac.new(token.encode(), b"sluice web csrf", hashlib.sha256).hexdigest()


class Guard:
    """ASGI middleware: see the module. ``hosts`` are the ``host[:port]`` values accepted in
    ``Host`` (lower case); ``origins`` the ``scheme://host[:port]`` values accepted in ``Origin``."""

    def __init__(self, app, *, token: str, hosts: set[str], origins: set[str], secure: bool) -> None:
        self.app = app
        self.token = token
        self.csrf = csrf_value(token)
        self.hosts = {h.lower() for h in hosts}
        self.origins = {o.lower() for o in origins}
        self.secure = secure

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope.get("method", "GET")
        if headers.get("host", "").lower() not in self.hosts:
            await _refuse(scope, receive, send, 403, "this server does not answer to that host name")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if scope["type"] == "http" and scope["path"] == "/" and "token" in query and method in SAFE_METHODS:
            if hmac.compare_digest(query["token"][0].encode(), self.token.encode()):
                await self._let_in(send)
            else:
                await _refuse(scope, receive, send, 403, "wrong token")
            return
        cookie = _cookies(headers.get("cookie", "")).get(COOKIE, "")
        if not hmac.compare_digest(cookie.encode(), self.token.encode()):
            await _refuse(scope, receive, send, 403,
                          "no token: open the URL `sluice web` printed (it ends in ?token=...)")
            return
        if scope["type"] == "websocket" or method not in SAFE_METHODS:
            if headers.get("origin", "").lower() not in self.origins:
                await _refuse(scope, receive, send, 403, "cross-origin request refused")
                return
            if scope["type"] == "http" and not hmac.compare_digest(
                    headers.get(CSRF_HEADER, "").encode(), self.csrf.encode()):
                await _refuse(scope, receive, send, 403, "missing or wrong request token")
                return
        await self.app(scope, receive, _with_headers(send))

    async def _let_in(self, send) -> None:
        cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if self.secure else "")
        await send({"type": "http.response.start", "status": 303, "headers": [
            (b"location", b"/"), (b"set-cookie", cookie.encode()), (b"content-length", b"0"),
            *_SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": b""})


_SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def _with_headers(send):
    async def sending(message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
        await send(message)

    return sending


async def _refuse(scope, receive, send, status: int, reason: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": reason})
        return
    body = (reason + "\n").encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        *_SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


def _cookies(header: str) -> dict[str, str]:
    found = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name and name not in found:
            found[name] = value
    return found
