"""``python -m openenv_harness.recorder`` hands every setting to the recorder: each flag reaches the
``RecorderConfig`` that ``serve`` runs (``tests/cli/test_serve.py`` checks ``openenv-harness serve``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openenv_harness.recorder import RecorderConfig

FLAGS = ["--keep-alive-s", "12", "--backlog", "99", "--prompt-cache-mb", "3", "--store-backlog-mb", "5",
         "--admin-port", "8799", "--admin-nice", "-3"]
EXPECTED = {"keep_alive_timeout_s": 12.0, "listen_backlog": 99, "prompt_cache_mb": 3.0, "store_backlog_mb": 5.0,
            "admin_port": 8799, "admin_nice": -3}


def _capture(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[RecorderConfig]:
    seen: list[RecorderConfig] = []
    monkeypatch.setattr(module, "serve", lambda config, **kw: seen.append(config))
    return seen


def test_the_module_entry_point_passes_each_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import openenv_harness.recorder.__main__ as entry

    seen = _capture(monkeypatch, entry)
    entry.main(["--store", str(tmp_path / "r.db"), "--admin-token", "t" * 32, *FLAGS])
    (config,) = seen
    assert {k: getattr(config, k) for k in EXPECTED} == EXPECTED


def test_a_bad_value_is_refused_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import openenv_harness.recorder.__main__ as entry

    seen = _capture(monkeypatch, entry)
    with pytest.raises(Exception, match="store_backlog_mb"):
        entry.main(["--store", str(tmp_path / "r.db"), "--admin-token", "t" * 32, "--store-backlog-mb", "0"])
    assert seen == []
