"""The command-line app. Errors are one clear line with what to do; ``--debug`` shows tracebacks."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from openenv_harness.cli import cmd_doctor, cmd_run, cmd_serve, cmd_space, cmd_tasks, cmd_trace, cmd_train, cmd_train_run

app = typer.Typer(
    name="openenv-harness",
    help="Train the model behind unmodified coding agents (Pi, OpenCode, Codex, Claude Code) with exact token "
         "evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve", help="Run the recorder (the interception server) in the foreground.")(cmd_serve.serve)
app.command("run", help="Run agent rollouts on tasks through the recorder and print what was recorded.")(cmd_run.run)
app.command("doctor", help="Check Python, Node, the agent CLIs and (optionally) an engine.")(cmd_doctor.doctor)
app.command("train-demo", help="Close the RL loop here: rollouts, one GRPO step, the weights synced into the "
            "running vLLM through the recorder's fence, rollouts at the new policy version.")(cmd_train.train_demo)
app.command("train", help="Train over a task split for many iterations, resumably, and evaluate the base and "
            "the trained policy on a held-out split.")(cmd_train_run.train)
app.add_typer(cmd_tasks.app, name="tasks", help="Write and inspect task sets as data.")
app.add_typer(cmd_space.app, name="space", help="Build the environment as a self-contained Space folder and "
              "validate it with OpenEnv's validator, runtime checks included.")
app.add_typer(cmd_trace.app, name="trace", help="List, show and export recorded sessions.")

err = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        # non-standalone, click returns a command's exit code instead of exiting with it
        code = app(args, standalone_mode=False)
        if isinstance(code, int) and code != 0:
            raise SystemExit(code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise SystemExit(130)
    except Exception as exc:  # one clear line unless --debug
        if debug:
            raise
        from click.exceptions import ClickException

        if isinstance(exc, ClickException):
            exc.show()
            raise SystemExit(exc.exit_code)
        message = str(exc) or type(exc).__name__
        # soft_wrap: one line each, whatever the terminal's width (a long path must not break it)
        err.print(f"[bold red]error:[/] {message}", soft_wrap=True)
        hint = getattr(exc, "hint", None)
        if hint:
            err.print(f"[dim]hint:[/] {hint}", soft_wrap=True)
        else:
            err.print("[dim]run again with --debug for the full traceback[/]", soft_wrap=True)
        raise SystemExit(2)
