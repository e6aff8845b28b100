"""What the harness environment's tests share: its paths, tokens, extra tasks, and server helpers.

The environment lives in ``envs/harness_env`` as the package ``harness_env`` (how its own
``pyproject.toml`` installs it); ``envs/`` goes on ``sys.path`` so tests import it the same way.
Kept out of ``conftest.py`` so test modules import it by a name unique across ``tests/``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "envs"
if str(ENVS) not in sys.path:
    sys.path.insert(0, str(ENVS))

from harness_env.server.app import build_app  # noqa: E402
from harness_env.server.backend import HarnessBackend  # noqa: E402
from harness_env.server.config import EnvServerConfig  # noqa: E402

from openenv_harness.recorder import ThreadedServer  # noqa: E402

ADMIN = "envs-admin-token-0123456789abcdef"
#: Appears in the command line of the ``slow`` task's agent tool call, so tests can find that process.
SLOW_MARKER = "harness-env-slow-7f3a"

#: Extra tasks served through ``OEH_TASKS``: one the reference model gives up on (no script), one
#: whose agent sits in a long shell command.
EXTRA_TASKS = [
    {
        "id": "give-up",
        "instruction": "Create done.txt containing the word done.",
        "files": {"test_done.py": (
            "import unittest\n\n\nclass DoneTest(unittest.TestCase):\n    def test_file(self):\n"
            "        with open('done.txt') as f:\n            self.assertEqual(f.read().strip(), 'done')\n")},
        "verify_command": "python3 -m unittest -q 2>&1",
    },
    {
        "id": "slow",
        "instruction": "Wait, then create done.txt.",
        "files": {},
        "verify_command": "test -f done.txt",
        "reference_script": [
            {"tool_calls": [{"name": "bash", "arguments": json.dumps(
                {"command": f"python3 -c 'import time; time.sleep(45)' {SLOW_MARKER}"},
                separators=(",", ":"))}]},
            {"content": "Waited."},
        ],
    },
]


def start_env_server(config: EnvServerConfig) -> ThreadedServer:
    """An environment server app on an ephemeral loopback port (its startup starts the backend)."""
    return ThreadedServer(build_app(config)).start(timeout_s=60)


def backend_of(server: ThreadedServer) -> HarnessBackend:
    return server.app.state.harness_backend
