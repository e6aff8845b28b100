"""Who may call what (D5): a per-session secret is both authentication and routing.

Only digests of secrets are stored (in memory and on disk), so a leaked database cannot be used
to impersonate an agent. The admin token guards the control plane; it is compared in constant
time. Nothing but the bare liveness probe is reachable without one of the two. The trace viewer's
browser holds neither: it holds a login (``ViewerLogins``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

SECRET_PREFIX = "oeh-"


def new_secret() -> str:
    """A fresh per-rollout secret (256 bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_admin_token() -> str:
    return "oeh-admin-" + secrets.token_urlsafe(32)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key an agent SDK sent: ``Authorization: Bearer <key>``, ``x-api-key: <key>`` (Anthropic's
    SDK) or ``x-goog-api-key: <key>`` (Google's). An ``Authorization`` header of another scheme (a
    proxy's ``Basic``) is not the agent's key: the SDK's own header is still read."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key") or headers.get("x-goog-api-key")
    return key.strip() if key else None


def digests_match(expected_digest: str, presented_secret: str | None) -> bool:
    """Constant-time check of a presented secret against a stored digest."""
    if not presented_secret:
        return False
    return hmac.compare_digest(expected_digest, secret_digest(presented_secret))


class AdminAuth:
    """The control-plane token."""

    def __init__(self, token: str) -> None:
        if len(token) < 16:
            raise ValueError("admin token must be at least 16 characters")
        self._digest = secret_digest(token)

    def check(self, headers: Mapping[str, str]) -> bool:
        return digests_match(self._digest, bearer_token(headers))


class ViewerLogins:
    """The trace viewer's browser credentials: logins and one-time login codes, never the admin token.

    Why: a browser keeps what it is given -- in its cookie jar, and a URL in its history, in proxy
    logs and in screenshots. So the admin token is typed into a form (``POST /viewer/login``) or
    swapped for a one-time code (``POST /admin/viewer/codes``; ``openenv-harness serve`` prints a
    link with one), and the cookie the browser then holds names a login: random, bounded in number
    and lifetime, ended by logging out, and worthless on the control plane's write routes. Only
    digests are kept, in memory: a restarted recorder asks the browser to log in again.
    """

    def __init__(self, *, login_s: float = 12 * 3600.0, code_s: float = 600.0, most: int = 64) -> None:
        self.login_s = login_s
        self.code_s = code_s
        self._most = most
        self._logins: dict[str, float] = {}  # digest -> expiry (monotonic)
        self._codes: dict[str, float] = {}

    @staticmethod
    def _put(table: dict[str, float], value: str, until: float, most: int) -> None:
        now = time.monotonic()
        for digest in [d for d, expiry in table.items() if expiry <= now]:
            del table[digest]
        while len(table) >= most:  # the oldest goes first (dicts keep insertion order)
            del table[next(iter(table))]
        table[secret_digest(value)] = until

    def new_login(self) -> str:
        login = "oeh-viewer-" + secrets.token_urlsafe(32)
        self._put(self._logins, login, time.monotonic() + self.login_s, self._most)
        return login

    def valid(self, login: str | None) -> bool:
        if not login:
            return False
        expiry = self._logins.get(secret_digest(login))
        return expiry is not None and expiry > time.monotonic()

    def end(self, login: str | None) -> None:
        if login:
            self._logins.pop(secret_digest(login), None)

    def new_code(self) -> str:
        code = secrets.token_urlsafe(24)
        self._put(self._codes, code, time.monotonic() + self.code_s, self._most)
        return code

    def redeem(self, code: str | None) -> bool:
        """True once per code, within its lifetime: the code is spent either way."""
        if not code:
            return False
        expiry = self._codes.pop(secret_digest(code), None)
        return expiry is not None and expiry > time.monotonic()
