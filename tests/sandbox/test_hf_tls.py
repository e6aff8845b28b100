"""``HFSandbox`` over TLS: HTTPS to the Jobs API and the in-job server, WSS through the port proxy.

huggingface.co and its jobs proxy only speak TLS, and ``HFSandbox`` dials ``wss://`` by default, so
these run the same path as production against an emulator that serves TLS with a certificate from a
local test CA (``trustme``). Both clients -- ``huggingface_hub``'s and the relay dialer -- trust what
Python's default context trusts, ``SSL_CERT_FILE`` included, and nothing else.
"""

from __future__ import annotations

import json
import ssl
import textwrap
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
import trustme

from openenv_harness.sandbox.base import SandboxError
from openenv_harness.sandbox.hf import HFSandbox
from openenv_harness.testing.engine import EngineConfig, EngineServer
from openenv_harness.testing.hf_emulator import HFEmulator, hub_pointed_at

CLIENT = textwrap.dedent(
    """
    import json, os, urllib.request
    body = {"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        print(json.dumps({"status": reply.status, "body": json.loads(reply.read())}))
    """
)


def _trust(monkeypatch: pytest.MonkeyPatch, ca: trustme.CA, path: Path) -> None:
    ca.cert_pem.write_to_path(str(path))
    monkeypatch.setenv("SSL_CERT_FILE", str(path))


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_emulator(tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch) -> Iterator[HFEmulator]:
    _trust(monkeypatch, ca, tmp_path / "ca.pem")
    # huggingface_hub keeps one HTTP client per process: one made before SSL_CERT_FILE was set would
    # not trust the test CA (and ours must not outlive this test)
    huggingface_hub.close_session()
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_side)
    try:
        with HFEmulator(tls=server_side) as emulator, hub_pointed_at(emulator, tmp_path / "hf-home"):
            yield emulator
    finally:
        huggingface_hub.close_session()


@pytest.fixture
def engine() -> Iterator[EngineServer]:
    with EngineServer(EngineConfig()) as engine:
        yield engine


def test_commands_and_the_relay_run_over_https_and_wss(tls_emulator: HFEmulator, engine: EngineServer) -> None:
    assert tls_emulator.url.startswith("https://")
    with HFSandbox(relay_connect_timeout_s=10) as sandbox:
        assert sandbox.ws_scheme == "wss://"  # the default
        assert sandbox.run("echo over-tls").stdout == "over-tls\n"  # the Jobs API and exec, over TLS
        endpoint = sandbox.model_endpoint(f"{engine.url}/v1", "sk-tls")
        sandbox.write_file("client.py", CLIENT)
        result = sandbox.run(["python3", "client.py"], timeout_s=60,
                             env={"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.api_key})
        assert result.exit_code == 0, result.stderr
        reply = json.loads(result.stdout)
        assert reply["status"] == 200
        assert reply["body"]["choices"][0]["message"]["content"], "the engine's answer came back through the relay"
        dialer = sandbox.relay_dialer
        assert dialer is not None and dialer.stats.connects >= 1 and dialer.stats.calls_started == 1


def test_the_dialer_refuses_a_certificate_it_does_not_trust(
    tls_emulator: HFEmulator, engine: EngineServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HFSandbox(relay_connect_timeout_s=1.5) as sandbox:
        sandbox.run("true")  # huggingface_hub's client is made now, trusting the emulator's CA
        # From here on only another CA is trusted: the dialer builds its TLS context at each connect
        _trust(monkeypatch, trustme.CA(), tmp_path / "other-ca.pem")
        with pytest.raises(SandboxError, match="did not accept the trainer's connection") as info:
            sandbox.model_endpoint(f"{engine.url}/v1", "sk-tls")
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value) or "certificate verify failed" in str(info.value)
        assert sandbox.relay_dialer is None
