"""``openenv-harness space build|validate``: the environment as a self-contained Space folder, and OpenEnv's
validator run on it with its runtime checks executed (``openenv_harness/space/``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from openenv_harness.cli.errors import CLIError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console(width=None if sys.stdout.isatty() else 150)


@app.command("build", help="Write the environment as a Space folder: what its Dockerfile copies, the Dockerfile at "
             "its root, the Space card, and the manifest's runtime binding (then `openenv push FOLDER`).")
def build(out: Path = typer.Argument(..., help="An absent or empty folder")) -> None:
    from openenv_harness.space.build import SpaceBuildError, build_space

    try:
        files = build_space(out)
    except SpaceBuildError as exc:
        raise CLIError(str(exc)) from None
    console.print(f"wrote {len(files)} files to [bold]{escape(str(out))}[/] (Dockerfile, openenv.yaml, README.md, "
                  "validation/runtime.json, the package and the environment)", soft_wrap=True)


@app.command("validate", help="Run OpenEnv's validator on the Space folder (built into a temporary folder unless "
             "given), its runtime checks executed by the local-process provider: the image's command and one "
             "episode over OpenEnv's WebSocket protocol.")
def validate(
    folder: Path = typer.Argument(None, help="A folder `space build` wrote (default: build one now)"),
    level: str = typer.Option("runtime", "--level", help="static | runtime"),
    json_out: Path = typer.Option(None, "--json", help="Also write OpenEnv's JSON report here"),
) -> int:
    from openenv.validation import run_validation
    from openenv.validation.report import write_report
    from openenv.validation.types import Level

    from openenv_harness.space.build import SpaceBuildError, build_space
    from openenv_harness.space.validation import LocalProcessProvider

    if level not in ("static", "runtime"):
        raise CLIError(f"unknown level {level!r}", "use --level static or --level runtime")
    work = Path(tempfile.mkdtemp(prefix="oeh-space-"))
    if folder is None:
        folder = work / "space"
        try:
            build_space(folder)
        except SpaceBuildError as exc:
            raise CLIError(str(exc)) from None
    elif not (folder / "openenv.yaml").is_file():
        raise CLIError(f"no openenv.yaml in {folder}", "build the folder with `openenv-harness space build`")
    report = run_validation(folder, max_level=Level.RUNTIME if level == "runtime" else Level.STATIC,
                            provider=LocalProcessProvider(work / "provider"))
    console.print(f"OpenEnv validation of {escape(str(folder))} (policy {report.policy_version}, provider "
                  "local-process: the image's command as a local process, no network or resource limits)",
                  soft_wrap=True)
    for result in report.results:
        status = result.status.value.upper()
        colour = {"PASS": "green", "FAIL": "red", "ERROR": "red", "SKIP": "dim"}.get(status, "yellow")
        detail = f" [dim]{escape('; '.join(result.evidence))}[/]" if status != "PASS" and result.evidence else ""
        console.print(f"  [{colour}]{status:5s}[/] {result.check_id}{detail}", soft_wrap=True)
    ran = [r for r in report.results if r.check_id.startswith("runtime.") and r.status.value != "skip"]
    console.print(f"verdict: [bold]{report.verdict.value.upper()}[/]; {len(ran)} runtime check(s) executed",
                  soft_wrap=True)
    if json_out is not None:
        write_report(report, json_out)
    return 1 if report.verdict.value in ("fail", "error") else 0
