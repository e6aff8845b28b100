"""Run vllm-router (the vLLM project's Rust router, PyPI ``vllm-router``) in front of engine replicas.

Why this module: the recorder does not balance load; with several vLLM replicas it talks to one
router, and the router's ``consistent_hash`` policy keeps every call of a trajectory on one replica
(its prefix cache) by hashing the ``X-Session-ID`` header the recorder sends. What we rely on, as
measured on vllm-router 0.1.17 (``tests/scale/test_router.py``):

- launch: ``vllm-router --host H --port P --worker-urls URL... --policy consistent_hash``; it waits
  for each worker's ``/health`` before serving; ``GET /health`` answers 200 once all are healthy;
- ``GET /list_workers`` -> ``{"urls": [...]}`` (and ``GET /workers`` with health and load);
- it forwards ``/v1/chat/completions`` (streamed or not), ``/v1/completions``, ``/tokenize``,
  ``/v1/chat/completions/render``, ``/inference/v1/generate`` and ``/v1/chat/completions/derender``
  with every token field of the reply intact, and passes other request headers on;
- it re-serializes a chat body with its own defaults filled in (``stream``, ``skip_special_tokens``,
  ``include_reasoning``, ``ignore_eos`` ..., vLLM's defaults), drops no field;
- ``POST /pause`` and ``/resume`` reach ONE replica, never all: the recorder's fence pauses each
  replica itself (``recorder/replicas.py``);
- no reply header names the replica that served a call;
- its Prometheus exporter takes port 29000 unless ``--prometheus-port`` says otherwise (so two
  routers on one host collide): each router started here gets a free port for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from openenv_harness.recorder.serving import free_port

#: The pinned release this module was checked against (the ``scale`` extra installs it).
VLLM_ROUTER_VERSION = "0.1.17"


def router_binary() -> str:
    """The ``vllm-router`` launcher of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError(f"vllm-router is not installed: pip install 'openenv-harness[scale]' "
                                f"(vllm-router=={VLLM_ROUTER_VERSION})")
    return found


class VLLMRouter:
    """One vllm-router process on loopback; a context manager, or ``start()``/``stop()``."""

    def __init__(self, worker_urls: list[str], *, policy: str = "consistent_hash", host: str = "127.0.0.1",
                 port: int | None = None, log_path: Path | None = None, extra_args: list[str] | None = None) -> None:
        if not worker_urls:
            raise ValueError("a router needs at least one worker URL")
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        # its metrics exporter listens on a fixed port (29000) unless told otherwise: a second router on
        # the host would exit at start ("Address already in use"), so each gets a free one of its own
        metrics = [] if "--prometheus-port" in self.extra_args else ["--prometheus-port", str(free_port(self.host))]
        return [router_binary(), "--host", self.host, "--port", str(self.port), "--worker-urls", *self.worker_urls,
                "--policy", self.policy, "--log-level", "info", *metrics, *self.extra_args]

    def start(self, timeout_s: float = 60.0) -> "VLLMRouter":
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 -- the child owns it
        env = {**os.environ, "NO_COLOR": "1"}
        self._proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env)
        if self.log_path:
            out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self._proc.returncode} while starting "
                                   f"(log: {self.log_path or 'not kept'})")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"vllm-router did not become healthy in {timeout_s:g}s")
            time.sleep(0.1)

    def workers(self) -> list[str]:
        """The router's worker list (``GET /list_workers``)."""
        reply = httpx.get(self.url + "/list_workers", timeout=10.0)
        reply.raise_for_status()
        return list(reply.json()["urls"])

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._proc = None

    def __enter__(self) -> "VLLMRouter":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
