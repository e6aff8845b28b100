"""The viewer's page routes over real HTTP: admin-only, cookie login, no open redirect, offline page."""

from __future__ import annotations

import re
from importlib import resources

import httpx
import pytest

from openenv_harness.viewer.pages import ASSETS, SECURITY_HEADERS

from viewer_support import ADMIN, Recorded, login_code, login_cookie

PAGE_ROUTES = ["/viewer", "/viewer/", *[f"/viewer/static/{name}" for name in ASSETS], "/viewer/static/nope.js"]
#: What an authenticated GET answers on each page route.
AUTHED_STATUS = {"/viewer": 307, "/viewer/static/nope.js": 404}


def static_text(name: str) -> str:
    return resources.files("openenv_harness.viewer").joinpath("static", name).read_text("utf-8")


@pytest.mark.parametrize("path", PAGE_ROUTES)
def test_page_routes_need_the_admin_token(path: str, http: httpx.Client, recorded: Recorded) -> None:
    refused = [
        {},
        {"headers": {"authorization": "Bearer not-the-admin-token-at-all"}},
        {"headers": {"cookie": "oeh_admin=not-the-admin-token-at-all"}},
        {"headers": {"authorization": f"Bearer {recorded.agent_secret}"}},  # an agent key is not an admin token
        {"headers": {"cookie": f"oeh_admin={recorded.agent_secret}"}},
        {"headers": {"cookie": f"other_cookie={ADMIN}"}},  # the token under another name does not count
        {"headers": {"cookie": f"oeh_admin={ADMIN}"}},  # nor the token itself: the cookie names a login
    ]
    for kwargs in refused:
        reply = http.get(path, **kwargs)
        assert reply.status_code == 401, (path, kwargs, reply.status_code)
        assert "viewer.js" not in reply.text and "session-table" not in reply.text  # nothing of the page leaks
    expected = AUTHED_STATUS.get(path, 200)
    assert http.get(path, headers={"authorization": f"Bearer {ADMIN}"}).status_code == expected
    cookie = login_cookie(http)
    assert http.get(path, headers={"cookie": f"oeh_admin={cookie}"}).status_code == expected


def test_unauthenticated_page_is_a_login_form(http: httpx.Client) -> None:
    reply = http.get("/viewer/")
    assert reply.status_code == 401 and reply.headers["content-type"].startswith("text/html")
    assert '<form method="post" action="/viewer/login">' in reply.text
    assert reply.headers["content-security-policy"] == SECURITY_HEADERS["content-security-policy"]


def test_login_sets_a_strict_httponly_cookie_and_redirects(http: httpx.Client, recorded: Recorded) -> None:
    target = f"/viewer/#session={recorded.drift}"
    reply = http.post("/viewer/login", data={"token": ADMIN, "next": target})
    assert reply.status_code == 303
    assert reply.headers["location"] == target
    set_cookie = reply.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in set_cookie.split(";")}
    assert set_cookie.startswith("oeh_admin=")
    assert {"httponly", "samesite", "path"} <= attributes
    assert "samesite=strict" in set_cookie.lower() and "path=/" in set_cookie.lower()
    assert "secure" not in attributes  # plain-HTTP recorder: a Secure cookie would never be sent back
    assert reply.headers["referrer-policy"] == "no-referrer"


def test_the_cookie_is_a_login_not_the_admin_token(http: httpx.Client) -> None:
    """The browser never holds the admin token: its cookie names a login the recorder can end."""
    reply = http.post("/viewer/login", data={"token": ADMIN})
    cookie = reply.cookies.get("oeh_admin")
    assert cookie and ADMIN not in reply.headers["set-cookie"] and ADMIN not in cookie
    assert http.get("/viewer/", headers={"cookie": f"oeh_admin={ADMIN}"}).status_code == 401
    http.cookies.clear()
    assert http.get("/viewer/", headers={"cookie": f"oeh_admin={cookie}"}).status_code == 200


def test_the_admin_token_is_never_accepted_in_a_url(http: httpx.Client) -> None:
    """A URL lands in browser history, proxy logs and screenshots: the token there logs nobody in."""
    reply = http.get("/viewer/login", params={"token": ADMIN, "next": "/viewer/"})
    assert reply.status_code == 400 and "set-cookie" not in reply.headers
    assert "not accepted in a URL" in reply.text and '<form method="post" action="/viewer/login">' in reply.text
    assert ADMIN not in reply.text


@pytest.mark.parametrize("token", ["wrong-token-0123456789abcdef", "", "agent"])
def test_login_refuses_anything_but_the_admin_token(token: str, http: httpx.Client, recorded: Recorded) -> None:
    value = recorded.agent_secret if token == "agent" else token
    reply = http.post("/viewer/login", data={"token": value})
    assert reply.status_code == 401
    assert "set-cookie" not in reply.headers
    assert "not this recorder's admin token" in reply.text or "Log in" in reply.text
    assert not value or value not in reply.text


