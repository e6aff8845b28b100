"""``openenv-harness run``: rollouts of real agents on tasks, live progress, a summary table."""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from openenv_harness.cli.errors import CLIError
from openenv_harness.harnesses.registry import preset_names

if TYPE_CHECKING:  # the stack pulls in the rollout machinery: imported when a run starts, not for --help
    from openenv_harness.cli.stack import LocalStack

console = Console(width=None if sys.stdout.isatty() else 150)


def _tasks(names: list[str], source: str | None = None, split: str | None = None) -> list[Any]:
    """The run's tasks: built-in ones by id, or those of a task file or dataset (``rollout/task_data.py``)."""
    from openenv_harness.rollout.taskset import BUILTIN_TASKS

    if split is not None and source is None:
        raise CLIError("--split selects from --tasks", "pass --tasks PATH")
    if source is not None:
        from openenv_harness.rollout.task_data import TaskDataError, load_tasks

        try:
            loaded = {t.id: t for t in load_tasks(source, split)}
        except TaskDataError as exc:
            raise CLIError(str(exc)) from None
        known, where = loaded, source
    else:
        known, where, names = dict(BUILTIN_TASKS), "built-in tasks", names or ["fix-add"]
    unknown = [n for n in names if n not in known]
    if unknown:
        shown = ", ".join(list(known)[:12]) + (" ..." if len(known) > 12 else "")
        raise CLIError(f"unknown task(s): {', '.join(unknown)}", f"{where}: {shown}")
    return [known[n] for n in names] if names else list(known.values())


def _sandbox_factory(kind: str, image: str | None = None) -> Any:
    from openenv_harness.sandbox.base import SandboxError
    from openenv_harness.sandbox.choose import sandbox_factory

    try:
        return sandbox_factory(kind, image)
    except SandboxError as exc:
        raise CLIError(str(exc)) from None


def _progress(stack: LocalStack, state: dict[str, Any]) -> Table:
    table = Table.grid(padding=(0, 2))
    rollouts = (f"[bold]rollouts[/] running {state['running']}  done {state['done']}  failed {state['failed']}"
                f"  of {state['total']}")
    if stack.recorder is None:  # a recorder somebody else runs (--recorder-url): its counters are its own
        table.add_row(rollouts, f"[dim]{time.time() - state['t0']:.1f}s[/]")
        return table
    calls = tokens = 0
    for s in stack.recorder.ctx.sessions.all():
        calls += s.counters.calls
        tokens += s.counters.prompt_tokens + s.counters.completion_tokens
    forks = stack.recorder.ctx.metrics.transitions.labels("replay_drift")._value.get() + \
        stack.recorder.ctx.metrics.transitions.labels("break")._value.get()
    table.add_row(rollouts, f"[bold]calls[/] {calls}", f"[bold]tokens[/] {tokens}", f"[bold]forks[/] {int(forks)}",
                  f"[dim]{time.time() - state['t0']:.1f}s[/]")
    return table


