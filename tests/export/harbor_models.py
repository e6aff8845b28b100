"""Harbor's own ATIF models, run in the venv that holds ``harbor`` (it needs Python >= 3.12; ours may be
older, and our writer must not import it): ``validate(trajectory)`` is what ``Trajectory`` made of it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

#: ``./dev setup`` puts harbor 0.25.0 in a venv of its own here
HARBOR_PYTHON = Path(__file__).resolve().parents[2] / ".cache" / "harbor" / "bin" / "python"

_VALIDATE = """
import json, sys
try:
    from harbor.models.trajectories import Trajectory
except ImportError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
trajectory = Trajectory.model_validate_json(sys.stdin.read())
print(json.dumps(trajectory.to_json_dict()))
"""


class HarborRefused(AssertionError):
    """Harbor's models refused the document; the message is pydantic's."""


def validate(trajectory: dict[str, Any]) -> dict[str, Any]:
    """The trajectory as Harbor's ``Trajectory`` reads and writes it back; ``HarborRefused`` if invalid."""
    assert HARBOR_PYTHON.is_file(), f"{HARBOR_PYTHON} is missing: run ./dev setup (it installs harbor 0.25.0)"
    done = subprocess.run([str(HARBOR_PYTHON), "-c", _VALIDATE], input=json.dumps(trajectory), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 3, f"harbor is not importable in {HARBOR_PYTHON}: {done.stderr} (run ./dev setup)"
    if done.returncode != 0:
        raise HarborRefused(done.stderr[-3000:])
    return json.loads(done.stdout)
