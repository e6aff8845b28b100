"""A small synchronous client for the recorder's control plane (what trainers and sessions use)."""

from __future__ import annotations

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


class RecorderClient:
    """``RecorderClient(url, admin_token)``; ``transport`` is injectable like any httpx client."""

    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers={"authorization": f"Bearer {admin_token}"},
            timeout=timeout_s, transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RecorderClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._http.request(method, path, **kw)
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("error", {}).get("message") or resp.text
            except ValueError:
                detail = resp.text
            raise RecorderAPIError(resp.status_code, detail)
        return resp.json() if resp.content else None

    def create_session(self, **spec: Any) -> dict[str, Any]:
        """Returns ``{session_id, secret, base_url, template_status, ...}``."""
        return self._call("POST", "/admin/sessions", json=spec)

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/admin/sessions/{session_id}")

    def sessions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/admin/sessions")

    def close_session(self, session_id: str, *, grace_s: float | None = None) -> dict[str, Any]:
        """Close a session; once this returns its records are final (``grace_s``: how long calls in
        flight may finish first, the recorder's ``close_grace_s`` by default)."""
        params = {"grace_s": grace_s} if grace_s is not None else None
        return self._call("POST", f"/admin/sessions/{session_id}/close", params=params)

    def records(self, session_id: str, *, include: str = "all", after_seq: int = 0) -> list[dict[str, Any]]:
        return self._call("GET", f"/admin/sessions/{session_id}/records",
                          params={"include": include, "after_seq": after_seq})

    def training_trace_json(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/admin/sessions/{session_id}/training_trace")

    def wait(self, session_id: str, *, timeout_s: float = 30.0, until: str = "closed",
             min_calls: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout_s": timeout_s, "until": until}
        if min_calls is not None:
            params["min_calls"] = min_calls
        return self._call("GET", f"/admin/sessions/{session_id}/wait", params=params,
                          timeout=timeout_s + 30)

    def pause_engine(self, mode: str = "keep", *, timeout_s: float | None = None) -> dict[str, Any]:
        """Pause the engine (every replica) through the recorder's fence. ``wait`` returns only once the
        engine's calls in flight have finished, which takes as long as the longest of them: unless a
        ``timeout_s`` is given it waits as long as the recorder waits for the engine (600 s) plus a
        margin, not the client's default timeout that fits every other admin call."""
        if timeout_s is None and mode == "wait":
            timeout_s = WAIT_PAUSE_TIMEOUT_S
        kw: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        return self._call("POST", "/admin/engine/pause", params={"mode": mode}, **kw)

    def resume_engine(self) -> dict[str, Any]:
        return self._call("POST", "/admin/engine/resume")

    def fence_pause(self) -> dict[str, Any]:
        """Hold new calls at this recorder without touching the engine (another one pauses it)."""
        return self._call("POST", "/admin/fence/pause")

    def fence_resume(self, *, bump: bool = True) -> dict[str, Any]:
        return self._call("POST", "/admin/fence/resume", params={"bump": str(bump).lower()})

    def set_policy_version(self, version: int) -> dict[str, Any]:
        return self._call("POST", "/admin/policy_version", json={"version": version})

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/admin/health")

    def metrics_text(self) -> str:
        resp = self._http.get("/metrics")
        if resp.status_code >= 400:
            raise RecorderAPIError(resp.status_code, resp.text)
        return resp.text