def test_a_one_time_code_logs_in_once(http: httpx.Client, recorded: Recorded) -> None:
    code = login_code(recorded)
    assert ADMIN not in code
    target = f"/viewer/#session={recorded.faults}"
    first = http.get("/viewer/login", params={"code": code, "next": target})
    assert first.status_code == 303 and first.headers["location"] == target
    cookie = first.cookies.get("oeh_admin")
    assert cookie and cookie != code
    http.cookies.clear()
    again = http.get("/viewer/login", params={"code": code})
    assert again.status_code == 401 and "set-cookie" not in again.headers  # spent
    assert http.get("/viewer/login", params={"code": "made-up-code"}).status_code == 401
    assert http.get("/viewer/", headers={"cookie": f"oeh_admin={cookie}"}).status_code == 200
    # minting a code needs the admin token itself: the browser's cookie cannot mint more
    assert http.post("/admin/viewer/codes", headers={"cookie": f"oeh_admin={cookie}"}).status_code == 401


def test_login_without_a_token_shows_the_form(http: httpx.Client) -> None:
    reply = http.get("/viewer/login")
    assert reply.status_code == 401 and "<form" in reply.text and "set-cookie" not in reply.headers


@pytest.mark.parametrize("target", [
    "https://evil.example/", "//evil.example/viewer/", "/admin/sessions", "/viewer/..//evil", "/viewer/\\evil",
    "javascript:alert(1)", "/viewer/\r\nx: y",
])
def test_login_never_redirects_outside_the_viewer(target: str, http: httpx.Client) -> None:
    reply = http.post("/viewer/login", data={"token": ADMIN, "next": target})
    assert reply.status_code == 303
    assert reply.headers["location"] == "/viewer/"


def test_login_page_escapes_what_it_echoes(http: httpx.Client) -> None:
    reply = http.get("/viewer/login", params={"next": '/viewer/"><script>alert(1)</script>'})
    assert reply.status_code == 401
    assert "<script>alert(1)" not in reply.text
    assert "&quot;&gt;&lt;script&gt;" in reply.text


def test_form_login(http: httpx.Client, recorded: Recorded) -> None:
    ok = http.post("/viewer/login", data={"token": ADMIN, "next": f"/viewer/#session={recorded.faults}"})
    assert ok.status_code == 303 and ok.headers["location"] == f"/viewer/#session={recorded.faults}"
    assert ok.cookies.get("oeh_admin") and ok.cookies.get("oeh_admin") != ADMIN
    wrong = http.post("/viewer/login", data={"token": recorded.agent_secret})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    huge = http.post("/viewer/login", content=b"token=" + b"x" * 10_000,
                     headers={"content-type": "application/x-www-form-urlencoded"})
    assert huge.status_code == 413


def test_logout_forgets_the_cookie(http: httpx.Client) -> None:
    cookie = login_cookie(http)
    reply = http.get("/viewer/logout", headers={"cookie": f"oeh_admin={cookie}"})
    assert reply.status_code == 303 and reply.headers["location"] == "/viewer/"
    set_cookie = reply.headers["set-cookie"].lower()
    assert set_cookie.startswith('oeh_admin="";') and "max-age=0" in set_cookie
    http.cookies.clear()
    assert http.get("/viewer/", headers={"cookie": f"oeh_admin={cookie}"}).status_code == 401  # ended for good


def test_the_cookie_only_reads(http: httpx.Client, recorded: Recorded) -> None:
    """The browser's credential opens read routes; it cannot create, close or pause anything."""
    cookie = {"cookie": f"oeh_admin={login_cookie(http)}"}
    assert http.get("/admin/sessions", headers=cookie).status_code == 200
    assert http.get(f"/admin/sessions/{recorded.drift}/records", headers=cookie).status_code == 200
    assert http.get("/metrics", headers=cookie).status_code == 200
    for method, path in [("POST", "/admin/sessions"), ("POST", f"/admin/sessions/{recorded.faults}/close"),
                         ("POST", "/admin/fence/pause"), ("POST", "/admin/policy_version")]:
        reply = http.request(method, path, headers=cookie, json={})
        assert reply.status_code == 401, (method, path, reply.text)
    assert recorded.admin.session(recorded.faults)["status"] == "stopped"  # unchanged
    assert recorded.admin.health()["fence"]["paused"] is False


def test_page_and_assets_are_self_contained(http: httpx.Client) -> None:
    """No CDN, no external URL: the page and every module it imports come from this recorder."""
    auth = {"authorization": f"Bearer {ADMIN}"}
    page = http.get("/viewer/", headers=auth)
    assert page.status_code == 200
    for header, value in SECURITY_HEADERS.items():
        assert page.headers[header] == value
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert references and all(not re.match(r"^[a-z]+:|^//", ref) or ref == "data:," for ref in references), references
    imported = {"viewer.js"}
    for name in ASSETS:
        text = static_text(name)
        external = [u for u in re.findall(r"https?://[^\s\"'`)]+", text) if u != "http://www.w3.org/2000/svg"]
        assert not external, (name, external)
        imported |= set(re.findall(r'from "\./([\w.]+)"', text))
    for name in imported:
        reply = http.get(f"/viewer/static/{name}", headers=auth)
        assert reply.status_code == 200, name
        assert reply.headers["content-type"].startswith("text/javascript")
    assert http.get("/viewer/static/viewer.css", headers=auth).headers["content-type"].startswith("text/css")
