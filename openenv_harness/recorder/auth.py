"""Who may call what (D5): a per-session secret is both authentication and routing.

Only digests of secrets are stored (in memory and on disk), so a leaked database cannot be used
to impersonate an agent. The admin token guards the control plane; it is compared in constant
time. Nothing but the bare liveness probe is reachable without one of the two.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Mapping

SECRET_PREFIX = "oeh-"


def new_secret() -> str:
    """A fresh per-rollout secret (256 bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_admin_token() -> str:
    return "oeh-admin-" + secrets.token_urlsafe(32)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key an agent SDK sent: ``Authorization: Bearer <key>`` or ``x-api-key: <key>``."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    key = headers.get("x-api-key")
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
