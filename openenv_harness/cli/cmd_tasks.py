"""``openenv-harness tasks``: write and inspect task sets as data (``rollout/task_data.py``)."""

from __future__ import annotations

import collections

import typer
from rich.console import Console

from openenv_harness.cli.errors import CLIError

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command("generate")
def generate(
    out: str = typer.Option(..., "--out", help="The .jsonl file written"),
    train: int = typer.Option(48, "--train", min=1, help="Tasks in the train split"),
    held_out: int = typer.Option(32, "--held-out", min=1, help="Tasks in the held_out split"),
    seed: int = typer.Option(0, "--seed", help="The generator's seed"),
    levels: str = typer.Option("1,2,3", "--levels", help="Difficulty levels taken in turn (1 write-file, "
                               "2 fix-operator, 3 fix-two)"),
) -> None:
    """Write the generated code-basics family (``rollout/task_family.py``) with a train and a held-out split."""
    from openenv_harness.rollout.task_data import write_tasks_jsonl
    from openenv_harness.rollout.task_family import LEVELS, family_splits

    try:
        chosen = tuple(int(v) for v in levels.split(",") if v.strip())
    except ValueError:
        raise CLIError(f"--levels {levels!r}: comma-separated level numbers", f"levels: {sorted(LEVELS)}") from None
    if not chosen or any(level not in LEVELS for level in chosen):
        raise CLIError(f"--levels {levels!r}: unknown level", f"levels: {sorted(LEVELS)}")
    splits = family_splits(train, held_out, seed=seed, levels=chosen)
    path = write_tasks_jsonl(splits["train"] + splits["held_out"], out)
    console.print(f"wrote {path}: {train} train and {held_out} held_out task(s), levels {list(chosen)}")


@app.command("show")
def show(source: str = typer.Argument(..., help="A .jsonl file, a dataset folder or name"),
         split: str = typer.Option(None, "--split")) -> None:
    """Count a task set's tasks by split and level."""
    from openenv_harness.rollout.task_data import TaskDataError, load_tasks

    try:
        tasks = load_tasks(source, split)
    except TaskDataError as exc:
        raise CLIError(str(exc)) from None
    counts = collections.Counter((t.metadata.get("split", "-"), t.metadata.get("level", "-")) for t in tasks)
    for (name, level), n in sorted(counts.items(), key=str):
        console.print(f"{name}\tlevel {level}\t{n}")
    console.print(f"{len(tasks)} task(s)")
