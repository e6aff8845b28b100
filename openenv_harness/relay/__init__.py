"""WebSocket relay between an agent inside a remote sandbox and the trainer-side recorder.

Three parts: ``protocol`` (the framing both ends speak), ``sandbox_relay`` (a standard-library
program uploaded into the sandbox; it serves the agent on localhost) and ``dialer`` (the trainer
side: dials into the sandbox's port proxy and forwards each call to the recorder). The relay
relays; token evidence is only ever recorded on the trainer side.
"""

from __future__ import annotations

from pathlib import Path

from openenv_harness.relay.dialer import DialerStats, RelayDialer, RelayUnavailableError
from openenv_harness.relay.protocol import PROTOCOL_VERSION, RELAY_TOKEN_HEADER, RELAY_WS_PATH
from openenv_harness.relay.threaded import DialerThread

#: The files that make up the in-sandbox program, uploaded side by side; the last one is run.
SANDBOX_PROGRAM_FILES: tuple[str, ...] = (
    "protocol.py", "ws_server.py", "agent_http.py", "trainer_link.py", "sandbox_relay.py",
)


def sandbox_program_sources() -> dict[str, bytes]:
    """File name -> source of the in-sandbox relay program (standard library only)."""
    here = Path(__file__).parent
    return {name: (here / name).read_bytes() for name in SANDBOX_PROGRAM_FILES}


__all__ = [
    "PROTOCOL_VERSION",
    "RELAY_TOKEN_HEADER",
    "RELAY_WS_PATH",
    "SANDBOX_PROGRAM_FILES",
    "DialerStats",
    "DialerThread",
    "RelayDialer",
    "RelayUnavailableError",
    "sandbox_program_sources",
]
