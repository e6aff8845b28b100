"""Tasks as data: a JSONL file, a Hugging Face dataset folder, or a ``load_dataset`` name.

A trainer's task set is data it versions and splits, not code: each row is one ``Task`` (its id,
instruction, files and verifier command) plus a ``split`` ("train", "held_out", ...). Rows are read
with pydantic, so a bad row fails with its place and the field at fault before any rollout starts.

Datasets store ``files`` as Arrow can: a list of ``{"path", "content"}`` records, or a JSON object as
text; JSONL may also carry the plain ``{path: content}`` object. The ``datasets`` library reads
dataset folders and names (``pip install datasets``); JSONL needs nothing beyond this package.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openenv_harness.rollout.tasks import Task


class TaskDataError(ValueError):
    """A task source that cannot be read: the message names the source, the row and the fault."""


def _files(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list):
        return {str(item["path"]): str(item["content"]) for item in value}
    raise TypeError(f"files must be an object, a list of {{path, content}} or JSON text, not {type(value).__name__}")


def task_from_row(row: dict[str, Any]) -> tuple[Task, str | None]:
    """One row as a task and its split (None where the row names none)."""
    data = dict(row)
    split = data.pop("split", None)
    data["files"] = _files(data.get("files"))
    for key in ("metadata",):
        if isinstance(data.get(key), str):
            data[key] = json.loads(data[key])
    data = {k: v for k, v in data.items() if v is not None}
    task = Task.model_validate(data)
    if split is not None:
        task = task.model_copy(update={"metadata": {**task.metadata, "split": str(split)}})
    return task, None if split is None else str(split)


def _rows_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise TaskDataError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise TaskDataError(f"{path}:{number}: a task row is a JSON object, not {type(row).__name__}")
            yield f"{path}:{number}", row


def _rows_dataset(source: str, split: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError as exc:
        raise TaskDataError(f"{source}: reading a dataset needs the datasets library (pip install datasets)") from exc
    path = Path(source)
    try:
        if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            loaded: Any = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(source)
    except Exception as exc:  # noqa: BLE001 -- the library's own error, named with the source
        raise TaskDataError(f"{source}: datasets could not load it ({type(exc).__name__}: {exc})") from exc
    if isinstance(loaded, datasets.DatasetDict):
        names = [split] if split is not None else list(loaded)
        missing = [n for n in names if n not in loaded]
        if missing:
            raise TaskDataError(f"{source}: no split {missing[0]!r}; it has {', '.join(loaded)}")
        for name in names:
            for index, row in enumerate(loaded[name]):
                yield f"{source}[{name}][{index}]", {"split": name, **row}
    else:
        for index, row in enumerate(loaded):
            yield f"{source}[{index}]", dict(row)


def load_tasks(source: str | Path, split: str | None = None) -> list[Task]:
    """The tasks of ``source`` (a ``.jsonl`` file, a dataset folder, or a dataset name), those of
    ``split`` only where one is given. Ids must be unique; an empty selection is an error."""
    text = str(source)
    path = Path(text)
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise TaskDataError(f"{path}: no such task file")
        rows: Iterable[tuple[str, dict[str, Any]]] = _rows_jsonl(path)
    else:
        rows = _rows_dataset(text, split)
    tasks: list[Task] = []
    seen: set[str] = set()
    for where, row in rows:
        try:
            task, row_split = task_from_row(row)
        except (ValidationError, ValueError, TypeError, KeyError) as exc:
            raise TaskDataError(f"{where}: not a task ({exc})") from None
        if split is not None and row_split != split:
            continue
        if task.id in seen:
            raise TaskDataError(f"{where}: task id {task.id!r} appears twice")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise TaskDataError(f"{text}: no tasks" + (f" in split {split!r}" if split else ""))
    return tasks


def task_row(task: Task, split: str | None = None) -> dict[str, Any]:
    """A task as a row both readers take back (``files`` as ``{path, content}`` records, Arrow's form)."""
    row = task.model_dump(exclude={"reference_script"}, exclude_none=True)
    row["files"] = [{"path": p, "content": c} for p, c in task.files.items()]
    chosen = split if split is not None else task.metadata.get("split")
    if chosen is not None:
        row["split"] = chosen
    return row


def write_tasks_jsonl(tasks: Iterable[Task], path: str | Path, split: str | None = None) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task_row(task, split), ensure_ascii=False) + "\n")
    return out
