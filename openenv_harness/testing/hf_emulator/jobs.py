"""The emulated Jobs API (whoami, create, inspect, list, cancel) and its state.

A created job does not run the bootstrap command: its in-job server is the emulator itself,
reachable at the ``exposeUrls`` entry (``http://127.0.0.1:<port>/_job/<id>--49983.emu``), which
contains ``--49983.`` as the client expects. The sandbox token comes from the POSTed
``SBX_TOKEN`` secret and is enforced, like the HF bearer.
"""

from __future__ import annotations

import datetime
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openenv_harness.testing.hf_emulator.processes import ProcessTable
from openenv_harness.testing.hf_emulator.wire import HttpFailure, Request, json_response

SERVER_PORT = 49983
JOB_PREFIX = "/_job/"
JOB_SUFFIX = f"--{SERVER_PORT}.emu"
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")


@dataclass
class EmulatedSandbox:
    """One sandbox: a home directory, an environment and its processes."""

    local_id: str | None
    token: str
    home: Path
    env: dict[str, str]
    processes: ProcessTable = field(default_factory=ProcessTable)

    @property
    def pooled(self) -> bool:
        return self.local_id is not None

    @property
    def proxy_dir(self) -> Path:
        return self.home / ".sbx" / "proxy"

    def resolve(self, shown: str) -> Path:
        """A client path as a local path: pooled paths are rooted at the home, dedicated ones
        are absolute (relative ones are taken from the home)."""
        if self.pooled:
            parts = [p for p in shown.split("/") if p not in ("", ".")]
            if ".." in parts:
                raise HttpFailure(400, "paths may not contain '..'")
            return self.home.joinpath(*parts)
        return Path(shown) if shown.startswith("/") else self.home / shown

    def working_directory(self, cwd: str | None) -> Path:
        """A command's cwd: a real path (only the files API roots pooled paths at the home)."""
        if not cwd:
            return self.home
        return Path(cwd) if cwd.startswith("/") else self.home / cwd

    def process_env(self, extra: dict[str, Any] | None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "SBX_PROXY_DIR": str(self.proxy_dir),
        }
        env.update(self.env)
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        return env


@dataclass
class EmulatedJob:
    """One job: a dedicated sandbox, or a pool host carrying many."""

    id: str
    owner: str
    owner_id: str
    spec: dict[str, Any]
    expose_url: str
    sandbox_token: str
    root: Path
    stage: str = "RUNNING"
    created_at: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
    sandboxes: dict[str, EmulatedSandbox] = field(default_factory=dict)

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.spec.get("environment") or {})

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.spec.get("labels") or {})

    @property
    def host_mode(self) -> bool:
        return self.environment.get("SBX_HOST_MODE") == "1"

    @property
    def capacity(self) -> int:
        return int(self.environment.get("SBX_CAPACITY", "50"))

    def info(self) -> dict[str, Any]:
        image = self.spec.get("dockerImage")
        return {
            "id": self.id,
            "createdAt": self.created_at,
            "dockerImage": image,
            "spaceId": self.spec.get("spaceId"),
            "command": self.spec.get("command"),
            "arguments": self.spec.get("arguments", []),
            "environment": self.environment,
            "secrets": sorted((self.spec.get("secrets") or {}).keys()),  # names only, never values
            "flavor": self.spec.get("flavor"),
            "labels": self.labels,
            "status": {"stage": self.stage, "message": None, "exposeUrls": [self.expose_url]},
            "owner": {"id": self.owner_id, "name": self.owner, "type": "user"},
            "initiator": {"type": "user", "id": self.owner_id, "name": self.owner},
            "expose": self.spec.get("expose") or {"ports": [SERVER_PORT], "portsPublic": []},
        }

    def stop(self, stage: str = "CANCELED") -> None:
        for sandbox in self.sandboxes.values():
            sandbox.processes.kill_all()
        self.stage = stage


class JobsApi:
    """``/api/*`` routes over a shared job table."""

    def __init__(self, *, user: str, user_id: str, root: Path, base_url: str) -> None:
        self.user = user
        self.user_id = user_id
        self.root = root
        self.base_url = base_url
        self.jobs: dict[str, EmulatedJob] = {}

    async def handle(self, request: Request) -> bytes:
        parts = [p for p in request.path.split("/") if p][1:]  # drop "api"
        if parts == ["whoami-v2"] and request.method == "GET":
            return json_response(200, {"type": "user", "name": self.user, "id": self.user_id, "orgs": []})
        if not parts or parts[0] != "jobs" or len(parts) < 2:
            raise HttpFailure(404, f"no route {request.method} {request.path}")
        if parts[1] != self.user:
            raise HttpFailure(403, f"no access to namespace {parts[1]!r}")
        if len(parts) == 2 and request.method == "POST":
            return json_response(200, self._create(await request.json()).info())
        if len(parts) == 2 and request.method == "GET":
            return json_response(200, [job.info() for job in self._matching(request)])
        job = self.jobs.get(parts[2]) if len(parts) >= 3 else None
        if job is None:
            raise HttpFailure(404, "job not found")
        if len(parts) == 3 and request.method == "GET":
            return json_response(200, job.info())
        if parts[3:] == ["cancel"] and request.method == "POST":
            if job.stage not in TERMINAL:
                job.stop()
            return json_response(200, {})
        raise HttpFailure(404, f"no route {request.method} {request.path}")

    def _create(self, spec: Any) -> EmulatedJob:
        if not isinstance(spec, dict) or not isinstance(spec.get("command"), list):
            raise HttpFailure(400, "a job spec needs a command list")
        token = (spec.get("secrets") or {}).get("SBX_TOKEN")
        if not token:
            raise HttpFailure(400, "a sandbox job needs the SBX_TOKEN secret")
        job_id = secrets.token_hex(12)
        job = EmulatedJob(
            id=job_id, owner=self.user, owner_id=self.user_id, spec=spec,
            expose_url=f"{self.base_url}{JOB_PREFIX}{job_id}{JOB_SUFFIX}", sandbox_token=token,
            root=self.root / job_id,
        )
        if not job.host_mode:
            env = {k: str(v) for k, v in job.environment.items() if not k.startswith("SBX_")}
            env.update({k: str(v) for k, v in (spec.get("secrets") or {}).items() if k != "SBX_TOKEN"})
            home = job.root / "home"
            home.mkdir(parents=True)
            job.sandboxes[""] = EmulatedSandbox(local_id=None, token=token, home=home, env=env)
        self.jobs[job_id] = job
        return job

    def _matching(self, request: Request) -> list[EmulatedJob]:
        stages = set(request.query.get("stage", []))
        wanted = [tuple(label.split("=", 1)) for label in request.query.get("label", []) if "=" in label]
        return [
            job for job in self.jobs.values()
            if (not stages or job.stage in stages) and all(job.labels.get(k) == v for k, v in wanted)
        ]
