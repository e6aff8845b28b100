"""Generate docs/templates.md: every chat template TRL ships, certified, and what real agents then show.

Each template TRL 1.16 ships (read from the installed package, never copied here) is served by the
reference engine with the real Qwen2.5 tokenizer (the folder ``./dev setup`` prepares; the built-in
BPE when it is absent) and certified as the recorder does it (``openenv_harness/recorder/engine_knowledge/certify.py``:
through the engine's render route, which renders a chat request as its chat route does, else
``/tokenize``); with ``--vllm-port`` the real vLLM's own template is certified too. With
``--rollouts``, the real Pi and OpenCode CLIs then run the built-in ``fix-add`` task through a
recorder on a representative subset of templates (the reference engine replaying the task's
solution, with a short reasoning on every tool turn and without) -- and, with ``--vllm-port``, on the real vLLM (the
real model sampling greedily under ``tool_choice: "required"``, a few agent calls, as the
real-engine tests run it) -- and the table says what their chains show: exact / drift / break
transitions, the causes, and the trainable share per assembly strategy.

Run: ``.venv/bin/python scripts/certify_templates.py [--rollouts] [--vllm-port N] [--out docs/templates.md]``
(``--vllm-port`` certifies a vLLM started with ``python -m openenv_harness.engine serve --port N``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openenv_harness.recorder.engine_knowledge.certify import Certification, certify_template  # noqa: E402
from openenv_harness.recorder.upstream.http import HTTPEngine  # noqa: E402

#: the subset the test suite certifies too (tests/recorder/engine_knowledge/test_certify_templates.py) and rollouts run on
SUBSET = ("qwen2_5.jinja", "qwen3.jinja", "qwen3_training.jinja", "qwen3_5_think.jinja",
          "qwen3_5_think_training.jinja", "llama3.jinja", "gptoss.jinja")
PROPERTIES = ("tool_prefix", "assistant_stable", "assistant_stable_across_user", "turn_start", "junction",
              "tool_args_roundtrip",
              "content_parts")


def trl_templates() -> list[Path]:
    import trl

    return sorted((Path(trl.__file__).parent / "chat_templates").glob("*.jinja"))


def engine_config(template: Path, **extra: Any) -> Any:
    """The reference engine serving ``template`` as its family would be served: the real Qwen2.5
    tokenizer (the built-in BPE without the model folder) with the template's own control markers as
    special tokens, and the parsers its format needs (``template_tokens.template_engine_config``)."""
    from openenv_harness.engine import engine_home, prepared_model_dir
    from openenv_harness.testing.engine.template_tokens import template_engine_config

    return template_engine_config(template, prepared_model_dir(engine_home()), **extra)


async def _certify(url: str, model: str | None = None) -> Certification:
    engine = HTTPEngine(url, timeout_s=120)
    await engine.start()
    try:
        return await certify_template(engine, model)
    finally:
        await engine.aclose()


def certify_served(template: Path) -> tuple[Certification, str]:
    """The certificate, and how tool arguments were passed: as objects (vLLM's chat route parses them
    before templating), else -- where the template refused that form -- as the strings it takes."""
    from openenv_harness.testing.engine import EngineServer

    with EngineServer(engine_config(template)) as engine:
        cert = asyncio.run(_certify(engine.url))
    refused = [p for p in cert.properties if p.passed is None and "dict" in p.detail and "str" in p.detail]
    if not refused:
        return cert, "objects"
    with EngineServer(engine_config(template, tool_arguments="verbatim")) as engine:
        return asyncio.run(_certify(engine.url)), "strings (vLLM passes objects: this template refuses them)"


def _mark(cert: Certification, name: str) -> str:
    prop = next((p for p in cert.properties if p.name == name), None)
    if prop is None:
        return "–"
    return "✓" if prop.passed else "✗" if prop.passed is False else "?"


def _summarize(report: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    from openenv_harness.assembly import compare_strategies

    causes = Counter((r["metadata"].get("fidelity") or {}).get("cause") for r in records
                     if (r["metadata"].get("fidelity") or {}).get("class") in ("replay_drift", "break"))
    stats = compare_strategies(records) if records else {}
    return {"reward": report.reward, "fidelity": report.fidelity, "causes": dict(causes),
            "ratios": {k: v.trainable_ratio for k, v in stats.items()}, "error": report.error}


def _rollout(engine_url: str, harness: str, model: str, *, timeout_s: float, **factory: Any) -> dict[str, Any]:
    """One real-CLI rollout of fix-add through a fresh recorder in front of ``engine_url``."""
    from openenv_harness.recorder import RecorderConfig, RecorderServer
    from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
    from openenv_harness.rollout.report import run_rollout

    with tempfile.TemporaryDirectory() as tmp:
        admin = "templates-admin-0123456789abcdef"
        config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=engine_url, admin_token=admin)
        with RecorderServer(config) as recorder:
            sessions = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=admin,
                                             model=model, tasks={"fix-add": BUILTIN_TASKS["fix-add"]}, **factory)
            report, session = run_rollout(sessions, "fix-add", timeout_s=timeout_s)
            records = session.client.records(session.session_id) if session is not None else []
            if session is not None:
                session.close()
    return _summarize(report, records)


def rollout_row(template: Path, harness: str, reasoning: bool) -> dict[str, Any]:
    """One real-CLI rollout of fix-add through a recorder, the reference engine serving ``template``;
    ``reasoning``: each tool turn samples a short reasoning first (else none, as a non-thinking turn)."""
    from openenv_harness.rollout import BUILTIN_TASKS
    from openenv_harness.testing.engine import EngineServer, Script, Turn

    task = BUILTIN_TASKS["fix-add"]
    turns = [Turn(**{**t.model_dump(), "reasoning": "Let me check."}) if t.tool_calls and reasoning else t
             for t in (Turn.model_validate(x) if isinstance(x, dict) else x for x in task.reference_script)]
    with EngineServer(engine_config(template)) as engine:
        model = f"tpl-{template.stem}-{harness}-{'r' if reasoning else 'n'}"
        engine.set_script(model, Script(turns=turns))
        return _rollout(engine.url, harness, model, timeout_s=180)


#: agent calls per real-vLLM rollout: each call of the 0.5B model on two shared CPU cores takes seconds
REAL_AGENT_CALLS = 4


def real_rollout_row(url: str, harness: str) -> dict[str, Any]:
    """One real-CLI rollout on the real vLLM, configured as the real-engine tests configure it."""
    from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
    from openenv_harness.engine.model import QWEN25_CODER_05B

    return _rollout(url, harness, QWEN25_CODER_05B.served_name, timeout_s=600, sampling=dict(REAL_ENGINE_SAMPLING),
                    budgets={"max_agent_calls": REAL_AGENT_CALLS, "max_wall_clock_s": 540})


def _rollout_line(name: str, harness: str, reasoning: str, row: dict[str, Any]) -> str:
    f = row["fidelity"] or {}
    causes = ", ".join(f"{k} ×{v}" for k, v in row["causes"].items()) or "–"
    ratios = row["ratios"]
    cells = [f"{ratios[s]:.3f}" if ratios.get(s) is not None else "–" for s in ("split", "realign", "approximate")]
    reward = row["reward"] if row["reward"] is not None else f"not run: {row['error'] or 'unscored'}"
    print(f"{name} {harness} {reasoning}: {f} {row['causes']}", file=sys.stderr, flush=True)
    return (f"| {name} | {harness} | {reasoning} | {str(reward)[:220].replace('|', chr(92) + '|')} | {f.get('exact', 0)} / "
            f"{f.get('replay_drift', 0)} / {f.get('break', 0)} | {causes} | " + " | ".join(cells) + " |")


def _engine_version(url: str) -> str:
    import httpx

    try:
        return str(httpx.get(f"{url}/version", timeout=30).json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return "?"


#: what a row's tokenizer column says
QWEN_TOKENIZER = "Qwen2.5"


def _trl_cell(template: Path | None, cert: Certification) -> str:
    """TRL's own tool-prefix verdict on the same tokenizer, and whether it is ours."""
    from openenv_harness.engine import engine_home, prepared_model_dir
    from openenv_harness.testing.engine.template_tokens import trl_prefix_verdict

    folder = prepared_model_dir(engine_home())
    if template is None or folder is None:
        return "–"
    theirs = trl_prefix_verdict(template, folder)
    ours = next((p.passed for p in cert.properties if p.name == "tool_prefix"), None)
    if isinstance(theirs, str):
        return f"refused its probe ({theirs[:80]})".replace("|", "/")
    return ("✓" if theirs else "✗") + ("" if theirs is ours else " (differs)")


