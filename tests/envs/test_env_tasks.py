"""The environment's task set: lookups, seeded choice, the ``OEH_TASKS`` file, and the added task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_env.server.tasks import (
    DEFAULT_TASKS,
    FIX_RANGE_SUM,
    TaskFileError,
    TaskSet,
    UnknownTaskError,
    load_tasks_file,
    server_tasks,
)

from openenv_harness.rollout import BUILTIN_TASKS
from openenv_harness.sandbox.local import LocalSandbox

EXTRA = {"id": "extra", "instruction": "Do it.", "verify_command": "true"}


def test_default_tasks_are_the_builtin_ones_plus_fix_range_sum() -> None:
    assert list(DEFAULT_TASKS) == [*BUILTIN_TASKS, "fix-range-sum"]
    tasks = server_tasks(None)
    assert tasks.ids == list(DEFAULT_TASKS)


def test_lookups_and_seeded_choice() -> None:
    tasks = server_tasks(None)
    assert tasks.get("fix-add").id == "fix-add"
    with pytest.raises(UnknownTaskError, match="unknown task 'fix_add'; known tasks: fix-add, fix-wordcount"):
        tasks.get("fix_add")
    n = len(tasks.ids)
    assert [tasks.choose(s).id for s in range(n)] == tasks.ids
    assert tasks.choose(n + 2).id == tasks.ids[2]  # stable: seed % n
    assert tasks.choose(None).id in tasks.ids
    assert tasks.resolve(task_id=None, split="train", index=1, seed=None).id == tasks.ids[1]
    assert tasks.resolve(task_id=None, split=None, index=None, seed=3).id == tasks.ids[3]
    with pytest.raises(ValueError, match="split needs an index"):
        tasks.resolve(task_id=None, split="train", index=None, seed=None)
    with pytest.raises(IndexError):
        tasks.at("train", n)


@pytest.mark.parametrize("form", ["list", "object", "jsonl", "single"])
def test_tasks_file_forms(tmp_path: Path, form: str) -> None:
    second = {**EXTRA, "id": "extra-2"}
    text = {
        "list": json.dumps([EXTRA, second]),
        "object": json.dumps({"tasks": [EXTRA, second]}),
        "jsonl": json.dumps(EXTRA) + "\n\n" + json.dumps(second) + "\n",
        "single": json.dumps(EXTRA),
    }[form]
    path = tmp_path / "tasks.json"
    path.write_text(text)
    loaded = [t.id for t in load_tasks_file(path)]
    assert loaded == (["extra"] if form == "single" else ["extra", "extra-2"])
    assert server_tasks(str(path)).ids[-len(loaded):] == loaded


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "neither JSON nor JSON Lines"),
    ('"a string"', "must hold a list of tasks"),
    (json.dumps([{"id": "x"}]), r"task #0 .* is invalid: instruction: Field required"),
    (json.dumps([{**EXTRA, "colour": "red"}]), r"colour: Extra inputs are not permitted"),
    (json.dumps([{**EXTRA, "id": "fix-add"}]), "task id 'fix-add' is defined twice"),
])
def test_bad_tasks_files_are_explained(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(text)
    with pytest.raises(TaskFileError, match=message):
        server_tasks(str(path))


def test_missing_tasks_file_and_empty_set(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="cannot read tasks file"):
        load_tasks_file(tmp_path / "absent.json")
    with pytest.raises(TaskFileError, match="empty"):
        TaskSet([])


def test_fix_range_sum_fails_as_given_and_its_scripted_solution_fixes_it() -> None:
    """The added task's verifier fails on the starting files and passes after its reference script."""
    with LocalSandbox() as sandbox:
        FIX_RANGE_SUM.place(sandbox)
        assert FIX_RANGE_SUM.verify(sandbox).reward == 0.0
        for turn in FIX_RANGE_SUM.reference_script or []:
            for call in turn.get("tool_calls", []):
                arguments = call["arguments"]  # an object, as the built-in tasks sample them; or its JSON text
                command = (json.loads(arguments) if isinstance(arguments, str) else arguments)["command"]
                assert sandbox.run(command, cwd=sandbox.workdir, timeout_s=60).exit_code == 0, command
        outcome = FIX_RANGE_SUM.verify(sandbox)
        assert outcome.reward == 1.0, outcome.detail
        assert "range(1, n + 1)" in sandbox.read_file("series.py").decode()


def test_a_generated_task_file_is_served(tmp_path) -> None:
    """``openenv-harness tasks generate``'s rows (files as {path, content} records, a split) load as tasks."""
    from openenv_harness.rollout.task_data import write_tasks_jsonl
    from openenv_harness.rollout.task_family import generate

    generated = generate(3, seed=2)
    path = write_tasks_jsonl(generated, tmp_path / "family.jsonl", split="train")
    served = server_tasks(str(path))
    assert [served.get(t.id).files for t in generated] == [t.files for t in generated]
    assert served.get(generated[0].id).metadata["split"] == "train"
