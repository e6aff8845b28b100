"""``openenv-harness trace``: list sessions, show one, export its records."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from openenv_harness.cli.errors import CLIError
from openenv_harness.cli.records_source import MultiSource, open_source
from openenv_harness.trainer.limits import DEFAULT_LIMITS, Limits

app = typer.Typer(no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 150)

STORE = typer.Option(None, "--store", help="Record store (runs/<run>/records.db); repeat for several")
URL = typer.Option(None, "--url", help="A running recorder instead of a store file; repeat for several")
TOKEN = typer.Option(None, "--admin-token", envvar="OEH_ADMIN_TOKEN", help="Admin token for --url")


@app.command("list")
def list_sessions(store: list[str] = STORE, url: list[str] = URL, admin_token: str = TOKEN) -> None:
    """Sessions in stores or recorders (several: each session says where it lives)."""
    src = open_source(store, url, admin_token)
    several = isinstance(src, MultiSource)
    t = Table()
    for col in ("session", "status", "stop", "calls", "agent calls", "harness", "task", *(["where"] if several else [])):
        t.add_column(col)
    for s in src.sessions():
        t.add_row(s["session_id"], s.get("status", ""), s.get("stop_reason") or "", str(s.get("calls", "")),
                  str(s.get("agent_calls", "")), s.get("harness") or "", str((s.get("metadata") or {}).get("task_id", "")),
                  *([s["where"]] if several else []))
    console.print(t)
    _problems(src)


def _problems(src: Any) -> None:
    """Sources that could not be read, on stderr (the others were read); each said once."""
    problems = getattr(src, "problems", [])
    for problem in problems:
        Console(stderr=True).print(f"could not read {problem}", style="yellow")
    problems.clear()


def _delta_text(md: dict[str, Any]) -> str:
    fid = md.get("fidelity") or {}
    if fid.get("class") in ("replay_drift", "break"):
        cause = fid.get("cause") or "cause not recorded"
        return f"@{fid.get('divergence_at')} (+{fid.get('drift_tokens')}) {cause}"
    return ""


@app.command("show")
def show(session_id: str, store: list[str] = STORE, url: list[str] = URL, admin_token: str = TOKEN,
         delta: bool = typer.Option(False, help="Also print per-strategy trainable-token ratios")) -> None:
    """One session: its calls, chain status, budgets and errors."""
    src = open_source(store, url, admin_token)
    records = src.records(session_id)
    _problems(src)
    if not records:
        raise CLIError(f"no records for session {session_id}", "`openenv-harness trace list` shows the sessions")
    t = Table(title=f"session {session_id}")
    for col in ("#", "kind", "status", "prompt", "sampled", "finish", "chain", "divergence", "policy v", "error"):
        t.add_column(col)
    for r in records:
        md = r["metadata"]
        err = (md.get("error") or {}).get("message") or "; ".join(md.get("invalid_reasons") or [])
        pv = f"{md.get('policy_version_start')}" + ("→" + str(md.get("policy_version_end")) if md.get("straddled_sync") else "")
        t.add_row(str(md["call_index"]), md.get("call_kind", ""), md.get("status", ""), str(len(r["prompt_token_ids"])),
                  str(len(r["completion_token_ids"])), str(md.get("finish_reason") or ""),
                  (md.get("fidelity") or {}).get("class", ""), _delta_text(md), pv, err[:60])
    console.print(t)
    last = records[-1]["metadata"].get("limits") or {}
    console.print(f"budget state after the last call: {json.dumps(last)}")
    if delta:
        from openenv_harness.assembly import compare_strategies

        st = Table(title="training samples per assembly strategy")
        for col in ("strategy", "samples", "exact", "drift", "breaks", "trainable tokens", "lost",
                    "trainable / sampled", "trainable / all row tokens"):
            st.add_column(col)

        def ratio(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        for strategy, stats in compare_strategies(records).items():
            st.add_row(strategy, str(stats.traces), str(stats.exact), str(stats.replay_drift), str(stats.breaks),
                       str(stats.trainable_tokens), str(stats.resolutions.lost_tokens),
                       ratio(stats.trainable_ratio), ratio(stats.trainable_ratio_all_tokens))
        console.print(st)


@app.command("verify")
def verify(
    session_id: str, store: str = STORE, url: str = URL, admin_token: str = TOKEN,
    model: str = typer.Option(..., "--model", help="The policy's Hugging Face folder (what the engine serves)"),
    dtype: str = typer.Option("auto", help="Scoring dtype: auto (what the project's vLLM computes in here: bfloat16 "
                              "where the CPU multiplies bf16 in hardware -- AVX-512 BF16/AMX -- else float32, far "
                              "faster there) | bfloat16 | float32"),
    contrast: bool = typer.Option(False, help="Also score the message-level re-render path"),
    threshold: float = typer.Option(0.1, help="List tokens whose |delta| exceeds this"),
    max_mean_delta: float = typer.Option(DEFAULT_LIMITS.delta_mean, help="Limit on the mean |delta| (nats)"),
    max_p99_delta: float = typer.Option(DEFAULT_LIMITS.delta_p99, help="Limit on the 99th percentile of |delta|"),
    max_delta: float = typer.Option(DEFAULT_LIMITS.delta_max, help="Limit on any one token's |delta|"),
    min_share_within: float = typer.Option(DEFAULT_LIMITS.share_within, help="Least share of ratios within "
                                           "1 ± --epsilon"),
    epsilon: float = typer.Option(DEFAULT_LIMITS.epsilon, help="The ratio band of --min-share-within"),
    max_kl: float = typer.Option(DEFAULT_LIMITS.kl_k3, help="Limit on the k3 estimate of KL(rollout || trainer)"),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (machine-readable) "
                                 "instead of the table"),
) -> int:
    """Score the recorded sampled tokens with the trainer's own model: the step-0 proof.

    Exits 0 only when every policy call was scored under its recorded sampling and the pooled
    statistics meet every limit (defaults: docs/real-engine.md, "Step-0 limits"); otherwise 1, with
    one line saying why: a limit broken (with the numbers), calls whose sampling cannot be reproduced
    (named, not scored), or no policy token at all (a proof over nothing is no proof)."""
    from openenv_harness.trainer.verify import contrast_rerender, load_model, scoring_dtype, verify_records
    from openenv_harness.viewer.verifications import verification_path

    try:
        limits = Limits(delta_mean=max_mean_delta, delta_p99=max_p99_delta, delta_max=max_delta,
                        share_within=min_share_within, epsilon=epsilon, kl_k3=max_kl)
    except ValueError as exc:
        raise CLIError(str(exc), "pass positive limits and a share between 0 and 1") from exc
    src = open_source(store, url, admin_token)
    records = src.records(session_id)
    _problems(src)
    if not records:
        raise CLIError(f"no records for session {session_id}", "`openenv-harness trace list` shows the sessions")
    _check_model_folder(model)
    dtype = scoring_dtype(dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr carries the verdict's one line, not a loader's progress
    with console.status(f"loading {model} ({dtype})"):
        hf_model, tokenizer = load_model(model, dtype=dtype)
    with console.status("scoring every sampled token"):
        report = verify_records(records, hf_model, tokenizer, limits=limits, threshold=threshold)
        versus = contrast_rerender(records, hf_model, tokenizer, epsilon=limits.epsilon) if contrast else None
    verdict = report.verdict
    summary = {"session_id": session_id, "model": model, "verified": verdict.verified,
               "policy_tokens": report.policy.tokens, "constrained_tokens": report.constrained.tokens,
               "failed_limits": [{"limit": f.limit, "value": f.value, "bound": f.bound, "text": f.text}
                                 for f in verdict.failures],
               **report.as_dict(), "contrast": versus.as_dict() if versus else None}
    if store:
        path = verification_path(store, session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1))
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0 if verdict.verified else 1
    _verification_table(report, session_id)
    if versus is not None:
        console.print(f"re-render path: {len(versus.turns)} assistant turns, misaligned tokens "
                      f"{[x.misaligned for x in versus.turns]}, lengths sampled→re-rendered "
                      f"{[(x.sampled_tokens, x.rerendered_tokens) for x in versus.turns]}, ratios "
                      f"{versus.total.ratio_min:.3f}–{versus.total.ratio_max:.3f} "
                      f"({versus.total.share_within:.3f} within 1±{report.epsilon:g})")
    if store:
        console.print(f"stored: {verification_path(store, session_id)}", style="dim")
    if not verdict.verified:
        head, _, rest = verdict.line.partition(":")
        Console(stderr=True).print(Text.assemble((head + ":", "bold red"), rest), soft_wrap=True, highlight=False)
        return 1
    console.print(verdict.line, style="green", soft_wrap=True, highlight=False)
    return 0


def _verification_table(report: Any, session_id: str) -> None:
    """Per call and pooled: δ, the ratios, the signed mean log ratio and the k3 KL; refused calls by name."""
    t = Table(title=f"step-0 verification of {session_id} ({report.dtype})")
    for col in ("#", "logprobs", "tokens", "δ max", "δ mean", "δ p99", "ratio min", "ratio max",
                f"within 1±{report.epsilon:g}", "mean log ratio", "KL k3", "over threshold"):
        t.add_column(col)

    def row(label: str, kind: str, st: Any, outliers: str) -> None:
        t.add_row(label, kind, str(st.tokens), f"{st.delta_max:.4f}", f"{st.delta_mean:.4f}", f"{st.delta_p99:.4f}",
                  f"{st.ratio_min:.4g}", f"{st.ratio_max:.4g}", f"{st.share_within:.3f}", f"{st.mean_log_ratio:+.5f}",
                  "-" if st.kl_k3 is None else f"{st.kl_k3:.2e}", outliers)

    for call in report.calls:
        shown = ", ".join(f"{o.text!r}@{o.position} {o.logp_trainer - o.logp_rollout:+.2f}" for o in call.outliers[:4])
        row(str(call.call_index), "constrained" if call.constrained else "policy", call.stats, shown)
    for refused in report.refused:
        t.add_row(str(refused.call_index), "not scored", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                  "; ".join(refused.reasons))
    if report.policy.tokens:
        row("all", "policy", report.policy, "")
    if report.constrained.tokens:
        row("all", "constrained", report.constrained, "")
    console.print(t)


def _reward(src: Any, session_id: str) -> float | None:
    """The session's stored reward (``POST /admin/sessions/{id}/outcome``), or None -- said on stderr
    with the reason, so a pipeline never takes a missing reward for a silent one."""
    outcome = next((s.get("outcome") for s in src.sessions() if s.get("session_id") == session_id), None)
    if outcome and outcome.get("reward") is not None:
        return float(outcome["reward"])
    why = f"unscored: {outcome.get('unscored_reason')}" if outcome else "its rollout was never scored"
    Console(stderr=True).print(f"[yellow]note:[/] session {session_id} has no reward ({why}); rows carry "
                               "reward null", soft_wrap=True)
    return None


def _check_model_folder(model: str) -> None:
    """A path that is not there is a missing folder, not a hub repo id to look up."""
    from pathlib import Path

    path = Path(model).expanduser()
    looks_like_path = model.startswith((".", "/", "~")) or path.exists() or model.count("/") > 1
    if looks_like_path and not (path / "config.json").is_file():
        what = "has no config.json" if path.is_dir() else "does not exist"
        raise CLIError(f"model folder {model} {what}",
                       "pass the Hugging Face folder the engine serves (python -m openenv_harness.engine status shows it)")


@app.command("export")
def export(
    session_id: str,
    store: list[str] = STORE, url: list[str] = URL, admin_token: str = TOKEN,
    format: str = typer.Option("entries", "--format", help="entries (TraceEntry JSONL) | training (OpenEnv "
                               "TrainingTrace JSON) | harness (HarnessTrace JSON) | atif (Harbor's ATIF trajectory, token "
                               "ids and logprobs per agent step); docs/exports.md says what each carries"),
    strategy: str = typer.Option("split", help="harness format: split | realign | approximate"),
    non_policy: str = typer.Option("mask", "--non-policy", help="training and harness formats: sampled ids whose "
                                   "logprobs are not the policy's (decoding constraint): mask (loss_mask 0) | keep "
                                   "(trainable, flagged per segment; the trainer recomputes old logprobs)"),
    max_staleness: Optional[int] = typer.Option(
        None, "--max-staleness", min=0, help="Drop rows (whole samples, as TRL's max_staleness does) whose oldest "
        "policy version is more than K versions behind --current-version; entries: per record"),
    current_version: Optional[int] = typer.Option(
        None, "--current-version", help="The trainer's current policy version for --max-staleness. Default: the "
        "highest policy version the sources know -- with --store the highest any record in the store started or "
        "ended under (the whole store is read), with --url the recorder's current policy version (GET "
        "/admin/fence); never below the exported session's own highest"),
    drop_straddled: bool = typer.Option(False, "--drop-straddled", help="Drop rows holding a call that was in "
                                        "flight across a weight sync (straddled_sync)"),
    out: str = typer.Option("-", "--out", help="File (default stdout)"),
) -> None:
    """Export a session's records; what the filters dropped goes to stderr. An unknown session, or one
    with nothing to train (training and harness formats; any format the filters emptied), is an error,
    never an empty file."""
    from openenv_harness.export import FORMATS, ExportFilters, NothingToExport, export_session, highest_policy_version

    if format not in FORMATS:
        raise CLIError(f"unknown format {format!r}", "use entries, training, harness or atif")
    if current_version is not None and max_staleness is None:
        raise CLIError("--current-version is only read by --max-staleness", "pass --max-staleness K too")
    src = open_source(store, url, admin_token)
    records = src.records(session_id)
    _problems(src)
    if not records:
        raise CLIError(f"no records for session {session_id}", "`openenv-harness trace list` shows the sessions")
    source = "given by --current-version"
    if max_staleness is not None and current_version is None:
        known, source = src.current_policy_version()
        _problems(src)
        own = highest_policy_version(records) or 0
        if known is None or own > known:
            known, source = own, f"the highest in session {session_id}"
        current_version = known
    filters = ExportFilters(max_staleness=max_staleness, current_version=current_version,
                            current_version_source=source, drop_straddled=drop_straddled)
    reward = _reward(src, session_id) if format == "harness" else None
    try:
        done = export_session(records, format, session_id=session_id, strategy=strategy,  # type: ignore[arg-type]
                              non_policy=non_policy, reward=reward, filters=filters)
    except NothingToExport as exc:
        raise CLIError(str(exc), exc.hint) from None
    if filters.active:
        Console(stderr=True).print(f"session {session_id}: {done.report.line()}", soft_wrap=True, highlight=False,
                                   markup=False)
    text = done.text()
    if out == "-":
        sys.stdout.write(text)
    else:
        with open(out, "w") as f:
            f.write(text)
        console.print(f"wrote {out}", style="dim")
