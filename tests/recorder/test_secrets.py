"""No secret is ever logged, stored, counted, shown in the viewer or put in an error message.

A real recorder process, logging at debug level, is driven through its success and error paths --
good and bad agent keys, malformed and oversized requests, engine errors that quote the engine's
key back, a dropped engine connection, admin and viewer logins right and wrong -- and then
everything it emitted is searched: its stdout and stderr, every file of its store (raw, and the
SQLite rows with their compressed blobs unpacked), every answer it gave, its metrics. The secrets:
each session's key, the admin token, the engine's API key, an HF token in its environment, and the
viewer's login code and cookie. The search is shown to see stored text (a marker sent in a prompt
is found in the store), so finding nothing means something.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from openenv_harness.recorder.serving import free_port
from openenv_harness.recorder.store.blocks import unpack_blob
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault

from agentloop import TOOLS, tool_script
from rawhttp import exchange, request


@pytest.fixture(scope="module")
def keyed_engine() -> Iterator[tuple[EngineServer, str]]:
    key = "engine-key-" + secrets.token_urlsafe(24)
    with EngineServer(EngineConfig(api_key=key)) as e:
        yield e, key


def store_text(store_dir: Path) -> bytes:
    """Everything the store holds: each file's raw bytes, and every SQLite value with blobs unpacked."""
    out = [path.read_bytes() for path in sorted(store_dir.rglob("*")) if path.is_file()]
    db = sqlite3.connect(f"file:{store_dir / 'r.db'}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in db.execute(f"SELECT * FROM {table}"):  # noqa: S608 -- names from sqlite_master
                for value in row:
                    if isinstance(value, bytes):
                        out.append(value)
                        try:
                            out.append(unpack_blob(value))
                        except Exception:  # noqa: BLE001 -- not every blob column is a packed blob
                            pass
                    elif value is not None:
                        out.append(str(value).encode())
    finally:
        db.close()
    return b"\n".join(out)


def test_no_secret_appears_anywhere(tmp_path: Path, keyed_engine: tuple[EngineServer, str]) -> None:
    engine, engine_key = keyed_engine
    admin_token = "admin-" + secrets.token_urlsafe(24)
    hf_token = "hf_" + secrets.token_urlsafe(24)
    marker = "stored-marker-" + secrets.token_hex(8)
    store_dir, port = tmp_path / "store", free_port()
    store_dir.mkdir()
    stdout, stderr = (tmp_path / "stdout.log").open("wb"), (tmp_path / "stderr.log").open("wb")
    env = {**os.environ, "OEH_ADMIN_TOKEN": admin_token, "OEH_ENGINE_API_KEY": engine_key, "HF_TOKEN": hf_token,
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "openenv_harness.recorder", "--engine-url", engine.url, "--port",
                             str(port), "--store", str(store_dir / "r.db"), "--log-level", "debug"],
                            stdout=stdout, stderr=stderr, env=env)
    url = f"http://127.0.0.1:{port}"
    answers: list[bytes] = []  # everything the recorder said to anyone but the trainer creating sessions

    def keep(reply: httpx.Response) -> httpx.Response:
        answers.append(str(reply.headers).encode() + b"\n" + reply.content)
        return reply

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the recorder did not start"
            time.sleep(0.1)
        admin = {"authorization": f"Bearer {admin_token}"}
        with httpx.Client(base_url=url, timeout=30) as http:
            made = [http.post("/admin/sessions", json={"metadata": {"note": "secret check"}}, headers=admin).json()
                    for _ in range(2)]
            keys = [s["secret"] for s in made]
            one, other = made
            for s in made:
                engine.set_script(s["session_id"], tool_script(3))
            chat = f"/rollout/{one['session_id']}/v1/chat/completions"
            agent = {"authorization": f"Bearer {one['secret']}"}
            prompt = {"model": "reference-model", "tools": TOOLS,
                      "messages": [{"role": "user", "content": f"{marker} " + "long prompt text " * 200}]}
            assert keep(http.post(chat, json=prompt, headers=agent)).status_code == 200
            assert keep(http.post(chat, json={**prompt, "stream": True}, headers=agent)).status_code == 200
            # wrong, missing and other sessions' keys; malformed bodies
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {other['secret']}"},
                            {"x-api-key": one["secret"][:-1]}, {"authorization": f"Basic {one['secret']}"}):
                assert keep(http.post(chat, json=prompt, headers=headers)).status_code == 401
            for body in (b"{", b"[]", b'{"messages":' + b"[" * 100 + b"]" * 100 + b"}",
                         b'{"messages":[{"role":"user","content":"x"}],"seed":123456789012345678901234567890}'):
                assert keep(http.post(chat, content=body, headers=agent)).status_code == 400
            # the engine quotes the engine key back in its errors, or drops the connection
            for fault in (Fault(status=500, echo_headers=True), Fault(status=400, echo_headers=True),
                          Fault(status=429, echo_headers=True), Fault(drop=True)):
                engine.add_fault(one["session_id"], fault)
                fresh = {**prompt, "messages": [{"role": "user", "content": secrets.token_hex(4)}]}
                assert keep(http.post(chat, json=fresh, headers=agent)).status_code >= 400
            # oversized and malformed heads that carry a key
            for head in (request("POST", chat, [("authorization", f"Bearer {one['secret']}"),
                                                ("x-filler", "a" * 100_000)], b"{}"),
                         request("GET", "/admin/health", [("authorization", f"Bearer {admin_token}"),
                                                          *((f"x-{i}", "v") for i in range(200))]),
                         b"POST " + chat.encode() + b" HTTP/1.1\r\nauthorization: Bearer " + one["secret"].encode()
                         + b"\r\ncontent-length: nope\r\n\r\n"):
                out = exchange("127.0.0.1", port, head, until_closed=True)
                answers += [r.body for r in out.replies] + [out.leftover]
            # the control plane and the viewer, right and wrong
            for token in ("wrong-admin-token-0123456789", one["secret"]):
                assert keep(http.get("/admin/sessions", headers={"authorization": f"Bearer {token}"})).status_code == 401
                assert keep(http.post("/viewer/login", data={"token": token})).status_code == 401
            assert keep(http.get("/viewer/login", params={"token": admin_token})).status_code == 400
            code = http.post("/admin/viewer/codes", headers=admin).json()["code"]
            logged_in = http.get("/viewer/login", params={"code": code})
            cookie = logged_in.cookies["oeh_admin"]
            http.cookies.clear()
            viewer = {"cookie": f"oeh_admin={cookie}"}
            for path in ("/viewer/", "/admin/sessions", f"/admin/sessions/{one['session_id']}",
                         f"/admin/sessions/{one['session_id']}/records",
                         f"/admin/sessions/{one['session_id']}/training_trace",
                         f"/admin/viewer/api/sessions/{one['session_id']}/calls",
                         f"/admin/viewer/api/sessions/{one['session_id']}/calls/0/tokens?part=prompt&start=0&stop=8",
                         f"/admin/viewer/api/sessions/{one['session_id']}/assembly", "/admin/health", "/metrics"):
                assert keep(http.get(path, headers=viewer)).status_code == 200, path
            assert keep(http.get("/viewer/logout", headers=viewer)).status_code == 303
            records = http.get(f"/admin/sessions/{one['session_id']}/records", headers=admin).json()
            assert [r["metadata"]["status"] for r in records] == ["ok", "ok", "failed", "failed", "failed", "failed"]
            assert "[engine API key]" in records[2]["metadata"]["error"]["message"]  # quoted, and redacted
            for s in made:
                keep(http.post(f"/admin/sessions/{s['session_id']}/close", headers=admin))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        stdout.close()
        stderr.close()
    logs = (tmp_path / "stdout.log").read_bytes() + (tmp_path / "stderr.log").read_bytes()
    stored = store_text(store_dir)
    assert marker.encode() in stored, "the search must see what the store holds"
    assert b"Application startup complete" in logs, "the recorder's output was captured"
    emitted = {"logs": logs, "store": stored, "answers": b"\n".join(answers)}
    found: list[str] = []
    for name, secret in [("admin token", admin_token), ("engine key", engine_key), ("HF token", hf_token),
                         ("viewer code", code), ("viewer cookie", cookie),
                         *((f"session key {i}", key) for i, key in enumerate(keys))]:
        found += [f"{name} in {where}" for where, text in emitted.items() if secret.encode() in text]
    assert not found, found
    # and the agent's key never leaves the recorder: the engine saw the recorder's own key only
    sent = engine.requests(one["session_id"])
    assert sent and all(key not in str(r["headers"]) for r in sent for key in keys)
    assert all(r["headers"].get("authorization") == f"Bearer {engine_key}" for r in sent)
