"""The agent's URL in a sandbox that reaches the recorder through the relay (``relay/``).

Why one piece for every such sandbox: the Hugging Face sandbox and the container sandbox start their
relays differently (an upload and a port proxy; a mount and a Unix socket), but what the agent is
told is the same: the recorder's URL moved onto the relay's port on the sandbox's own loopback, one
relay per sandbox, each further rollout path allowed on the link it already has.
"""

from __future__ import annotations

import abc
from urllib.parse import urlsplit

from openenv_harness.relay import DialerThread
from openenv_harness.sandbox.base import ModelEndpoint, SandboxError


def rebase_url(recorder_base_url: str, new_origin: str) -> str:
    """``recorder_base_url`` with its scheme/host/port replaced by ``new_origin``'s (whose own path,
    if any, is prefixed): ``http://10.0.0.5:8000/rollout/s/v1`` on ``http://127.0.0.1:9`` gives
    ``http://127.0.0.1:9/rollout/s/v1``."""
    old, new = urlsplit(recorder_base_url), urlsplit(new_origin)
    if not old.scheme or not old.netloc or not new.scheme or not new.netloc:
        raise SandboxError(f"cannot rebase {recorder_base_url!r} onto {new_origin!r}: both must be absolute URLs")
    path = new.path.rstrip("/") + (old.path or "")
    return f"{new.scheme}://{new.netloc}{path}" + (f"?{old.query}" if old.query else "")


class RelayedEndpoint(abc.ABC):
    """A sandbox's relay as the agent sees it. ``_start_relay`` starts the relay inside, links the
    dialer and sets ``_dialer``, ``_relay_target`` and ``_relay_http_port``."""

    _dialer: DialerThread | None = None
    _relay_target: str | None = None
    _relay_http_port: int | None = None

    @abc.abstractmethod
    def _start_relay(self, origin: str, path_prefix: str) -> None:
        """Start the relay for ``origin``, serving ``path_prefix`` and below."""

    def relay_endpoint(self, recorder_base_url: str, api_key: str) -> ModelEndpoint:
        """The recorder's URL on the relay's port (the relay started on first use)."""
        parts = urlsplit(recorder_base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SandboxError(f"recorder_base_url must be an http(s) URL, got {recorder_base_url!r}")
        origin = f"{parts.scheme}://{parts.netloc}"
        if self._dialer is None:
            self._start_relay(origin, parts.path or "/")
        elif origin != self._relay_target:
            raise SandboxError(f"this sandbox already relays to {self._relay_target}, not {origin}")
        else:
            self._dialer.allow_path_prefix(parts.path or "/")
        return ModelEndpoint(base_url=rebase_url(recorder_base_url, f"http://127.0.0.1:{self._relay_http_port}"),
                             api_key=api_key)

    def relay_faults(self) -> list[str]:
        """What went wrong on the relay path (``DialerStats.faults``), empty before it started."""
        return [] if self._dialer is None else self._dialer.stats.faults()
