"""``HFSandbox`` on the real ``huggingface_hub`` client, against the local HF emulator.

Nothing on the client side is faked: ``huggingface_hub.Sandbox`` / ``SandboxPool`` talk HTTP to
``HFEmulator`` (a test double of the Jobs API and the in-job server, whose commands really run
here), the relay really runs as a process "inside" the sandbox, and the trainer side really dials
in through ``proxy_url_for(..., scheme="ws://")`` with ``proxy_headers``.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from openenv_harness.relay import DialerThread, RelayDialer, sandbox_program_sources
from openenv_harness.sandbox.base import SandboxError
from openenv_harness.sandbox.hf import HFSandbox, rebase_url
from openenv_harness.testing.engine import EngineConfig, EngineServer
from openenv_harness.testing.hf_emulator import HFEmulator, hub_pointed_at

STREAMING_CLIENT = textwrap.dedent(
    """
    import json, os, sys, time, urllib.request
    body = {"model": "reference-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as reply:
        print(json.dumps({"status": reply.status, "type": reply.headers["content-type"]}), flush=True)
        for line in reply:
            if line.strip():
                print(json.dumps({"t": time.monotonic() - started, "line": line.decode().strip()}), flush=True)
    """
)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[HFEmulator]:
    # The emulator's own short temporary root: unix socket paths are limited to 108 bytes.
    with HFEmulator() as emulator, hub_pointed_at(emulator, tmp_path / "hf-home"):
        yield emulator


@pytest.fixture
def sandbox(emulator: HFEmulator) -> Iterator[HFSandbox]:
    with HFSandbox(ws_scheme="ws://", relay_connect_timeout_s=10) as sandbox:
        yield sandbox


@pytest.fixture
def engine() -> Iterator[EngineServer]:
    with EngineServer(EngineConfig(decode_delay_s=0.12)) as engine:  # ~0.5 s of tokens per reply
        yield engine


def test_commands_files_and_layout(sandbox: HFSandbox, emulator: HFEmulator) -> None:
    job = emulator.job(sandbox.hub.id)
    assert job.labels["openenv-harness"] == "1" and job.labels["hf-sandbox"] == "1"
    result = sandbox.run("echo $GREETING; pwd; echo $HOME; echo oops >&2; exit 3", env={"GREETING": "hello"})
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout.splitlines() == ["hello", sandbox.workdir, sandbox.home]
    assert result.stderr == "oops\n"
    assert sandbox.run(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc").stdout == "cba\n"
    slow = sandbox.run("sleep 5", timeout_s=0.3)
    assert slow.timed_out and slow.exit_code is None and slow.duration_s < 3

    sandbox.write_file("task/notes.txt", "ünïcode", mode=0o600)
    assert sandbox.read_file(f"{sandbox.workdir}/task/notes.txt").decode() == "ünïcode"
    assert sandbox.run("stat -c %a task/notes.txt").stdout.strip() == "600"
    big = bytes(range(256)) * 12_000  # over the client's 2 MiB threshold: parallel ranged transfer
    sandbox.write_file("big.bin", big)
    assert sandbox.read_file("big.bin") == big
    with pytest.raises(SandboxError, match="cannot read 'missing.txt'"):
        sandbox.read_file("missing.txt")


def test_background_processes_write_output_files_and_can_be_killed(sandbox: HFSandbox) -> None:
    done = sandbox.start("read line; echo got:$line; echo err >&2; exit 5", stdin="ping\n", name="agent")
    assert done.wait(timeout_s=10) == 5
    assert sandbox.read_file(done.stdout_path) == b"got:ping\n"
    assert sandbox.read_file(done.stderr_path) == b"err\n"
    assert done.stdout_path.startswith(sandbox.logs_dir + "/agent-")

    running = sandbox.start(["sleep", "30"], name="sleeper")
    assert running.poll() is None
    assert running.wait(timeout_s=0.2) is None
    running.kill()
    assert running.wait(timeout_s=5) == -9


def test_an_agent_inside_streams_a_chat_completion_from_the_trainer_side_engine(
    sandbox: HFSandbox, emulator: HFEmulator, engine: EngineServer
) -> None:
    endpoint = sandbox.model_endpoint(f"{engine.url}/v1", "sk-rollout-secret-1")
    assert endpoint.base_url.startswith("http://127.0.0.1:") and endpoint.base_url.endswith("/v1")
    assert endpoint.api_key == "sk-rollout-secret-1"

    sandbox.write_file("client.py", STREAMING_CLIENT)
    result = sandbox.run(["python3", "client.py"], timeout_s=60,
                         env={"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.api_key})
    assert result.exit_code == 0, result.stderr
    head, *events = [json.loads(line) for line in result.stdout.splitlines()]
    assert head["status"] == 200 and head["type"].startswith("text/event-stream")
    assert events[-1]["line"] == "data: [DONE]"
    content = "".join(
        choice["delta"].get("content") or ""
        for event in events[:-1]
        for choice in json.loads(event["line"][len("data: "):])["choices"]
    )
    assert content, "the engine's tokens arrived"
    spread = events[-1]["t"] - events[0]["t"]
    assert len(events) >= 4 and spread > 0.3, f"the stream arrived all at once ({spread:.3f}s): something buffered it"

    job_metadata = json.dumps(emulator.job(sandbox.hub.id).info())
    assert "sk-rollout-secret-1" not in job_metadata, "the rollout key must never be job metadata"
    dialer = sandbox.relay_dialer
    assert dialer is not None
    deadline = time.monotonic() + 10  # the dialer counts a call just after its last send
    while dialer.stats.calls_completed != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dialer.stats.calls_completed == 1


def test_the_proxy_path_needs_hf_sandbox_and_relay_credentials(sandbox: HFSandbox, engine: EngineServer) -> None:
    sandbox.model_endpoint(f"{engine.url}/v1", "sk-x")
    relay_procs = [p for p in sandbox.hub.processes() if "sandbox_relay.py" in str(p.cmd)]
    assert len(relay_procs) == 1 and relay_procs[0].running, "the relay is a tracked background process"
    ready = json.loads(sandbox.read_file(f"{sandbox.root}/relay/relay.stdout").splitlines()[0])
    url = sandbox.hub.proxy_url_for(ready["ws_port"], "/relay", scheme="ws://")
    assert url.startswith("ws://127.0.0.1:") and url.endswith(f"/v1/proxy/{ready['ws_port']}/relay")
    good = sandbox.hub.proxy_headers
    cases = [
        ({"X-Sandbox-Token": good["X-Sandbox-Token"]}, 401),  # no HF bearer: the jobs proxy refuses
        ({"Authorization": good["Authorization"]}, 403),  # no sandbox token: the sandbox server refuses
        (good, 401),  # both, but no relay token: the relay itself refuses
    ]
    for headers, status in cases:
        with pytest.raises(InvalidStatus) as info:
            connect(url, additional_headers=headers, open_timeout=5).close()
        assert info.value.response.status_code == status, headers


def test_one_relay_serves_later_sessions_of_the_same_recorder(sandbox: HFSandbox, engine: EngineServer) -> None:
    first = sandbox.model_endpoint(f"{engine.url}/rollout/a/v1", "k1")
    second = sandbox.model_endpoint(f"{engine.url}/rollout/b/v1", "k2")
    assert first.base_url.rsplit(":", 1)[1].split("/")[0] == second.base_url.rsplit(":", 1)[1].split("/")[0]
    assert second.base_url.endswith("/rollout/b/v1")
    assert len([p for p in sandbox.hub.processes() if "sandbox_relay.py" in str(p.cmd)]) == 1
    with pytest.raises(SandboxError, match="already relays to"):
        sandbox.model_endpoint("http://127.0.0.1:1/v1", "k3")


def test_close_kills_the_job_its_processes_and_the_dialer(emulator: HFEmulator, engine: EngineServer) -> None:
    sandbox = HFSandbox(ws_scheme="ws://")
    sandbox.start_sandbox()
    sandbox.model_endpoint(f"{engine.url}/v1", "k")
    agent = sandbox.start("sleep 60")
    assert agent.poll() is None
    job = emulator.job(sandbox.hub.id)
    processes = [entry.process for entry in job.sandboxes[""].processes.background.values()]
    assert len(processes) == 2 and any(t.name.startswith("relay-dialer") for t in threading.enumerate())
    sandbox.close()
    assert job.stage == "CANCELED"
    deadline = time.monotonic() + 5
    while any(p.returncode is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.returncode is not None for p in processes), "relay and agent processes are gone"
    assert not any(t.name.startswith("relay-dialer") for t in threading.enumerate())
    sandbox.close()  # twice is fine
    with pytest.raises(SandboxError, match="closed"):
        sandbox.start_sandbox()


def test_a_relay_that_cannot_start_is_reported_with_its_stderr(emulator: HFEmulator) -> None:
    with HFSandbox(ws_scheme="ws://", python="python-that-does-not-exist") as sandbox:
        with pytest.raises(SandboxError, match="relay .* exited .*python-that-does-not-exist"):
            sandbox.model_endpoint("http://127.0.0.1:8000/v1", "k")


def test_a_relay_the_trainer_cannot_reach_is_torn_down(emulator: HFEmulator) -> None:
    # "wss://" against the plain-HTTP emulator: every connect attempt fails its TLS handshake.
    with HFSandbox(ws_scheme="wss://", relay_connect_timeout_s=1.0) as sandbox:
        with pytest.raises(SandboxError, match="did not accept the trainer's connection"):
            sandbox.model_endpoint("http://127.0.0.1:8000/v1", "k")
        assert sandbox.relay_dialer is None
        assert not any(t.name.startswith("relay-dialer") for t in threading.enumerate())
        deadline = time.monotonic() + 5  # a kill is asynchronous: the listing catches up once reaped
        while any(p.running for p in sandbox.hub.processes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(p.running for p in sandbox.hub.processes()), "the relay process was stopped"


def test_dial_out_mode_returns_the_tunnel_url_and_runs_no_relay(emulator: HFEmulator) -> None:
    with HFSandbox(dial_out_url="https://tunnel.example.org/base") as sandbox:
        endpoint = sandbox.model_endpoint("http://10.0.0.5:8123/rollout/s1/v1", "k")
        assert endpoint.base_url == "https://tunnel.example.org/base/rollout/s1/v1"
        assert sandbox.hub.processes() == [] and sandbox.relay_dialer is None


def test_pooled_sandboxes_run_commands_but_refuse_a_localhost_relay(emulator: HFEmulator) -> None:
    from huggingface_hub import SandboxPool

    pool = SandboxPool(image="python:3.12", sandboxes_per_host=2, warm_up=1)
    try:
        with HFSandbox(pool=pool) as sandbox:
            assert "." in sandbox.hub.id, "a pooled id is <host job>.<local id>"
            sandbox.write_file("hello.txt", "from the pool")
            assert sandbox.run("cat hello.txt").stdout == "from the pool"
            process = sandbox.start("echo pooled", name="agent")
            assert process.wait(10) == 0 and sandbox.read_file(process.stdout_path) == b"pooled\n"
            with pytest.raises(SandboxError, match="cannot bind any TCP port"):
                sandbox.model_endpoint("http://127.0.0.1:8000/v1", "k")
            with pytest.raises(SandboxError, match="only write under their home"):
                sandbox.write_file("/etc/elsewhere", "x")
        with HFSandbox(pool=pool, dial_out_url="https://tunnel.example.org") as sandbox:
            assert sandbox.model_endpoint("http://127.0.0.1:8000/v1", "k").base_url == "https://tunnel.example.org/v1"
    finally:
        pool.close()


def test_in_a_pool_the_relay_runs_on_unix_sockets_only(emulator: HFEmulator, engine: EngineServer) -> None:
    """Where TCP bind is denied the relay still works: the trainer side arrives through the port
    proxy at ``$SBX_PROXY_DIR/<port>.sock`` and the agent side is a unix socket too (which is why
    ``HFSandbox`` refuses relay mode in pools: agents expect a TCP base URL)."""
    from huggingface_hub import SandboxPool

    pool = SandboxPool(image="python:3.12", sandboxes_per_host=2, warm_up=1)
    try:
        hub = pool.create()
        for name, source in sandbox_program_sources().items():
            hub.files.write(f"/relay/{name}", source)
        hub.run('exec python3 "$HOME/relay/sandbox_relay.py" --http-unix "$HOME/agent.sock" '
                '--ws-unix "$SBX_PROXY_DIR/9000.sock" >"$HOME/relay.out" 2>"$HOME/relay.err"', background=True)
        deadline = time.monotonic() + 10
        while not hub.files.exists("/relay.out") or not hub.files.read("/relay.out"):
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.05)
        assert json.loads(hub.files.read("/relay.out"))["ws_port"] is None, "no TCP listener at all"
        runner = DialerThread(lambda: RelayDialer(
            lambda: hub.proxy_url_for(9000, "/relay", scheme="ws://"), lambda: hub.proxy_headers, engine.url))
        with runner:
            runner.wait_connected(10)
            body = json.dumps({"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]})
            result = hub.run(["curl", "-sS", "--unix-socket", f"{hub.run('printf %s $HOME').stdout}/agent.sock",
                              "-H", "Content-Type: application/json", "-d", body,
                              "http://localhost/v1/chat/completions"], check=False)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["choices"][0]["message"]["role"] == "assistant"
        hub.kill()
    finally:
        pool.close()


def test_an_unreachable_endpoint_is_a_sandbox_error(tmp_path: Path) -> None:
    emulator = HFEmulator().start()
    emulator.stop()  # its port is closed now: every request fails to connect
    with hub_pointed_at(emulator, tmp_path / "hf-home"):
        with pytest.raises(SandboxError, match="cannot create a sandbox"):
            HFSandbox(namespace="emu-user").start_sandbox()


def test_using_a_sandbox_before_it_starts_is_a_clear_error() -> None:
    sandbox = HFSandbox()
    with pytest.raises(SandboxError, match="not started"):
        sandbox.run("true")
    with pytest.raises(SandboxError, match="not started"):
        _ = sandbox.workdir


def test_rebase_url_keeps_the_path_and_swaps_the_origin() -> None:
    assert rebase_url("http://10.0.0.5:8000/rollout/s/v1", "http://127.0.0.1:9") == "http://127.0.0.1:9/rollout/s/v1"
    assert rebase_url("http://h:1/v1?x=1", "https://t.example/p/") == "https://t.example/p/v1?x=1"
    with pytest.raises(SandboxError, match="absolute URLs"):
        rebase_url("/v1", "http://127.0.0.1:9")
