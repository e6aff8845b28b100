"""Per drift cause, on real agents: what full history and incremental leave a trainer (docs/benchmarks.md).

Each row is one rollout of a real agent CLI (Pi or OpenCode) through the recorder in front of the
reference engine (TRL 1.16's ``qwen3_training.jinja`` unless the cause is the template), scripted so
that exactly one cause shows: the agent re-serializes tool JSON, the reasoning field is renamed on
replay (the engine drops ``reasoning_content``), the template drops an earlier turn's empty think
block, or the agent compacts its history. The same script runs in ``full_history`` and in
``incremental`` mode. For each rollout the recorded session is assembled with our strategies
(split / realign / approximate, ``openenv_harness.assembly.compare_strategies``) and fed to TRL's own
reconciler (``_chain_to_sequences``: fork at threshold 0, and its realign gate at 1024 tokens).

Columns: rows (training sequences), sampled tokens trainable (of all sampled), trainable share of
all row tokens (prompt + response, what a trainer pays for).

One cause no script on the reference engine shows: the real Qwen2.5 on the real vLLM samples the
``<tool_call>`` tag as text pieces under ``tool_choice: "required"`` and the template re-renders it
as the special id. ``--real-engine-port N`` runs that cause's rows instead (real Pi, the fix-add
task, the real-engine tier's greedy sampling, 3 agent calls) against a real vLLM already serving on
port N with ``--enable-scale-out`` (``python -m openenv_harness.engine serve --port N``).

    OPENENV_HARNESS_NODE_PREFIX=... PYTHONPATH=$PWD python benchmarks/bench_prompt_mode_causes.py [--only TEXT]
    OPENENV_HARNESS_NODE_PREFIX=... PYTHONPATH=$PWD python benchmarks/bench_prompt_mode_causes.py --real-engine-port 8012
"""

from __future__ import annotations

import argparse
from collections import Counter
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openenv.core.harness import TrainingTrace  # noqa: E402

from openenv_harness.assembly import compare_strategies  # noqa: E402
from openenv_harness.harnesses.base import HarnessOptions  # noqa: E402
from openenv_harness.harnesses.install import ensure_installed  # noqa: E402
from openenv_harness.recorder import RecorderConfig, RecorderServer  # noqa: E402
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING  # noqa: E402
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory  # noqa: E402
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, ToolCallSpec, Turn  # noqa: E402

ADMIN = "admin-token-for-benchmarks-0123456789"
MODEL = "causes"
WRITE = ToolCallSpec(name="bash", arguments={"command": "printf 'hello from the agent\\n' > greeting.txt"})
#: the model sampled compact JSON with odd spacing; the agent replays it re-serialized
SPACED = ToolCallSpec(name="bash", arguments='{"command":  "printf \'hello from the agent\\\\n\' > greeting.txt"}')
LS = ToolCallSpec(name="bash", arguments='{"command":  "ls"}')
OVERFLOW = ("This model's maximum context length is 2048 tokens. However, your prompt contains 2300 input tokens, "
            "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.")


@dataclass
class Case:
    cause: str
    harness: str
    script: Script | None
    engine: dict[str, Any] = field(default_factory=dict)
    factory: dict[str, Any] = field(default_factory=dict)
    fault: Fault | None = None
    template: str = "qwen3_training.jinja"
    #: served as the family would be: the real Qwen2.5 tokenizer (``./dev setup``'s model folder) with the
    #: template's markers as special tokens and its parsers (``template_tokens.template_engine_config``)
    real_tokenizer: bool = False