def training_view(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What a trainer gets from one rollout's records: rows and trainable share of the sampled ids per
    assembly strategy, and how many agent calls ran under a decoding constraint (their logprobs are
    not the policy's, so their ids are not trainable by default)."""
    from openenv_harness.assembly import AssemblyError, compare_strategies
    from openenv_harness.contract import is_training_entry

    agent = [r for r in records if is_training_entry(r)]
    sampled = sum(len(r["completion_token_ids"]) for r in agent)
    view: dict[str, Any] = {"sampled_tokens": sampled,
                            "constrained_calls": sum(1 for r in agent if r["metadata"].get("logprobs_are_policy") is False)}
    try:
        by_strategy = compare_strategies(records) if agent else {}
    except AssemblyError as exc:
        view["error"] = str(exc)
        return view
    view["strategies"] = {name: {"rows": stats.traces, "trainable_tokens": stats.trainable_tokens,
                                 "trainable_share": stats.trainable_tokens / sampled if sampled else None}
                          for name, stats in by_strategy.items()}
    if view["constrained_calls"]:
        # the same rows with the constrained calls' ids kept (a trainer that recomputes their logprobs)
        kept = compare_strategies(records, non_policy="keep")
        for name, stats in kept.items():
            view["strategies"][name]["kept_tokens"] = stats.trainable_tokens
    return view


def pins_beside_policy(sampling: dict[str, Any] | None, temperature: float | None) -> dict[str, Any] | None:
    """The stack's pinned sampling without what a training sampling policy sets itself (its temperature and
    its neutral knobs): the policy decides those."""
    if temperature is None or not sampling:
        return sampling
    from openenv_harness.recorder.sampling_policy import policy_values

    return {k: v for k, v in sampling.items() if k not in policy_values(temperature)} or None


def trainer_line(mode: str, reports: list[Any]) -> str:
    """One line per prompt mode: what a trainer gets from these rollouts (split rows: the default strategy)."""
    views = [r.training for r in reports if r.prompt_mode == mode and r.training and "strategies" in r.training]
    if not views:
        return f"{mode.replace('_', ' ')}: no records to assemble"
    rows = sum(v["strategies"]["split"]["rows"] for v in views)
    sampled = sum(v["sampled_tokens"] for v in views)
    trainable = sum(v["strategies"]["split"]["trainable_tokens"] for v in views)
    kept = sum(v["strategies"]["split"].get("kept_tokens", v["strategies"]["split"]["trainable_tokens"]) for v in views)
    constrained = sum(v["constrained_calls"] for v in views)
    calls = sum(r.agent_calls for r in reports if r.prompt_mode == mode)
    share = (lambda n: f"{n / sampled:.0%}" if sampled else "-")
    line = (f"{mode.replace('_', ' ')}: {len(views)} rollout(s) -> {rows} row(s), {share(trainable)} of {sampled} "
            f"sampled ids trainable with their recorded logprobs")
    if constrained:
        line += (f"; {constrained} of {calls} agent calls ran under a decoding constraint (their logprobs are not "
                 f"the policy's: mask 0), {share(kept)} of the sampled ids sit in those rows for a trainer that "
                 "recomputes them (trace export --non-policy keep)")
    return line


def _share(view: dict[str, Any] | None, strategy: str) -> str:
    got = ((view or {}).get("strategies") or {}).get(strategy)
    if not got:
        return "-"
    share = got["trainable_share"]
    return f"{got['rows']} / {'-' if share is None else f'{share:.0%}'}"


def _failed(report: Any) -> bool:
    """A rollout that did not end as designed. A budget stop is an outcome (the policy spent its budget;
    the rollout is scored), not a failure, even though the agent exits on the refused call."""
    if report.error and not report.session_id:
        return True  # it never started
    if report.stop_reason:
        return report.reward is None and report.unscored_reason is not None
    return report.exit_code != 0 or bool(report.error)


def _check_reachable(url: str | None, path: str, what: str) -> None:
    """Fail before any rollout, in one line, when the engine or recorder named is not there."""
    if not url:
        return
    import httpx

    try:
        httpx.get(url.rstrip("/") + path, timeout=10).raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise CLIError(f"the {what} at {url} answered {path} with HTTP {exc.response.status_code}",
                       f"is {url} a {'vLLM server' if what == 'engine' else 'recorder'}?") from None
    except httpx.HTTPError as exc:
        raise CLIError(f"the {what} at {url} is not reachable ({type(exc).__name__}: {exc})",
                       "start it first, or check the URL") from None


def _summary(reports: list[Any]) -> Table:
    t = Table(title="rollouts", show_lines=False)
    for col in ("harness", "mode", "task", "exit", "reward", "calls agent/aux", "tokens prompt/sampled",
                "chain", "rows / trainable split", "realign", "constrained", "budget stop", "wall s", "session"):
        t.add_column(col, overflow="fold")
    for r in reports:
        reward = "unscored" if r.reward is None else f"{r.reward:g}"
        view = r.training
        t.add_row(r.harness, r.prompt_mode.replace("_history", ""), r.task, str(r.exit_code), reward,
                  f"{r.agent_calls}/{r.aux_calls}",
                  f"{r.prompt_tokens}/{r.completion_tokens}", r.chain_status, _share(view, "split"),
                  _share(view, "realign"), str((view or {}).get("constrained_calls", "-")), r.stop_reason or "-",
                  f"{r.wall_s:.1f}", r.session_id)
    return t


def run(
    harness: str = typer.Option("pi,opencode", "--harness", help="Comma-separated: " + ", ".join(preset_names())),
    task: str = typer.Option(None, "--task", help="Comma-separated task ids: built-in ones (default fix-add), or "
                             "ids of --tasks"),
    tasks_source: str = typer.Option(None, "--tasks", help="Tasks as data: a .jsonl file, a dataset folder "
                                     "(datasets' save_to_disk) or a load_dataset name; every task unless --task "
                                     "names some"),
    split: str = typer.Option(None, "--split", help="With --tasks: the split to run (e.g. train, held_out)"),
    engine: str = typer.Option("reference", "--engine", help="reference (embedded test double) | vllm (the "
                               "project's real vLLM with Qwen2.5-Coder-0.5B-Instruct, installed on first use)"),
    engine_url: str = typer.Option(None, "--engine-url", help="A real vLLM somebody else runs (with --model)"),
    model: str = typer.Option(None, "--model", help="Served model name (required with --engine-url)"),
    engine_family: str = typer.Option("vllm", "--engine-family", help="vllm | sglang: whose routes the engine "
                                      "serves (the embedded engine serves that family's wire)"),
    sandbox: str = typer.Option("local", "--sandbox", help="local (a private directory, not isolated) | docker | "
                                "podman (a container each, no network) | hf"),
    image: str = typer.Option(None, "--image", help="With --sandbox docker/podman: the image (default: the one "
                              "./dev setup builds)"),
    rollouts: int = typer.Option(1, "--rollouts", min=1, help="Rollouts per (harness, task)"),
    concurrency: int = typer.Option(2, "--concurrency", min=1, help="Rollouts at once"),
    max_agent_calls: int = typer.Option(None, "--max-agent-calls",
                                        help="Budget: agent calls per rollout (default 30; 6 with --engine vllm)"),
    max_total_tokens: int = typer.Option(None, "--max-tokens", help="Budget: prompt+completion tokens per rollout"),
    max_wall_clock_s: float = typer.Option(600.0, "--max-wall-clock", help="Budget: seconds per rollout"),
    segmentation: str = typer.Option("canonical", help="Embedded engine only: canonical | noncanonical sampling"),
    prompt_mode: str = typer.Option("full_history", "--prompt-mode", help="full_history (the agent's messages as "
                                    "sent) | incremental (continue each chain from its exact ids); comma-separated "
                                    "runs each rollout in each mode, side by side"),
    require_exact_template: bool = typer.Option(False, "--require-exact-template", help="Refuse sessions where the "
                                                "served template is not certified exact"),
    chat_template: Path = typer.Option(None, "--chat-template", help="Serve this chat template file (embedded "
                                       "engine and --engine vllm)"),
    recorder_url: str = typer.Option(None, "--recorder-url", help="Use a recorder already running (`serve`) instead "
                                     "of starting one; with --admin-token and --model"),
    admin_token: str = typer.Option(None, "--admin-token", envvar="OEH_ADMIN_TOKEN", help="Admin token of "
                                    "--recorder-url"),
    out: str = typer.Option(None, "--out", help="Run directory (default runs/<timestamp>)"),
    training_sampling: float = typer.Option(None, "--training-sampling", min=0.01, max=10.0, help="Pin a training "
                                            "sampling policy at this temperature: the whole vocabulary, no penalty, "
                                            "whatever the agent asks (its knobs are neutralised and recorded); "
                                            "other than 1 it needs an engine serving processed logprobs"),
    logprobs_mode: str = typer.Option(None, "--logprobs-mode", help="--engine vllm only: raw_logprobs (vLLM's "
                                      "default) | processed_logprobs (the distribution sampled from)"),
    system_prompt_suffix: str = typer.Option(None, "--system-prompt-suffix", help="Appended to each agent's own "
                                             "system prompt by its own flag (pi, claude-code). With --engine vllm "
                                             "and --training-sampling: the model's tool-call hint by default"),
) -> None:
    harnesses = [h.strip() for h in harness.split(",") if h.strip()]
    if logprobs_mode is not None and (engine != "vllm" or logprobs_mode not in ("raw_logprobs", "processed_logprobs")):
        raise CLIError("--logprobs-mode raw_logprobs | processed_logprobs applies to the engine --engine vllm starts",
                       "start your own engine with vLLM's --logprobs-mode; the recorder measures it either way")
    tasks = _tasks([t.strip() for t in (task or "").split(",") if t.strip()], tasks_source, split)
    if engine_family not in ("vllm", "sglang") or (engine_family == "sglang" and engine == "vllm"):
        raise CLIError(f"--engine-family {engine_family} does not apply here",
                       "use vllm or sglang; --engine vllm starts vLLM (for SGLang give --engine-url)")
    if engine not in ("reference", "vllm"):
        raise CLIError(f"unknown engine {engine!r}", "use --engine reference, --engine vllm, or --engine-url URL")
    if engine_url and engine == "vllm":
        raise CLIError("--engine vllm starts its own engine; --engine-url points at one somebody else runs",
                       "give one of them")
    if engine_url and not model:
        raise CLIError("--engine-url needs --model (the name the engine serves)", "e.g. --model Qwen/Qwen3-8B")
    modes = list(dict.fromkeys(m.strip() for m in prompt_mode.split(",") if m.strip()))
    unknown_modes = [m for m in modes if m not in ("full_history", "incremental")] or ([] if modes else [prompt_mode])
    if unknown_modes:
        raise CLIError(f"unknown prompt mode {', '.join(map(repr, unknown_modes))}",
                       "use --prompt-mode full_history, incremental, or both comma-separated")
    if chat_template is not None and (engine_url or recorder_url):
        raise CLIError("--chat-template applies to an engine started here (embedded or --engine vllm)",
                       "start that engine with the template yourself, or drop --engine-url / --recorder-url")
    if chat_template is not None and not chat_template.is_file():
        raise CLIError(f"chat template {chat_template} does not exist", "pass a Jinja template file")
    if recorder_url and (engine_url or engine == "vllm"):
        raise CLIError("--recorder-url uses that recorder's engine", "drop --engine-url / --engine vllm")
    if recorder_url and not (admin_token and model):
        raise CLIError("--recorder-url needs --admin-token and --model (the name its engine serves)",
                       "`serve` prints both")
    _check_reachable(engine_url, "/v1/models", "engine")
    _check_reachable(recorder_url, "/healthz", "recorder")
    if max_agent_calls is None:
        # each real-engine turn takes seconds on a CPU, and the pinned tool_choice never lets the
        # small model stop by itself: a short budget ends its rollouts
        max_agent_calls = 6 if engine == "vllm" else 30
    from openenv_harness.cli.stack import LocalStack, default_run_dir
    from openenv_harness.harnesses.install import ensure_installed
    from openenv_harness.harnesses.registry import get_preset
    from openenv_harness.rollout.factory import HarnessSessionFactory
    from openenv_harness.rollout.report import run_rollout

    for h in harnesses:
        get_preset(h)
    sandbox_factory = _sandbox_factory(sandbox, image)
    if sandbox == "local":
        with console.status("installing / checking the agent CLIs"):
            ensure_installed(harnesses)
    run_dir = Path(out or default_run_dir())
    store = str(run_dir / "records.db")
    stack = LocalStack(engine_url=engine_url, store_path=store, model=model, tasks=tasks, segmentation=segmentation,
                       engine="vllm" if engine == "vllm" else None, chat_template=chat_template,
                       logprobs_mode=logprobs_mode, unconstrained=training_sampling is not None,
                       system_prompt_suffix=system_prompt_suffix,
                       recorder_url=recorder_url, admin_token=admin_token, engine_family=engine_family,
                       progress=lambda m: console.print(f"[dim][engine][/] {m}"))
    budgets = {"max_agent_calls": max_agent_calls, "max_wall_clock_s": max_wall_clock_s}
    if max_total_tokens:
        budgets["max_total_tokens"] = max_total_tokens
    jobs = [(h, t, m, i) for h in harnesses for t in tasks for m in modes for i in range(rollouts)]
    state = {"running": 0, "done": 0, "failed": 0, "total": len(jobs), "t0": time.time()}
    lock = threading.Lock()
    reports: list[Any] = []
    with stack:

        def one(job: tuple[str, Any, str, int]) -> Any:
            h, t, mode, i = job
            factory = HarnessSessionFactory(
                harness=h, recorder_url=stack.recorder_url, admin_token=stack.admin_token,
                prompt_mode=mode, require_exact_template=require_exact_template,
                model=stack.model_for(t, h), tasks={t.id: t}, budgets=budgets,
                sampling=pins_beside_policy(stack.sampling, training_sampling), training_temperature=training_sampling,
                sandbox_factory=sandbox_factory, metadata={"rollout": i}, options=stack.options_for(h),
                # a remote sandbox runs the CLI its image provides (on PATH), not this machine's copy
                executable=get_preset(h).bin_name if sandbox != "local" else None,
            )
            with lock:
                state["running"] += 1
            report, session = run_rollout(factory, t.id, timeout_s=max_wall_clock_s + 30, seed=i)
            report.prompt_mode = mode
            if session is not None:
                try:
                    report.training = training_view(session.client.records(session.session_id))
                except Exception as exc:  # noqa: BLE001 -- the rollout's own outcome stands
                    report.training = {"error": f"{type(exc).__name__}: {exc}"}
                session.close()
            with lock:
                state["running"] -= 1
                state["failed" if _failed(report) else "done"] += 1
            return report

        with Live(_progress(stack, state), console=console, refresh_per_second=4, transient=True) as live:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = [pool.submit(one, job) for job in jobs]
                pending = set(futures)
                while pending:
                    done = {f for f in pending if f.done()}
                    for f in done:
                        reports.append(f.result())
                    pending -= done
                    live.update(_progress(stack, state))
                    time.sleep(0.25)
    order = {(h, t.id, m): n for n, (h, t, m, _i) in enumerate(jobs)}
    reports.sort(key=lambda r: order.get((r.harness, r.task, r.prompt_mode), 0))
    console.print(_summary(reports))
    for mode in modes:
        console.print(f"[bold]what a trainer gets[/] {trainer_line(mode, reports)}", soft_wrap=True)
    cert = stack.recorder.ctx.engine_info.get("template_certification") if stack.recorder is not None else None
    if cert:  # beside the chain status: whether the served template can keep chains exact at all
        failed = "; ".join(f"{f['property']}: {f['detail']}" for f in cert.get("failed") or [])
        from rich.markup import escape

        from openenv_harness.recorder.engine_knowledge.certify import exact_in_words

        outside = [m.replace("_", " ") for m in modes if m not in cert.get("exact_in", modes)]
        exact_modes = "" if cert.get("status") == "certified" or "exact_in" not in cert else (
            f", {exact_in_words(cert['exact_in'])}" + (f"; this run used {', '.join(outside)}" if outside else ""))
        console.print(f"template: [bold]{escape(str(cert['status']))}[/]" + escape(
            exact_modes + (f" ({failed})" if failed else "") + (f" [probed via {cert['probed_via']}]" if cert.get("probed_via") else "")
            + (f" ({cert.get('reason')})" if cert.get("reason") else "")))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps([r.as_dict() for r in reports], indent=2))
    if recorder_url:
        console.print(f"records: on the recorder at [bold]{recorder_url}[/]   summary: [bold]{run_dir / 'summary.json'}[/]")
        if reports and reports[0].session_id:
            console.print(f"inspect: openenv-harness trace show {reports[0].session_id} --url {recorder_url}")
    else:
        console.print(f"records: [bold]{store}[/]   summary: [bold]{run_dir / 'summary.json'}[/]")
        if reports and reports[0].session_id:
            console.print(f"inspect: openenv-harness trace show {reports[0].session_id} --store {store}")
    failed = [r for r in reports if _failed(r)]
    if failed:
        raise CLIError(f"{len(failed)} of {len(reports)} rollout(s) failed: "
                       + "; ".join(f"{r.harness}/{r.task}: {r.error or 'exit ' + str(r.exit_code)}" for r in failed[:3]),
                       f"see {run_dir / 'summary.json'} and the session records")
