"""``train-demo --engine-url`` gives the user's engine back on its base weights whatever the run did:
the command's own code, stack, recorder, sync and reference engine run for real over loopback; only
the loop's training parts are replaced (``TrainLoop.run``: real agent rollouts and a GRPO step need
the real tier, ``tests/real_engine/test_real_train_loop.py``) by a run that syncs a trained folder
into the engine through the fence and then fails, or succeeds."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.cli.app import main
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault
from openenv_harness.trainer.grpo import StepReport
from openenv_harness.trainer.train_loop import LoopReport, RolloutSummary, TrainLoop
from openenv_harness.trainer.limits import DeltaStats

MODEL = "reference-model"


def _weights(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0")
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return _weights(tmp_path / "base-model")


@pytest.fixture
def engine(base: Path) -> Iterator[EngineServer]:
    with EngineServer(EngineConfig(weights_dir=base)) as server:
        yield server


def _trained_run(*, fails: bool, then: Callable[[], None] = lambda: None) -> Callable[[TrainLoop], LoopReport]:
    """A run that syncs a trained folder into the engine through the loop's own sync, then fails or
    returns a report of the loop proven (the sync's report is the real one)."""

    def run(loop: TrainLoop) -> LoopReport:
        loop.sync.check()
        sync = loop.sync.sync(_weights(loop.settings.workdir / "policy-v1"), version_before=0)
        then()
        if fails:
            raise RuntimeError("the rollouts after the sync failed")
        stats = DeltaStats(tokens=10, delta_max=0.05, delta_mean=0.01, mean_log_ratio=0.0)
        summary = RolloutSummary("s", 0, [0], 0.0, 0.3, 1, 10, 1, 10, True)
        return LoopReport({}, 0, 1, [summary], StepReport(2, 20, [1.0, -1.0], 0.1, 1.0, 0.9, 1.1, 1.0, 0, 100, 1e-4),
                          sync, [RolloutSummary("t", 1, [1], 0.0, 0.3, 1, 10, 1, 10, True)], stats, stats,
                          DeltaStats(tokens=10, delta_max=1.0, delta_mean=0.4, mean_log_ratio=-0.3, kl_k3=0.3))

    return run


def _train_demo(engine: EngineServer, base: Path, out: Path, *extra: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(["train-demo", "--engine-url", engine.url, "--model", MODEL, "--model-dir", str(base), "--out", str(out),
              *extra])
        raise SystemExit(0)
    return int(exited.value.code or 0)


def test_a_run_that_fails_after_its_sync_still_gives_the_base_weights_back(
        engine: EngineServer, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setattr(TrainLoop, "run", _trained_run(fails=True))
    assert _train_demo(engine, base, tmp_path / "run") == 2
    out, err = capsys.readouterr()
    assert "the rollouts after the sync failed" in err
    assert "base weights were loaded back (version 2)" in out
    info = engine.info()
    assert (info["weights_path"], info["weight_reloads"], info["paused"]) == (str(base.resolve()), 2, False)


def test_a_restore_that_fails_is_loud_and_the_exit_is_non_zero(
        engine: EngineServer, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # the run succeeds; the restore's reload of the base folder answers 500 and is rolled back to the trained one
    fail_restore = lambda: engine.add_fault("*", Fault(route="/collective_rpc", status=500))  # noqa: E731
    monkeypatch.setattr(TrainLoop, "run", _trained_run(fails=False, then=fail_restore))
    assert _train_demo(engine, base, tmp_path / "run") == 1
    out, err = capsys.readouterr()
    assert "loop closed" in out  # the loop itself was proven ...
    assert "the engine's base weights were NOT loaded back" in err  # ... and the engine was not given back
    assert "SyncRolledBack" in err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "NOT loaded back" in report["restore_error"]
    # a defined state all the same: the trained folder it loaded in full, fence open at the version it had
    info = engine.info()
    assert (info["weights_path"], info["paused"]) == (str(tmp_path / "run" / "policy-v1"), False)


def test_keep_weights_leaves_the_trained_weights_in_the_engine(
        engine: EngineServer, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TrainLoop, "run", _trained_run(fails=True))
    assert _train_demo(engine, base, tmp_path / "run", "--keep-weights") == 2
    assert engine.info()["weights_path"] == str(tmp_path / "run" / "policy-v1")


def test_a_sync_that_left_the_fence_closed_is_recovered_before_the_run_ends(
        engine: EngineServer, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    engine.add_fault("*", Fault(route="/collective_rpc", status=500, count=2))  # the reload, then the rollback's
    monkeypatch.setattr(TrainLoop, "run", _trained_run(fails=False))
    assert _train_demo(engine, base, tmp_path / "run") == 2
    out, err = capsys.readouterr()
    assert "The fence is left closed" in err
    assert "the engine holds its base weights" in out and "nothing trained was left in it" in out
    info = engine.info()
    assert (info["weights_path"], info["paused"]) == (str(base.resolve()), False)


def test_a_temperature_the_engines_logprobs_do_not_follow_is_refused_before_any_rollout(
        base: Path, tmp_path: Path, capsys: Any) -> None:
    """At temperature 0.7 a raw engine's logprobs are another policy's: one line saying so, no rollout run
    (the loop's own tests show a processed engine passing the same check)."""
    with EngineServer(EngineConfig(weights_dir=base, logprobs_mode="raw_logprobs")) as engine:
        code = _train_demo(engine, base, tmp_path / "run", "--temperature", "0.7", "--group", "2")
        sessions = [r for r in engine.requests() if r.get("session")]
    err = capsys.readouterr().err
    assert code == 2
    assert "raw (before temperature)" in err and "processed_logprobs" in err, err
    assert sessions == [], "no rollout starts on a policy the trainer cannot reproduce"
