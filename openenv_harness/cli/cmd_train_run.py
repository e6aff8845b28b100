"""``openenv-harness train``: many loop iterations over tasks as data, resumable, with the held-out
success of the base and of the trained policy.

Each iteration is ``train-demo``'s loop (rollouts -> GRPO step -> weight sync through the fence ->
rollouts at the new version) on the next task of the train split; after each, a checkpoint and a
line in ``metrics.jsonl`` (``trainer/training_run.py``). Run the same command again with the same
``--out`` and it goes on from the last whole checkpoint. ``--eval-split`` evaluates the base policy
before the first iteration and the trained one after the last, on the same tasks and seeds
(``trainer/evaluate.py``); ``learning.json`` holds both.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from openenv_harness.cli.errors import CLIError

console = Console(width=None if sys.stdout.isatty() else 150)


def train(
    tasks_source: str = typer.Option(..., "--tasks", help="Tasks as data: .jsonl, a dataset folder or name "
                                     "(see `tasks generate`)"),
    split: str = typer.Option("train", "--split", help="The split trained on"),
    eval_split: str = typer.Option(None, "--eval-split", help="Evaluate the base and the trained policy on this "
                                   "split (e.g. held_out)"),
    eval_seeds: int = typer.Option(1, "--eval-seeds", min=1, help="Rollouts per evaluation task (seeds 0..N-1)"),
    iterations: int = typer.Option(10, "--iterations", min=1, help="Loop iterations (one GRPO step each)"),
    harness: str = typer.Option("pi", "--harness", help="The agent (pi or claude-code: the model's tool-call hint "
                                "goes through its --append-system-prompt)"),
    group: int = typer.Option(8, "--group", min=2, help="Rollouts per GRPO group"),
    next_rollouts: int = typer.Option(2, "--next-rollouts", min=1, help="Rollouts after each sync (the next "
                                      "task's, carried into its group)"),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="Sampled tokens per call at most"),
    max_agent_calls: int = typer.Option(4, "--max-agent-calls", min=1, help="Agent calls per rollout at most"),
    temperature: float = typer.Option(1.0, "--temperature", help="The training sampling policy's temperature"),
    learning_rate: float = typer.Option(5e-5, "--lr", help="Adam's learning rate (projections)"),
    norm_learning_rate: float = typer.Option(None, "--norm-lr", help="Adam's learning rate for the norms"),
    layers: int = typer.Option(4, "--layers", min=1, help="Decoder layers trained (the last ones)"),
    brevity: float = typer.Option(0.0, "--brevity", help="Shaping: this x the unused share of the token budget "
                                  "added to the verifier's reward (reported apart; 0: the verifier's reward only)"),
    seed: int = typer.Option(0, "--seed", help="First rollout's seed"),
    sandbox: str = typer.Option("local", "--sandbox", help="Where rollouts run: local (not isolated: the agent's "
                                "commands run as you) | docker | podman (a container each, no network)"),
    image: str = typer.Option(None, "--image", help="With --sandbox docker/podman: the image (default: the one "
                              "./dev setup builds)"),
    out: str = typer.Option(None, "--out", help="Run directory (again with the same one: resume)"),
    kv_cache_gib: int = typer.Option(4, "--kv-cache-gib", min=1, help="The engine's KV cache (GiB of memory it "
                                     "reserves; 1 holds about 80k ids of this model)"),
) -> int:
    """Train over a task split for many iterations, resumably; evaluate base and trained on a held-out split."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise CLIError(f"the trainer needs torch and transformers ({exc.name} is missing)",
                       "pip install 'openenv-harness[trainer]'") from exc
    from transformers.utils import logging as hf_logging

    from openenv_harness.cli.stack import LocalStack
    from openenv_harness.engine.model import QWEN25_CODER_05B
    from openenv_harness.harnesses.registry import get_preset
    from openenv_harness.rollout.task_data import TaskDataError, load_tasks
    from openenv_harness.trainer.train_loop import LoopSettings
    from openenv_harness.trainer.training_run import TrainingRun

    try:
        train_tasks = load_tasks(tasks_source, split)
        eval_tasks = load_tasks(tasks_source, eval_split) if eval_split else []
    except TaskDataError as exc:
        raise CLIError(str(exc)) from None
    if get_preset(harness).append_system_prompt_flag is None:
        raise CLIError(f"{harness} has no flag that appends to its system prompt",
                       "the 0.5B model needs its tool-call hint to act unconstrained: use pi or claude-code")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from openenv_harness.cli.cmd_run import _sandbox_factory

    _sandbox_factory(sandbox, image)  # a missing engine or image is said now, before the engine starts
    run_dir = Path(out or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = lambda message: console.print(f"[dim]{time.strftime('%X')}[/] {message}", soft_wrap=True)  # noqa: E731
    stack = LocalStack(engine_url=None, store_path=str(run_dir / "records.db"), model=None, tasks=train_tasks,
                       engine="vllm", progress=progress, unconstrained=True, kv_cache_gib=kv_cache_gib)
    learning_path = run_dir / "learning.json"
    learning: dict[str, Any] = json.loads(learning_path.read_text()) if learning_path.is_file() else {}
    with stack:
        settings = LoopSettings(
            engine_url=stack.engine.url, recorder_url=stack.recorder_url, admin_token=stack.admin_token,
            model=stack.model or QWEN25_CODER_05B.served_name, model_dir=Path(stack.engine.settings.model_dir).resolve(),
            workdir=run_dir, harness=harness, tasks=train_tasks, group=group, next_rollouts=next_rollouts,
            max_tokens=max_tokens, max_agent_calls=max_agent_calls, temperature=temperature, seed=seed,
            learning_rate=learning_rate, norm_learning_rate=norm_learning_rate, layers=layers, brevity=brevity,
            max_group=group,  # a group whose rewards tie is a no-op step, not a reason to draw more
            system_prompt_suffix=QWEN25_CODER_05B.tool_call_hint, sandbox=sandbox, image=image)
        run = TrainingRun(settings, run_dir, iterations, progress=progress)
        if eval_tasks and "base" not in learning and run.completed() == 0:
            learning["base"] = _evaluate(stack, settings, eval_tasks, eval_seeds, "base", progress)
            learning_path.write_text(json.dumps(learning, indent=1))
        try:
            for _line in run.run():
                pass
            if eval_tasks:
                if run.loop is None:  # every iteration was done before: serve the last checkpoint's weights
                    from dataclasses import replace

                    from openenv_harness.trainer.train_loop import TrainLoop

                    run.loop = TrainLoop(replace(settings, resume_from=run.checkpoint(iterations - 1)),
                                         progress=progress)
                    run.loop.serve_resumed()
                learning["trained"] = _evaluate(stack, settings, eval_tasks, eval_seeds, "trained", progress)
                learning["iterations"] = iterations
                learning_path.write_text(json.dumps(learning, indent=1))
        finally:  # the engine was started here and stops with the stack: nothing to load back
            if run.loop is not None:
                run.loop.close()
    _print_summary(run.history(), learning)
    console.print(f"[dim]metrics: {run.metrics_path}; records: {run_dir / 'records.db'}"
                  + (f"; evaluation: {learning_path}" if learning else "") + "[/]", soft_wrap=True)
    return 0


def _evaluate(stack: Any, settings: Any, tasks: list[Any], seeds: int, label: str, progress: Any) -> dict[str, Any]:
    from openenv_harness.harnesses.base import HarnessOptions
    from openenv_harness.rollout import HarnessSessionFactory
    from openenv_harness.sandbox.choose import sandbox_factory
    from openenv_harness.trainer.evaluate import evaluate

    version = int(_health(stack)["fence"]["policy_version"])
    progress(f"evaluating the {label} policy (version {version}) on {len(tasks)} task(s) x {seeds} seed(s)")

    def factory(task: Any, seed: int) -> Any:
        return HarnessSessionFactory(
            harness=settings.harness, recorder_url=stack.recorder_url, admin_token=stack.admin_token,
            model=settings.model, tasks={task.id: task}, prompt_mode="incremental",
            options=HarnessOptions(system_prompt_suffix=settings.system_prompt_suffix),
            budgets={"max_agent_calls": settings.max_agent_calls, "max_wall_clock_s": settings.rollout_timeout_s},
            sampling={"max_tokens": settings.max_tokens, "seed": seed}, training_temperature=settings.temperature,
            metadata={"evaluation": label}, sandbox_factory=sandbox_factory(settings.sandbox, settings.image))

    report = evaluate(factory, tasks, label=label, seeds=range(seeds), progress=progress)
    return {**report.as_dict(), "policy_version": version,
            "levels": report.by_level({t.id: t.metadata.get("level") for t in tasks})}


def _health(stack: Any) -> dict[str, Any]:
    from openenv_harness.recorder.client import RecorderClient

    with RecorderClient(stack.recorder_url, stack.admin_token) as client:
        return dict(client.health())


def _print_summary(history: list[dict[str, Any]], learning: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="iterations", title_justify="left")
    for column in ("#", "task", "versions", "task reward", "after sync", "trained ids", "clip", "KL k3", "floor |d|",
                   "TRL agrees"):
        table.add_column(column)

    def fmt(value: Any, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)

    for line in history:
        table.add_row(str(line["iteration"]), str(line["task"]),
                      f"{line['policy_version_before']}->{line['policy_version_after']}", fmt(line["task_reward_mean"]),
                      fmt(line["after_task_reward_mean"]), str(line["trained_tokens"]), fmt(line["clip_fraction"]),
                      fmt(line["update_kl_k3"], ".2e"), fmt(line["floor_delta_mean"], ".4f"),
                      "yes" if line["trl_agrees"] else "NO")
    console.print(table)
    if "base" in learning and "trained" in learning:
        from openenv_harness.trainer.evaluate import newcombe_difference

        b, t = learning["base"], learning["trained"]
        low, high = newcombe_difference(b["successes"], b["scored"], t["successes"], t["scored"])
        console.print(f"[bold]held-out success[/] base {b['successes']}/{b['scored']} ({b['rate']:.1%}) -> trained "
                      f"{t['successes']}/{t['scored']} ({t['rate']:.1%}); difference {t['rate'] - b['rate']:+.1%}, "
                      f"95 % interval [{low:+.1%}, {high:+.1%}]", soft_wrap=True)
