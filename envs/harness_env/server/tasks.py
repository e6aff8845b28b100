"""The tasks an episode can be about: the project's built-in set, one more here, and a server file.

Choosing a task is part of ``reset``: by id, by ``split`` + ``index`` (OpenEnv's Task API), or by
seed. An unknown id is an error that lists the known ones -- never a silent fallback to a
free-form prompt, which would run an agent on a typo and score nothing.

Deployments add their own tasks with ``OEH_TASKS``: a JSON list of task objects (or JSON Lines),
each the fields of ``openenv_harness.rollout.Task`` (``id``, ``instruction``, ``files``,
``verify_command``, ...). A task without ``reference_script`` still runs on the embedded reference
engine, whose model then gives up -- a convenient failing case.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openenv_harness.rollout import BUILTIN_TASKS, Task
from openenv_harness.rollout.task_data import task_from_row

from .errors import BadRequestError, UnknownTaskError

__all__ = ["SPLIT", "TaskFileError", "TaskSet", "UnknownTaskError", "server_tasks"]

#: The single split: the task set is small and every task has its own verifier.
SPLIT = "train"


class TaskFileError(ValueError):
    """The ``OEH_TASKS`` file cannot be read as a list of tasks."""


def _bash(command: str) -> dict[str, Any]:
    """A scripted tool call with object arguments: sampled as the template's ``tojson`` writes them, which is
    also what vLLM re-renders after parsing the agent's replay, so the chain stays exact."""
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


FIX_RANGE_SUM = Task(
    id="fix-range-sum",
    instruction=(
        "`python3 -m unittest -q` fails: total(n) in series.py should add the integers 1..n inclusive. "
        "Fix series.py, not the tests."
    ),
    files={
        "series.py": 'def total(n):\n    """Sum of the integers 1..n inclusive."""\n    return sum(range(n))\n',
        "test_series.py": (
            "import unittest\n\nfrom series import total\n\n\nclass TotalTest(unittest.TestCase):\n"
            "    def test_four(self):\n        self.assertEqual(total(4), 10)\n\n"
            "    def test_one(self):\n        self.assertEqual(total(1), 1)\n"
        ),
    },
    verify_command="python3 -m unittest -q 2>&1",
    reference_script=[
        _bash("cat series.py test_series.py"),
        _bash("sed -i 's/sum(range(n))/sum(range(1, n + 1))/' series.py"),
        _bash("python3 -m unittest -q"),
        {"content": "total() summed 0..n-1; it now sums range(1, n + 1) and both tests pass."},
    ],
)

#: What every server offers before ``OEH_TASKS`` adds more.
DEFAULT_TASKS: dict[str, Task] = {**BUILTIN_TASKS, FIX_RANGE_SUM.id: FIX_RANGE_SUM}


class TaskSet:
    """An ordered, read-only set of tasks with the lookups ``reset`` and the Task API need."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        ordered: dict[str, Task] = {}
        for task in tasks:
            if task.id in ordered:
                raise TaskFileError(f"task id {task.id!r} is defined twice")
            ordered[task.id] = task
        if not ordered:
            raise TaskFileError("the task set is empty")
        self._tasks = ordered

    @property
    def ids(self) -> list[str]:
        return list(self._tasks)

    def all(self) -> list[Task]:
        return list(self._tasks.values())

    def get(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise UnknownTaskError(f"unknown task {task_id!r}; known tasks: {', '.join(self._tasks)}") from None

    def at(self, split: str, index: int) -> Task:
        self._check_split(split)
        if not 0 <= index < len(self._tasks):
            raise IndexError(f"task index {index} is out of range 0..{len(self._tasks) - 1}")
        return self.all()[index]

    def choose(self, seed: int | None) -> Task:
        """The task for a seed (stable across runs); a random one without a seed."""
        tasks = self.all()
        if seed is None:
            return random.SystemRandom().choice(tasks)
        return tasks[seed % len(tasks)]

    def resolve(self, *, task_id: str | None, split: str | None, index: int | None, seed: int | None) -> Task:
        if task_id is not None:
            if split is not None or index is not None:
                raise BadRequestError("give either task_id or split + index, not both")
            return self.get(task_id)
        if index is not None:
            try:
                return self.at(split or SPLIT, index)
            except IndexError as exc:
                raise UnknownTaskError(str(exc)) from None
        if split is not None:
            raise BadRequestError("split needs an index")
        return self.choose(seed)

    def _check_split(self, split: str) -> None:
        if split != SPLIT:
            raise UnknownTaskError(f"unknown split {split!r}; this environment has one split, {SPLIT!r}")

    # -- OpenEnv Task API (discovery only; selection happens in reset) --------------------------

    def spec(self, task: Task) -> dict[str, Any]:
        return {
            "id": task.id,
            "index": self.ids.index(task.id),
            "instruction": task.instruction,
            "files": sorted(task.files),
            "scored": task.verify_command is not None,
        }

    def list_splits(self) -> list[dict[str, str]]:
        return [{"name": SPLIT, "type": "train"}]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        self._check_split(split)
        return [self.spec(t) for t in self.all()]

    def get_task_range(self, split: str, start: int | None, stop: int | None) -> list[dict[str, Any]]:
        self._check_split(split)
        return [self.spec(t) for t in self.all()[start:stop]]


def load_tasks_file(path: str | Path) -> list[Task]:
    """Tasks from a JSON list, a ``{"tasks": [...]}`` object, or JSON Lines."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"cannot read tasks file {file}: {exc}") from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"tasks file {file} is neither JSON nor JSON Lines: {exc}") from None
    if isinstance(data, Mapping):
        data = data.get("tasks", [data])
    if not isinstance(data, list):
        raise TaskFileError(f"tasks file {file} must hold a list of tasks")
    tasks = []
    for n, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise TaskFileError(f"task #{n} in {file} is invalid: a task is an object, not {type(item).__name__}")
        try:  # the rows ``openenv-harness tasks generate`` writes (files as {path, content} records) read too
            tasks.append(task_from_row(dict(item))[0])
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
            raise TaskFileError(f"task #{n} in {file} is invalid: {problems}") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise TaskFileError(f"task #{n} in {file} is invalid: {exc}") from None
    return tasks


def server_tasks(tasks_file: str | None) -> TaskSet:
    """The default tasks plus those of ``tasks_file`` (an id defined twice is an error)."""
    extra = load_tasks_file(tasks_file) if tasks_file else []
    return TaskSet([*DEFAULT_TASKS.values(), *extra])