def _table(rows: list[tuple[str, Certification, str, str, Path | None]]) -> list[str]:
    lines = ["| template | verdict | exact in | " + " | ".join(PROPERTIES) + " | TRL's tool-prefix check | tokenizer | "
             "tool arguments | reasoning field rendered | probed via | failed because |",
             "|---|---|---|" + "---|" * len(PROPERTIES) + "---|---|---|---|---|---|"]
    for name, cert, tokenizer, arguments, template in rows:
        stable = next((p for p in cert.properties if p.name == "assistant_stable"), None)
        rendered = (stable.facts or {}).get("rendered") if stable else None
        fields = ", ".join(k for k, v in (rendered or {}).items() if v) or ("none" if rendered is not None else "–")
        why = "; ".join(p.detail for p in cert.properties if p.passed is False and p.required) or (cert.reason or "")
        exact = ", ".join(m.replace("_", " ") for m in cert.exact_in) or "–"
        lines.append(f"| {name} | {cert.status} | {exact} | " + " | ".join(_mark(cert, p) for p in PROPERTIES)
                     + f" | {_trl_cell(template, cert)} | {tokenizer} | {arguments} | {fields} | "
                     f"{cert.probed_via or '–'} | {why.replace('|', '/')} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", action="store_true", help="also run the real CLIs on the subset")
    parser.add_argument("--vllm-port", type=int, default=0, help="also certify (and roll out on) this real vLLM")
    parser.add_argument("--no-real-rollouts", action="store_true", help="with --vllm-port and --rollouts: "
                        "certify the real vLLM's template but run no rollouts on it (it is busy, or slow)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "templates.md"))
    args = parser.parse_args()
    import trl

    started = time.time()
    from openenv_harness.testing.engine.template_tokens import template_special_tokens

    rows: list[tuple[str, Certification, str, str, Path | None]] = []
    for path in trl_templates():
        markers = template_special_tokens(path.read_text())
        tokenizer = f"{QWEN_TOKENIZER} + {len(markers)} of its own special tokens" if markers else QWEN_TOKENIZER
        try:
            cert, arguments = certify_served(path)
        except Exception as exc:  # a template the reference engine cannot serve is listed as such
            cert, arguments = Certification("uncertified", 0, [], time.time(),
                                            reason=f"{type(exc).__name__}: {exc}"[:160]), "–"
        rows.append((path.name, cert, tokenizer, arguments, path))
        print(f"{path.name}: {cert.status}", file=sys.stderr, flush=True)
    real: list[tuple[str, Certification, str, str, Path | None]] = []
    vllm_url = f"http://127.0.0.1:{args.vllm_port}"
    if args.vllm_port:
        from openenv_harness.engine.model import QWEN25_CODER_05B

        version = _engine_version(vllm_url)
        real = [(f"real vLLM {version}: {QWEN25_CODER_05B.served_name}'s own template",
                 asyncio.run(_certify(vllm_url, QWEN25_CODER_05B.served_name)), f"{QWEN_TOKENIZER} (its own)",
                 "objects", None)]
    command = "python scripts/certify_templates.py" + (" --rollouts" if args.rollouts else "") + (
        " --vllm-port N" if args.vllm_port else "") + (" --no-real-rollouts" if args.no_real_rollouts else "")
    lines = [
        "# Chat templates: which keep chains exact",
        "",
        f"Generated by `{command}` with TRL {trl.__version__} (templates read from its installed package) and the "
        "reference engine serving each one as its family would be served: the real Qwen2.5 tokenizer with the "
        "template's own control markers (`<|eot_id|>`, `<|start|>`, `<｜end▁of▁sentence｜>`, ...) registered as "
        "special tokens (`openenv_harness/testing/engine/template_tokens.py`; without them another family's markers "
        "are plain text that merges across turns, and a verdict would be the tokenizer's, not the template's)"
        + (", plus the real vLLM serving its model (first row)" if real else "")
        + "; the properties are the recorder's own certification (`openenv_harness/recorder/engine_knowledge/certify.py`), "
        "probed through the engine's render route (`POST /v1/chat/completions/render`: a chat request's prompt ids "
        "exactly as the chat route renders them) where it serves one, else `/tokenize` (column *probed via*), and "
        "`/detokenize`. The route matters: vLLM 0.32's chat route renames a replayed `reasoning_content` to "
        "`reasoning` before templating, its `/tokenize` drops it, so a /tokenize certificate would say "
        "`reasoning_content` is not rendered where the chat route renders it (the reference engine does the same; "
        "`tests/real_engine/test_engine_conformance.py` holds it to the real one). "
        "Each required property is needed by a prompt mode: full history replays the whole history through the "
        "template each turn, incremental mode continues the model's own ids and renders only the new messages. "
        "*Exact in* lists the modes whose required properties all pass; *certified* means both. ✓ pass, ✗ fail, ? "
        "the template refused that property's probe (the others stand). The recorder shows the same report in "
        "`openenv-harness doctor`, `/admin/health`, `/metrics` and each session's provenance; a session whose "
        "prompt mode the template is not exact in is warned at creation, and `require_exact_template` refuses it.",
        "",
        "| property | needed by | what it checks |",
        "|---|---|---|",
        "| tool_prefix | full history | [user, assistant tool call] renders as a prefix of the same plus a tool result "
        "(TRL's `is_chat_template_prefix_preserving`) |",
        "| assistant_stable | full history | an assistant turn with reasoning (non-empty and empty) renders the same "
        "once a tool result follows it, under the reasoning field the engine renders |",
        "| assistant_stable_across_user | – (informational) | the same once a new user message follows (Qwen3 drops "
        "earlier reasoning there by design) |",
        "| turn_start | full history | the generation prompt is a token prefix of a rendered assistant turn (think "
        "templates whose prompt ends in `<think>\\n` fail it where the tokenizer merges newlines) |",
        "| junction | incremental | every assistant turn ends with the same ids (end-of-turn + trailer), so a sampled "
        "turn can be continued |",
        "| tool_args_roundtrip | – (informational) | spaced / compact / reordered tool arguments render the same |",
        "| content_parts | – (informational) | content as a string and as text parts render the same |",
        "",
        *_table(real + rows),
    ]
    if args.rollouts:
        lines += ["", "## Real Pi and OpenCode rollouts", "",
                  "The built-in `fix-add` task through a recorder (full-history prompt mode), the real CLIs. On the "
                  "reference engine (the subset the test suite certifies, `SUBSET` in the script; all "
                  f"{len(rows)} templates × 2 CLIs × 2 variants would take about an hour on this 2-core machine, "
                  "so only the subset runs) the engine replays the task's solution (with a short reasoning on each tool "
                  "turn, and without), through the template, sampling each turn as the template renders it: a "
                  "template's failure shows where the turns it bites are sampled (Qwen3's original drops an empty "
                  "think block, the Qwen3.5 think templates' turn start fails after a turn without reasoning: both "
                  "show only in the rows without reasoning). "
                  + (f"On the real vLLM the real model samples (greedy, seed 0, `tool_choice: \"required\"`, at most "
                     f"{REAL_AGENT_CALLS} agent calls, as `tests/real_engine` runs it): its reward is whatever the "
                     "model managed, the chain columns are what matters. " if real and not args.no_real_rollouts else
                     "No real-vLLM rollout in this generation (`--no-real-rollouts`): the real-engine tier runs them "
                     "(`tests/real_engine/test_real_rollouts.py`, `test_real_think_template.py`). " if real else "")
                  + "Trainable share = mask-1 tokens over response tokens (sampled ids and the tool results between "
                  "them) per assembly strategy (`openenv_harness/assembly`).", "",
                  "| engine / template | harness | reasoning on tool turns | reward | exact / drift / break | causes | "
                  "split | realign | approximate |",
                  "|---|---|---|---|---|---|---|---|---|"]
        if real and not args.no_real_rollouts:
            for harness in ("pi", "opencode"):
                lines.append(_rollout_line(f"real vLLM {_engine_version(vllm_url)}", harness, "the model's",
                                           real_rollout_row(vllm_url, harness)))
        for name in SUBSET:
            path = next((p for p in trl_templates() if p.name == name), None)
            if path is None:
                continue
            for reasoning in (True, False):
                for harness in ("pi", "opencode"):
                    lines.append(_rollout_line(name, harness, "yes" if reasoning else "no",
                                               rollout_row(path, harness, reasoning)))
    lines += ["", f"({len(rows)} templates, {time.time() - started:.0f} s.)", ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