def cases() -> list[Case]:
    done = Turn(content="Wrote greeting.txt.")
    return [
        Case("tool JSON re-serialized", "pi", Script(turns=[Turn(tool_calls=[LS]), Turn(tool_calls=[SPACED]),
                                                             Turn(tool_calls=[LS]), done])),
        Case("tool JSON re-serialized", "opencode", Script(turns=[Turn(tool_calls=[LS]), Turn(tool_calls=[SPACED]),
                                                                   Turn(tool_calls=[LS]), done])),
        Case("reasoning renamed (engine drops reasoning_content)", "opencode",
             Script(turns=[Turn(reasoning="List first.", tool_calls=[LS]),
                           Turn(reasoning="Write the file first.", tool_calls=[WRITE]), done]),
             engine={"reasoning_content": "drop"}),
        Case("template drops an earlier empty think block (qwen3.jinja)", "opencode",
             Script(turns=[Turn(tool_calls=[LS]), Turn(tool_calls=[WRITE]), done]), template="qwen3.jinja"),
        Case("compaction (Pi, after an overflow)", "pi",
             Script(turns=[Turn(tool_calls=[WRITE]), done], aux_text="Summary: the agent wrote greeting.txt."),
             fault=Fault(status=400, message=OVERFLOW, on_turn=1),
             factory={"options": HarnessOptions(compaction=True), "budgets": {"max_agent_calls": 4}}),
        *think_cases(),
    ]


#: Qwen3.5 and later: the generation prompt opens a think block, which the real tokenizer merges with the
#: next newline when a turn sampled without reasoning is rendered back (certification: turn_start fails)
THINK_TEMPLATES = ("qwen3_5_think.jinja", "qwen3_5_think_training.jinja", "qwen3_6.jinja", "qwen3_8.jinja")


def think_cases() -> list[Case]:
    done = Turn(content="Wrote greeting.txt.")
    out = []
    for template in THINK_TEMPLATES:
        for harness in ("pi", "opencode"):
            out.append(Case(f"think template {template}, no reasoning", harness,
                            Script(turns=[Turn(tool_calls=[LS]), Turn(tool_calls=[WRITE]), done]),
                            template=template, real_tokenizer=True))
        out.append(Case(f"think template {template}, with reasoning", "opencode",
                        Script(turns=[Turn(reasoning="List first.", tool_calls=[LS]),
                                      Turn(reasoning="Now write it.", tool_calls=[WRITE]), done]),
                        template=template, real_tokenizer=True))
    return out


#: the cause only the real model on the real vLLM shows (no script: the model samples it)
REAL_TAG_AS_TEXT = Case("a tag sampled as text, re-rendered as special ids (real Qwen2.5 on real vLLM)", "pi", None)
REAL_AGENT_CALLS = 3


def _template(name: str) -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates" / name


def _session_records(sessions: HarnessSessionFactory, task: str, timeout_s: float) -> tuple[list[dict], TrainingTrace]:
    session = sessions.create(task)
    try:
        session.wait_for_completion(timeout_s=timeout_s)
        records = session.client.records(session.session_id)
        trace = TrainingTrace.model_validate(session.client.training_trace_json(session.session_id))
    finally:
        session.close()
    return records, trace


def real_rollout(port: int, mode: str) -> tuple[list[dict], TrainingTrace]:
    """One real Pi rollout through the recorder in front of the real vLLM on ``port``."""
    from openenv_harness.engine.model import QWEN25_CODER_05B

    with tempfile.TemporaryDirectory() as tmp, RecorderServer(RecorderConfig(
            store_path=f"{tmp}/r.db", engine_url=f"http://127.0.0.1:{port}", admin_token=ADMIN)) as recorder:
        sessions = HarnessSessionFactory(harness="pi", recorder_url=recorder.url, admin_token=ADMIN,
                                         model=QWEN25_CODER_05B.served_name, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                         budgets={"max_agent_calls": REAL_AGENT_CALLS, "max_wall_clock_s": 400},
                                         sampling=dict(REAL_ENGINE_SAMPLING), prompt_mode=mode)
        return _session_records(sessions, "fix-add", 450)


