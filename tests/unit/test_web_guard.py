"""The guard of ``sluice web`` (broker/web/guard.py) on an app of its own, in process: who
gets in, what they must send, and the headers every answer carries. The same checks
against the real server and a real browser are in tests/integration/test_web.py."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from broker.web.guard import COOKIE, CSRF_HEADER, Guard, csrf_value, new_token
from broker.web.serve import hosts_and_origins

TOKEN = new_token()
BASE = "http://127.0.0.1:8642"


def inner_app() -> Starlette:
    async def hello(request):
        return PlainTextResponse(f"{request.method} ok")

    return Starlette(routes=[Route("/", hello), Route("/api/x", hello, methods=["GET", "POST"])])


def make_client(**kw) -> TestClient:
    inner = inner_app()
    hosts, origins = hosts_and_origins("127.0.0.1", 8642, "http", kw.pop("extra", []))
    guarded = Guard(inner, token=TOKEN, hosts=hosts, origins=origins, secure=kw.pop("secure", False))
    return TestClient(guarded, base_url=BASE, follow_redirects=False)


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def let_in(client: TestClient) -> None:
    client.cookies.set(COOKIE, TOKEN)


def test_without_the_guard_every_request_gets_in() -> None:
    """What the checks below refuse is answered by the app itself: they cannot pass vacuously."""
    with TestClient(inner_app(), base_url=BASE) as bare:
        assert bare.get("/", headers={"host": "rebound.example:8642"}).text == "GET ok"
        assert bare.post("/api/x", headers={"origin": "http://evil.example"}).text == "POST ok"


def test_nothing_without_the_token(client) -> None:
    for path in ("/", "/api/x", "/static/app.js"):
        answer = client.get(path)
        assert answer.status_code == 403 and "?token=" in answer.text
    assert client.get("/?token=" + "A" * len(TOKEN)).status_code == 403
    client.cookies.set(COOKIE, "A" * len(TOKEN))
    assert client.get("/api/x").status_code == 403


def test_the_token_in_the_url_becomes_a_strict_httponly_cookie(client) -> None:
    answer = client.get("/?token=" + TOKEN)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    assert answer.headers["set-cookie"] == f"{COOKIE}={TOKEN}; Path=/; HttpOnly; SameSite=Strict"
    assert client.get("/").text == "GET ok"  # the cookie, kept by the client, lets in
    with make_client(secure=True) as tls:
        assert tls.get("/?token=" + TOKEN).headers["set-cookie"].endswith("; Secure")


def test_a_foreign_host_is_refused_even_with_the_token(client) -> None:
    let_in(client)
    assert client.get("/", headers={"host": "127.0.0.1:8642"}).status_code == 200
    assert client.get("/", headers={"host": "localhost:8642"}).status_code == 200
    for host in ("rebound.example:8642", "127.0.0.1:9999", "127.0.0.1", ""):
        assert client.get("/", headers={"host": host}).status_code == 403, host
        assert client.get("/?token=" + TOKEN, headers={"host": host}).status_code == 403, host
    with make_client(extra=["sluice.example.org"]) as proxied:
        let_in(proxied)
        assert proxied.get("/", headers={"host": "sluice.example.org"}).status_code == 200


def test_a_state_change_needs_the_origin_and_the_request_token(client) -> None:
    let_in(client)
    good = {"origin": BASE, CSRF_HEADER: csrf_value(TOKEN)}
    assert client.post("/api/x", headers=good).text == "POST ok"
    assert client.post("/api/x", headers={**good, "origin": "http://evil.example"}).status_code == 403
    assert client.post("/api/x", headers={**good, "origin": "null"}).status_code == 403
    assert client.post("/api/x", headers={CSRF_HEADER: csrf_value(TOKEN)}).status_code == 403
    assert client.post("/api/x", headers={**good, CSRF_HEADER: csrf_value(new_token())}).status_code == 403
    assert client.post("/api/x", headers={"origin": BASE}).status_code == 403
    # GET reads; the token in the URL lets in only on GET.
    assert client.get("/api/x").text == "GET ok"
    client.cookies.clear()
    assert client.post("/?token=" + TOKEN, headers=good).status_code == 403


def test_every_answer_carries_the_security_headers(client) -> None:
    for answer in (client.get("/"), client.get("/?token=" + TOKEN), client.get("/")):
        csp = answer.headers["content-security-policy"]
        script = next(part for part in csp.split(";") if part.strip().startswith("script-src"))
        assert script.strip() == "script-src 'self'"
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"


def test_hosts_and_origins() -> None:
    hosts, origins = hosts_and_origins("127.0.0.1", 8642, "http", [])
    assert hosts == {"127.0.0.1:8642", "localhost:8642", "[::1]:8642"}
    assert origins == {"http://127.0.0.1:8642", "http://localhost:8642", "http://[::1]:8642"}
    hosts, origins = hosts_and_origins("192.0.2.7", 443, "https", [])
    assert hosts == {"192.0.2.7:443", "192.0.2.7"} and "https://192.0.2.7" in origins
    assert "localhost:443" not in hosts
