"""A small synchronous client for the recorder's control plane (what trainers and sessions use)."""

from __future__ import annotations

import threading
from typing import Any

import httpx


class RecorderAPIError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"recorder answered HTTP {status}: {message}")
        self.status = status
        self.message = message


#: How long ``pause_engine("wait")`` waits by default: the recorder's own bound on an engine call
#: (``replicas.py``) plus a margin for the fence's bookkeeping.
WAIT_PAUSE_TIMEOUT_S = 630.0


#: main port URL -> its admin listener's URL (None: it has none), learned once per process: clients
#: are made per rollout, and each asking the main port again would wait behind the agents' calls
_ADVERTISED: dict[str, str | None] = {}
_ADVERTISED_LOCK = threading.Lock()


def forget_admin_listeners() -> None:
    """Drop what was learned about recorders' admin listeners (a recorder restarted elsewhere)."""
    with _ADVERTISED_LOCK:
        _ADVERTISED.clear()


class RecorderClient:
    """``RecorderClient(url, admin_token)``; ``transport`` is injectable like any httpx client.

    Session create, read and close, and health, go to the recorder's admin listener (``RecorderConfig.admin_port``)
    when there is one: ``admin_url`` names it, else the main port's ``GET /admin/listener`` is asked
    once per recorder per process (``discover_admin=False``: never). Everything else, and every call
    to a recorder without one, goes to the main port. A listener that refuses the connection (the
    recorder restarted without it) is forgotten and the call goes to the main port.
    """

    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None, admin_url: str | None = None,
                 discover_admin: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self._token, self._timeout_s, self._transport = admin_token, timeout_s, transport
        self._http = self._client(self.base_url)
        self._admin_url = admin_url.rstrip("/") if admin_url else None
        self._discover = discover_admin and admin_url is None
        self._admin: httpx.Client | None = None

    def _client(self, url: str) -> httpx.Client:
        return httpx.Client(base_url=url, headers={"authorization": f"Bearer {self._token}"},
                            timeout=self._timeout_s, transport=self._transport)

    @property
    def admin_url(self) -> str | None:
        """The admin listener this client sends session create, read and close to (None: the main port)."""
        if self._discover:
            self._discover = False
            self._admin_url = self._advertised()
        return self._admin_url

    def _advertised(self) -> str | None:
        with _ADVERTISED_LOCK:
            if self.base_url in _ADVERTISED:
                return _ADVERTISED[self.base_url]
        try:
            resp = self._http.get("/admin/listener")
            if resp.status_code not in (200, 404):  # 404: a recorder from before the admin listener
                return None  # not learned (a wrong token, a failing recorder): asked again by the next client
            port = resp.json().get("admin_port") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        # the main port's host as this client reaches it (the listener binds the same address)
        url = str(httpx.URL(self.base_url).copy_with(port=int(port), path="")).rstrip("/") if port else None
        with _ADVERTISED_LOCK:
            _ADVERTISED[self.base_url] = url
        return url

    def close(self) -> None:
        self._http.close()
        if self._admin is not None:
            self._admin.close()

    def __enter__(self) -> RecorderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._answer(self._http.request(method, path, **kw))

    def _lifecycle(self, method: str, path: str, **kw: Any) -> Any:
        """A session create, read or close, or health: on the admin listener when there is one."""
        url = self.admin_url
        if url is None:
            return self._call(method, path, **kw)
        if self._admin is None:
            self._admin = self._client(url)
        try:
            resp = self._admin.request(method, path, **kw)
        except httpx.ConnectError:  # nothing was sent: the main port serves it, and later calls
            with _ADVERTISED_LOCK:
                if _ADVERTISED.get(self.base_url) == url:
                    del _ADVERTISED[self.base_url]
            self._admin_url = None
            return self._call(method, path, **kw)
        return self._answer(resp)

    @staticmethod
    def _answer(resp: httpx.Response) -> Any:
        """The decoded JSON body (None when empty): each public method names the shape its route answers."""
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("error", {}).get("message") or resp.text
            except ValueError:
                detail = resp.text
            raise RecorderAPIError(resp.status_code, detail)
        return resp.json() if resp.content else None

    def create_session(self, **spec: Any) -> dict[str, Any]:
        """Returns ``{session_id, secret, base_url, template_status, ...}``."""
        answer: dict[str, Any] = self._lifecycle("POST", "/admin/sessions", json=spec)
        return answer

    def session(self, session_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._lifecycle("GET", f"/admin/sessions/{session_id}")
        return answer

    def set_outcome(self, session_id: str, *, reward: float | None,
                    unscored_reason: str | None = None) -> dict[str, Any]:
        """Store how the rollout ended beside its records (exports carry the reward with every row)."""
        answer: dict[str, Any] = self._call("POST", f"/admin/sessions/{session_id}/outcome",
                                            json={"reward": reward, "unscored_reason": unscored_reason})
        return answer

    def sessions(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self._call("GET", "/admin/sessions")
        return answer

    def close_session(self, session_id: str, *, grace_s: float | None = None) -> dict[str, Any]:
        """Close a session; once this returns its records are final (``grace_s``: how long calls in
        flight may finish first, the recorder's ``close_grace_s`` by default)."""
        params = {"grace_s": grace_s} if grace_s is not None else None
        answer: dict[str, Any] = self._lifecycle("POST", f"/admin/sessions/{session_id}/close", params=params)
        return answer

    def records(self, session_id: str, *, include: str = "all", after_seq: int = 0) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self._call("GET", f"/admin/sessions/{session_id}/records",
                                                  params={"include": include, "after_seq": after_seq})
        return answer

    def training_trace_json(self, session_id: str, *, non_policy: str = "mask") -> dict[str, Any]:
        answer: dict[str, Any] = self._call("GET", f"/admin/sessions/{session_id}/training_trace",
                                            params={"non_policy": non_policy})
        return answer

    def wait(self, session_id: str, *, timeout_s: float = 30.0, until: str = "closed",
             min_calls: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout_s": timeout_s, "until": until}
        if min_calls is not None:
            params["min_calls"] = min_calls
        answer: dict[str, Any] = self._call("GET", f"/admin/sessions/{session_id}/wait", params=params,
                                            timeout=timeout_s + 30)
        return answer

    def pause_engine(self, mode: str = "keep", *, timeout_s: float | None = None) -> dict[str, Any]:
        """Pause the engine (every replica) through the recorder's fence. ``wait`` returns only once the
        engine's calls in flight have finished, which takes as long as the longest of them: unless a
        ``timeout_s`` is given it waits as long as the recorder waits for the engine (600 s) plus a
        margin, not the client's default timeout that fits every other admin call."""
        if timeout_s is None and mode == "wait":
            timeout_s = WAIT_PAUSE_TIMEOUT_S
        kw: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        answer: dict[str, Any] = self._call("POST", "/admin/engine/pause", params={"mode": mode}, **kw)
        return answer

    def resume_engine(self, *, bump: bool = True) -> dict[str, Any]:
        """Resume the engine and open the fence; ``bump`` advances the policy version first (a sync),
        ``bump=False`` keeps it (the engine serves the weights it served before the pause)."""
        answer: dict[str, Any] = self._call("POST", "/admin/engine/resume", params={"bump": str(bump).lower()})
        return answer

    def fence_pause(self) -> dict[str, Any]:
        """Hold new calls at this recorder without touching the engine (another one pauses it)."""
        answer: dict[str, Any] = self._call("POST", "/admin/fence/pause")
        return answer

    def fence_resume(self, *, bump: bool = True) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("POST", "/admin/fence/resume", params={"bump": str(bump).lower()})
        return answer

    def set_policy_version(self, version: int) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("POST", "/admin/policy_version", json={"version": version})
        return answer

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._lifecycle("GET", "/admin/health")
        return answer

    def metrics_text(self) -> str:
        resp = self._http.get("/metrics")
        if resp.status_code >= 400:
            raise RecorderAPIError(resp.status_code, resp.text)
        return resp.text