def rollout(case: Case, mode: str) -> tuple[list[dict], TrainingTrace]:
    assert case.script is not None
    if case.real_tokenizer:
        from openenv_harness.engine import engine_home, prepared_model_dir
        from openenv_harness.testing.engine.template_tokens import template_engine_config

        folder = prepared_model_dir(engine_home())
        if folder is None:
            raise SystemExit("the think-template cases need the Qwen2.5 model folder: run ./dev setup")
        config = template_engine_config(_template(case.template), folder, **case.engine)
    else:
        config = EngineConfig(chat_template=_template(case.template), **case.engine)
    with tempfile.TemporaryDirectory() as tmp, EngineServer(config) as server:
        server.set_script(MODEL, case.script)
        if case.fault is not None:
            server.add_fault(MODEL, case.fault)
        with RecorderServer(RecorderConfig(store_path=f"{tmp}/r.db", engine_url=server.url,
                                           admin_token=ADMIN)) as recorder:
            sessions = HarnessSessionFactory(harness=case.harness, recorder_url=recorder.url, admin_token=ADMIN,
                                             model=MODEL, prompt_mode=mode, **case.factory)
            return _session_records(sessions, "write-greeting", 180)


def measure(records: list[dict], trace: TrainingTrace) -> dict[str, Any]:
    from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
    from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace

    agent = [r for r in records if r["metadata"]["call_kind"] == "agent" and r["metadata"].get("fidelity")]
    out: dict[str, Any] = {
        "calls": len(agent), "classes": [r["metadata"]["fidelity"]["class"] for r in agent],
        "fallbacks": Counter((r["metadata"].get("prompt_mode") or {}).get("reason") for r in agent[1:]
                             if not (r["metadata"].get("prompt_mode") or {}).get("continued", True)),
    }
    sampled = sum(len(r["completion_token_ids"]) for r in agent)
    for strategy, stats in compare_strategies(records).items():
        out[strategy] = (stats.traces, stats.trainable_tokens, sampled, stats.trainable_ratio_all_tokens or 0.0)
    turns = _turns_from_training_trace(trace)
    assert sum(len(t.output_ids) for t in turns) == sampled, "TRL's view of the trace lost sampled tokens"
    for name, (mode, threshold) in {"trl_fork": ("replayed", 0), "trl_realign": ("threshold", 1024)}.items():
        rows, _ = _chain_to_sequences(turns, mode, threshold)
        kept = sum(sum(r.completion_mask) for r in rows)
        total = sum(len(r.input_ids) for r in rows)
        out[name] = (len(rows), kept, sampled, kept / total if total else 0.0)
    return out


def _cell(value: tuple[int, int, int, float]) -> str:
    rows, kept, sampled, share = value
    return f"{rows} / {kept} of {sampled} / {share:.1%}"


def table(results: list[tuple[Case, str, dict[str, Any]]]) -> str:
    head = ("| cause | agent | mode | transitions | fell back | split | realign | approximate | TRL fork (0) | "
            "TRL realign gate |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for case, mode, m in results:
        counts = Counter(m["classes"][1:])
        classes = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "-"
        fell = ", ".join(f"{n} {reason}" for reason, n in m["fallbacks"].items()) if mode == "incremental" else ""
        lines.append(f"| {case.cause} | {case.harness} | {mode} | {classes} | {fell or '-'} | {_cell(m['split'])} | "
                     f"{_cell(m['realign'])} | {_cell(m['approximate'])} | {_cell(m['trl_fork'])} | "
                     f"{_cell(m['trl_realign'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run the cases whose cause contains this text")
    parser.add_argument("--real-engine-port", type=int, help="run the real-engine cause (a tag sampled as text) "
                        "against the real vLLM serving on this port, instead of the scripted causes")
    args = parser.parse_args()
    ensure_installed(["pi", "opencode"])
    results = []
    selected = [REAL_TAG_AS_TEXT] if args.real_engine_port else cases()
    for case in selected:
        if args.only and args.only not in case.cause:
            continue
        for mode in ("full_history", "incremental"):
            if case.script is None:
                records, trace = real_rollout(args.real_engine_port, mode)
            else:
                records, trace = rollout(case, mode)
            m = measure(records, trace)
            results.append((case, mode, m))
            print(f"{case.cause} / {case.harness} / {mode}: {m['calls']} agent calls, "
                  f"split {m['split']}, TRL fork {m['trl_fork']}", flush=True)
    print("cells: rows / sampled tokens trainable / trainable share of all row tokens")
    print(table(results))


if __name__ == "__main__":
    main()
