"""The in-job server of an emulated sandbox job: health, exec, processes, files, pools, proxy.

Routes and auth follow hf_sandbox.md section 2b: every request needs the HF bearer (the Jobs proxy
gate); dedicated routes live under ``/v1`` and take the job's sandbox token; a pool host serves
``/v1/sandboxes`` with the host token and ``/v1/sandboxes/{id}/...`` with that sandbox's own
token only (the host token gets 403 there).
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from openenv_harness.testing.hf_emulator.files import handle_files
from openenv_harness.testing.hf_emulator.jobs import EmulatedJob, EmulatedSandbox
from openenv_harness.testing.hf_emulator.processes import command_argv
from openenv_harness.testing.hf_emulator.proxy import splice
from openenv_harness.testing.hf_emulator.wire import HttpFailure, Request, json_response

PROTOCOL = 3
#: Returned by handlers that wrote (or spliced) the reply themselves.
KEEP_ALIVE = b""
CLOSE = None


class SandboxServer:
    """Serves the in-job routes of every emulated job."""

    def __init__(self, *, hf_token: str, exec_ping_interval_s: float) -> None:
        self.hf_token = hf_token
        self.exec_ping_interval_s = exec_ping_interval_s

    async def handle(self, job: EmulatedJob, request: Request, path: str) -> bytes | None:
        bearer = request.header("authorization") or ""
        if not hmac.compare_digest(bearer.encode(), f"Bearer {self.hf_token}".encode()):
            raise HttpFailure(401, "invalid or missing HF bearer at the jobs proxy")
        if path == "/health" and request.method == "GET":
            return json_response(200, {"status": "ok", "protocol": PROTOCOL, "version": "emulator"})
        if job.stage != "RUNNING":
            raise HttpFailure(503, f"job is {job.stage}")
        token = request.header("x-sandbox-token") or ""
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] != "v1":
            raise HttpFailure(404, f"no route {request.method} {path}")
        if not job.host_mode:
            _require(token, job.sandbox_token)
            return await self._sandbox_route(job.sandboxes[""], request, parts[1:], path)
        if parts[1:2] != ["sandboxes"]:
            raise HttpFailure(404, "a pool host serves /v1/sandboxes only")
        return await self._pool_route(job, request, parts[2:], token, path)

    async def _pool_route(
        self, job: EmulatedJob, request: Request, parts: list[str], token: str, path: str
    ) -> bytes | None:
        if not parts:
            _require(token, job.sandbox_token)
            if request.method == "POST":
                return json_response(200, self._create_pooled(job, await request.json()))
            if request.method == "GET":
                return json_response(200, [{"id": k, "home": str(s.home)} for k, s in job.sandboxes.items()])
            raise HttpFailure(405, "method not allowed")
        sandbox = job.sandboxes.get(parts[0])
        if sandbox is None:
            raise HttpFailure(404, f"no sandbox {parts[0]}")
        if len(parts) == 1 and request.method == "DELETE":
            if not (_matches(token, job.sandbox_token) or _matches(token, sandbox.token)):
                raise HttpFailure(403, "wrong sandbox token")
            sandbox.processes.kill_all()
            del job.sandboxes[parts[0]]
            return json_response(200, {"id": parts[0], "deleted": True})
        if parts[1:] == ["token"] and request.method == "GET":
            _require(token, job.sandbox_token)
            return json_response(200, {"token": sandbox.token})
        _require(token, sandbox.token)
        return await self._sandbox_route(sandbox, request, parts[1:], path)

    def _create_pooled(self, job: EmulatedJob, body: Any) -> dict[str, Any]:
        body = body if isinstance(body, dict) else {}
        count = int(body.get("count", 1))
        env = {str(k): str(v) for k, v in (body.get("env") or {}).items()}
        created = []
        for _ in range(count):
            if len(job.sandboxes) >= job.capacity:
                break
            local_id = secrets.token_hex(4)
            home = job.root / "sandboxes" / local_id
            home.mkdir(parents=True)
            sandbox = EmulatedSandbox(local_id=local_id, token=secrets.token_hex(16), home=home, env=env)
            job.sandboxes[local_id] = sandbox
            created.append({"id": local_id, "token": sandbox.token, "uid": 20000 + len(job.sandboxes),
                            "home": str(home)})
        return {"sandboxes": created, "rejected": count - len(created)}

    async def _sandbox_route(
        self, sandbox: EmulatedSandbox, request: Request, parts: list[str], path: str
    ) -> bytes | None:
        route = parts[0] if parts else ""
        if route == "exec" and len(parts) == 1 and request.method == "POST":
            payload = await _payload(request)
            timeout = payload.get("timeout")
            await sandbox.processes.exec_stream(
                request.writer,
                command_argv(payload.get("cmd"), payload.get("shell")),
                env=sandbox.process_env(payload.get("env")),
                cwd=sandbox.working_directory(payload.get("cwd")),
                timeout_s=float(timeout) if timeout is not None else None,
                stdin=payload.get("stdin"),
                ping_interval_s=self.exec_ping_interval_s,
            )
            return KEEP_ALIVE
        if route == "processes":
            return await self._processes(sandbox, request, parts[1:])
        if route == "files" and len(parts) == 2:
            return await handle_files(request, parts[1], sandbox.resolve)
        if route == "proxy" and len(parts) >= 2:
            prefix = "/".join(parts[:2])
            inner = path.split(prefix, 1)[1]
            await splice(request, parts[1], inner, unix_dir=sandbox.proxy_dir if sandbox.pooled else None)
            return CLOSE
        raise HttpFailure(404, f"no route {request.method} {path}")

    async def _processes(self, sandbox: EmulatedSandbox, request: Request, rest: list[str]) -> bytes:
        table = sandbox.processes
        if not rest and request.method == "POST":
            payload = await _payload(request)
            entry = await table.start_background(
                command_argv(payload.get("cmd"), payload.get("shell")),
                env=sandbox.process_env(payload.get("env")),
                cwd=sandbox.working_directory(payload.get("cwd")),
                cmd=payload.get("cmd"), tag=payload.get("tag"),
            )
            return json_response(200, {"id": entry.id, "pid": entry.process.pid, "cmd": entry.cmd, "tag": entry.tag})
        if not rest and request.method == "GET":
            return json_response(200, [entry.describe() for entry in table.background.values()])
        if len(rest) == 1 and request.method == "DELETE":
            return json_response(200, {"id": rest[0], "killed": table.kill(rest[0])})
        raise HttpFailure(404, "no such processes route")


async def _payload(request: Request) -> dict[str, Any]:
    payload = await request.json()
    if not isinstance(payload, dict):
        raise HttpFailure(400, "body must be a JSON object")
    return payload


def _matches(offered: str, expected: str) -> bool:
    return bool(offered) and hmac.compare_digest(offered.encode(), expected.encode())


def _require(offered: str, expected: str) -> None:
    if not _matches(offered, expected):
        raise HttpFailure(403, "invalid or missing X-Sandbox-Token")
