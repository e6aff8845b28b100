"""Tasks as data: JSONL files and dataset folders read back as the tasks written, bad rows named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openenv_harness.rollout.task_data import TaskDataError, load_tasks, task_row, write_tasks_jsonl
from openenv_harness.rollout.task_family import family_splits, generate


def test_a_family_round_trips_through_jsonl_with_its_splits(tmp_path: Path) -> None:
    splits = family_splits(train=6, held_out=4, seed=3)
    path = tmp_path / "tasks.jsonl"
    write_tasks_jsonl(splits["train"] + splits["held_out"], path)
    assert load_tasks(path, "train") == splits["train"]
    assert load_tasks(path, "held_out") == splits["held_out"]
    assert len(load_tasks(path)) == 10


def test_a_dataset_folder_reads_back_by_split(tmp_path: Path) -> None:
    import datasets  # the trainer extra carries it
    splits = family_splits(train=4, held_out=3, seed=5)
    folder = tmp_path / "ds"
    datasets.DatasetDict({name: datasets.Dataset.from_list([task_row(t, name) for t in tasks])
                          for name, tasks in splits.items()}).save_to_disk(str(folder))
    assert load_tasks(folder, "held_out") == splits["held_out"]
    assert [t.id for t in load_tasks(folder)] == [t.id for t in splits["train"] + splits["held_out"]]
    with pytest.raises(TaskDataError, match="no split 'test'"):
        load_tasks(folder, "test")


def test_a_jsonl_folder_loads_through_load_dataset(tmp_path: Path) -> None:
    tasks = generate(3, seed=1)
    write_tasks_jsonl(tasks, tmp_path / "data" / "train.jsonl", split="train")
    assert load_tasks(str(tmp_path / "data")) == [t.model_copy(update={"metadata": {**t.metadata, "split": "train"}})
                                                for t in tasks]


def test_plain_file_objects_are_accepted_in_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "instruction": "do it", "files": {"x.py": "1"},
                                "verify_command": "true"}) + "\n\n")
    (task,) = load_tasks(path)
    assert task.files == {"x.py": "1"} and task.verify_command == "true"


@pytest.mark.parametrize(("text", "fault"), [
    ("{not json\n", r"t.jsonl:1: not JSON"),
    ('[1, 2]\n', r"t.jsonl:1: a task row is a JSON object"),
    ('{"id": "a"}\n', r"t.jsonl:1: not a task .*instruction"),
    ('{"id": "a", "instruction": "x"}\n{"id": "a", "instruction": "y"}\n', r"t.jsonl:2: task id 'a' appears twice"),
    ('{"id": "a", "instruction": "x", "files": 3}\n', r"t.jsonl:1: not a task .*files must be"),
    ("\n", r"no tasks"),
])
def test_bad_rows_are_named(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(TaskDataError, match="(?s)" + fault):
        load_tasks(path)


def test_a_missing_split_or_file_is_an_error(tmp_path: Path) -> None:
    path = write_tasks_jsonl(generate(2), tmp_path / "t.jsonl", split="train")
    with pytest.raises(TaskDataError, match="no tasks in split 'held_out'"):
        load_tasks(path, "held_out")
    with pytest.raises(TaskDataError, match="no such task file"):
        load_tasks(tmp_path / "missing.jsonl")


def test_held_out_tasks_share_nothing_with_train() -> None:
    splits = family_splits(train=30, held_out=30, seed=0)
    train = {(t.instruction, tuple(sorted(t.files.items()))) for t in splits["train"]}
    assert not any((t.instruction, tuple(sorted(t.files.items()))) in train for t in splits["held_out"])
    assert len({t.id for t in splits["train"] + splits["held_out"]}) == 60
    assert {t.metadata["level"] for t in splits["held_out"]} == {1, 2, 3}
